//! N typed states: producers and sharers, two head dimensions, fixed states that refuse to
//! rewind, reset, fork and memory reports.

mod common;

use common::{sliding, vectors};
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::kv_cache::{KvKind, KvLayout, uniform_streams};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_cache::{CacheError, CodecSpec};

fn full(head_dim: usize) -> KvLayout {
    KvLayout {
        kv_heads: 1,
        head_dim,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 32 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

/// A Gemma-like stack: sliding layers at d = 32, full layers at d = 64, layer 3 shares layer 1's
/// cache, plus a fixed recurrent state.
fn specs() -> Vec<StateSpec> {
    vec![
        StateSpec {
            name: "l0.kv".into(),
            kind: StateKind::Kv {
                layer: 0,
                layout: sliding(1, 32, 8, 0),
            },
        },
        StateSpec {
            name: "l1.kv".into(),
            kind: StateKind::Kv {
                layer: 1,
                layout: full(64),
            },
        },
        StateSpec {
            name: "l2.kv".into(),
            kind: StateKind::Kv {
                layer: 2,
                layout: sliding(1, 32, 8, 0),
            },
        },
        StateSpec {
            name: "l3.kv".into(),
            kind: StateKind::SharedKv {
                layer: 3,
                source_layer: 1,
            },
        },
        StateSpec {
            name: "l4.rec".into(),
            kind: StateKind::Fixed {
                shape: vec![2, 4, 4],
            },
        },
    ]
}

fn build() -> ModelCache {
    ModelCache::new(specs(), |_, layout| {
        let d = layout.head_dim;
        let k = CodecSpec::Mse(tq_cache::codec::MseSpec::new(d, 4, 7));
        Ok((
            uniform_streams(layout, k),
            uniform_streams(layout, CodecSpec::F16 { dim: d }),
        ))
    })
    .unwrap()
}

fn step(cache: &mut ModelCache, t: usize) -> Vec<Vec<f32>> {
    let positions: Vec<u32> = (0..=t as u32).collect();
    let mut outs = Vec::new();
    for layer in 0..4 {
        let d = if layer % 2 == 0 { 32 } else { 64 };
        let shape = AttentionShape {
            q_heads: 2,
            scale: 0.2,
        };
        let q = vectors(2, d, (t * 10 + layer) as u64);
        let k = vectors(1, d, (t * 10 + layer) as u64 + 1000);
        let mut out = vec![0.0; 2 * d];
        let kv = if layer == 3 {
            None
        } else {
            Some((&k[..], &k[..]))
        };
        cache
            .forward_layer(
                layer,
                &q,
                kv,
                &positions,
                shape,
                AttentionKernel::Fused,
                &mut out,
            )
            .unwrap();
        outs.push(out);
    }
    outs
}

#[test]
fn sharer_reads_the_producer_cache_and_stores_nothing() {
    let mut cache = build();
    for t in 0..20 {
        let outs = step(&mut cache, t);
        // Layer 3's output is attention over layer 1's cache with layer 3's queries.
        let q = vectors(2, 64, (t * 10 + 3) as u64);
        let mut expected = vec![0.0; 128];
        let shape = AttentionShape {
            q_heads: 2,
            scale: 0.2,
        };
        attend(
            cache.kv(1).unwrap(),
            &q,
            &[t as u32],
            shape,
            AttentionKernel::Fused,
            &mut expected,
        )
        .unwrap();
        assert_eq!(outs[3], expected);
    }
    let memory = cache.memory();
    assert_eq!(memory[3].allocated_bytes, 0, "a sharer stores nothing");
    for m in &memory {
        assert_eq!(m.formula_bytes, m.allocated_bytes, "{}", m.name);
    }
    // A sharer that tries to write, or a producer that does not, is refused.
    let positions: Vec<u32> = (0..=20).collect();
    let shape = AttentionShape {
        q_heads: 2,
        scale: 0.2,
    };
    let (q, k) = (vectors(2, 64, 1), vectors(1, 64, 2));
    let mut out = vec![0.0; 128];
    assert!(matches!(
        cache.forward_layer(
            3,
            &q,
            Some((&k, &k)),
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out
        ),
        Err(CacheError::Unsupported { .. })
    ));
    assert!(matches!(
        cache.forward_layer(
            1,
            &q,
            None,
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out
        ),
        Err(CacheError::Unsupported { .. })
    ));
}

#[test]
fn sliding_memory_is_constant_and_full_memory_grows() {
    let mut cache = build();
    let initial = cache.memory();
    let mut previous = initial.clone();
    for t in 0..300 {
        step(&mut cache, t);
        let now = cache.memory();
        assert_eq!(
            now[0].allocated_bytes, initial[0].allocated_bytes,
            "sliding layer 0"
        );
        assert_eq!(
            now[2].allocated_bytes, initial[2].allocated_bytes,
            "sliding layer 2"
        );
        // Doubling pages: the full layer grows in steps, never shrinks, and always fits.
        assert!(now[1].allocated_bytes >= previous[1].allocated_bytes);
        assert!(now[1].allocated_bytes >= (t + 1) * now[1].bytes_per_token);
        previous = now;
    }
    assert!(
        previous[1].allocated_bytes > 4 * initial[1].allocated_bytes,
        "full layer grew"
    );
}

#[test]
fn fixed_states_refuse_rewind_and_reset_works() {
    let mut cache = build();
    for t in 0..10 {
        step(&mut cache, t);
    }
    // Without touching the fixed state a rewind is fine (the rings still hold the window).
    let mut forked = cache.fork();
    forked.truncate(9).unwrap();
    assert_eq!(forked.len(), 9);
    cache.fixed_mut("l4.rec").unwrap()[3] = 1.5;
    let before = cache.len();
    assert!(matches!(
        cache.truncate(5),
        Err(CacheError::Unsupported { .. })
    ));
    assert_eq!(cache.len(), before, "a refused rewind changes nothing");
    cache.reset();
    assert_eq!(cache.len(), 0);
    assert!(cache.fixed("l4.rec").unwrap().iter().all(|&v| v == 0.0));
    // After a reset the same tokens give the same outputs as a fresh cache.
    let mut fresh = build();
    for t in 0..10 {
        assert_eq!(step(&mut cache, t), step(&mut fresh, t));
    }
}

#[test]
fn invalid_declarations_are_errors() {
    let mut bad = specs();
    bad[3] = StateSpec {
        name: "l3.kv".into(),
        kind: StateKind::SharedKv {
            layer: 3,
            source_layer: 9,
        },
    };
    let result = ModelCache::new(bad, |_, layout| {
        let c = CodecSpec::F16 {
            dim: layout.head_dim,
        };
        Ok((uniform_streams(layout, c), uniform_streams(layout, c)))
    });
    assert!(matches!(result, Err(CacheError::InvalidConfig(_))));
    let mut dup = specs();
    dup[1].name = "l0.kv".into();
    let result = ModelCache::new(dup, |_, layout| {
        let c = CodecSpec::F16 {
            dim: layout.head_dim,
        };
        Ok((uniform_streams(layout, c), uniform_streams(layout, c)))
    });
    assert!(matches!(result, Err(CacheError::InvalidConfig(_))));
}
