//! The hybrid models' states as data: kinds, shapes, dtypes and truncatability; TurboQuant on
//! KV states only (fixed states stay f32); fixed states refuse to rewind and a reset equals a
//! fresh cache; KV sharing stores nothing; sliding memory is constant in the context length.

use tq_cache::CacheError;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_cache::kv_cache::KvKind;
use tq_cache::states::{ModelCache, StateKind};
use tq_cache::token_store::Growth;
use tq_models::hybrid::{
    GemmaLike, GemmaLikeConfig, HybridScratch, QwenLike, QwenLikeConfig, StatefulModel,
    feed_in_chunks,
};
use tq_models::llama::{Logits, ModelError};

const F32: &str = "name = \"f32\"\nkey = { codec = \"f32\" }\nvalue = { codec = \"f32\" }\n";

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 13 + salt) % 48).collect()
}

fn feed<M: StatefulModel>(model: &M, cache: &mut ModelCache, tokens: &[u32]) -> Vec<f32> {
    let mut scratch = M::Scratch::default();
    feed_in_chunks(
        model,
        cache,
        tokens,
        &[5],
        AttentionKernel::Fused,
        &mut scratch,
    )
    .unwrap()
}

#[test]
fn gemma_states_are_declared_as_data() {
    let config = GemmaLikeConfig::tiny(1);
    let specs = config.state_specs(Growth::Doubling { initial: 16 });
    assert_eq!(specs.len(), config.layers.len());
    let mut head_dims = Vec::new();
    for (l, (spec, layer)) in specs.iter().zip(&config.layers).enumerate() {
        assert_eq!(spec.name, format!("blk.{l}.kv"));
        assert!(spec.truncatable());
        match (&spec.kind, layer.shares) {
            (
                StateKind::SharedKv {
                    layer,
                    source_layer,
                },
                Some(source),
            ) => {
                assert_eq!((*layer, *source_layer), (l, source));
                assert_eq!(spec.dtype(), "shared");
            }
            (StateKind::Kv { layer, layout }, None) => {
                assert_eq!(*layer, l);
                assert_eq!(spec.dtype(), "codec");
                match layout.kind {
                    KvKind::Sliding { window } => {
                        assert_eq!(window, config.window);
                        assert_eq!(
                            layout.ring_slots(),
                            Some(config.window + config.prefill_chunk - 1)
                        );
                    }
                    KvKind::Growing { .. } => {}
                }
                head_dims.push(layout.head_dim);
            }
            other => panic!("layer {l}: unexpected {other:?}"),
        }
    }
    head_dims.sort_unstable();
    head_dims.dedup();
    assert_eq!(
        head_dims,
        vec![config.sliding.head_dim, config.full.head_dim]
    );
}

#[test]
fn qwen_states_are_declared_as_data() {
    let config = QwenLikeConfig::tiny(1);
    let specs = config.state_specs(Growth::Doubling { initial: 16 });
    let g = config.linear;
    for layer in 0..config.layers {
        let of_layer: Vec<_> = specs
            .iter()
            .filter(|s| s.name.starts_with(&format!("blk.{layer}.")))
            .collect();
        if (layer + 1) % 4 == 0 {
            assert_eq!(of_layer.len(), 1);
            assert!(matches!(of_layer[0].kind, StateKind::Kv { layer: l, .. } if l == layer));
            assert!(of_layer[0].truncatable());
        } else {
            assert_eq!(of_layer.len(), 2);
            assert_eq!(
                of_layer[0].kind,
                StateKind::Fixed {
                    shape: vec![g.conv_kernel - 1, g.heads * (2 * g.key_dim + g.value_dim)]
                }
            );
            assert_eq!(
                of_layer[1].kind,
                StateKind::Fixed {
                    shape: vec![g.heads, g.key_dim, g.value_dim]
                }
            );
            for s in of_layer {
                assert_eq!(s.dtype(), "f32");
                assert!(!s.truncatable());
            }
        }
    }
}

/// TurboQuant shrinks the KV states and changes what attention sees, but the fixed states
/// stay f32: the states of the DeltaNet layers before the first attention layer are bit-equal
/// under f32 and k5v4 caches, and later ones differ only because their input did.
#[test]
fn turboquant_applies_to_kv_states_and_fixed_states_stay_f32() {
    let model = QwenLike::new(QwenLikeConfig::tiny(3)).unwrap();
    let tokens = prompt(20, 1);
    let mut exact = model
        .new_cache(&Allocation::from_toml_str(F32).unwrap(), 64)
        .unwrap();
    let mut quantized = model
        .new_cache(&Allocation::preset("k5v4").unwrap(), 64)
        .unwrap();
    let a = feed(&model, &mut exact, &tokens);
    let b = feed(&model, &mut quantized, &tokens);
    assert_ne!(a, b, "quantized attention changes the logits");
    for name in ["blk.0.rec", "blk.1.conv", "blk.2.rec"] {
        assert_eq!(
            exact.fixed(name).unwrap(),
            quantized.fixed(name).unwrap(),
            "{name}"
        );
    }
    assert_ne!(
        exact.fixed("blk.4.rec").unwrap(),
        quantized.fixed("blk.4.rec").unwrap()
    );
    let (m_exact, m_quant) = (exact.memory(), quantized.memory());
    for (e, q) in m_exact.iter().zip(&m_quant) {
        assert_eq!(e.formula_bytes, e.allocated_bytes, "{}", e.name);
        assert_eq!(q.formula_bytes, q.allocated_bytes, "{}", q.name);
        match e.kind {
            "fixed" => assert_eq!(e.allocated_bytes, q.allocated_bytes, "{}", e.name),
            "kv" => assert!(3 * q.bytes_per_token < e.bytes_per_token, "{}", e.name),
            other => panic!("unexpected kind {other}"),
        }
    }
}

/// A cache whose fixed states have absorbed tokens refuses to rewind, names the state and
/// changes nothing; a reset then gives exactly a fresh cache's outputs.
#[test]
fn fixed_states_refuse_rewind_and_reset_equals_fresh() {
    let model = QwenLike::new(QwenLikeConfig::tiny(4)).unwrap();
    for preset in ["f16", "k5v4", "tq3.5"] {
        let allocation = Allocation::preset(preset).unwrap();
        let mut cache = model.new_cache(&allocation, 64).unwrap();
        feed(&model, &mut cache, &prompt(12, 2));
        let before = cache.fork();
        let error = cache.truncate(8).unwrap_err();
        match &error {
            CacheError::Unsupported { state, reason } => {
                assert_eq!(state, "blk.0.conv");
                assert!(reason.contains("reset"), "{reason}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(error.to_string().contains("blk.0.conv"));
        assert_eq!(cache.len(), 12);
        let next = prompt(3, 9);
        let mut untouched = before;
        assert_eq!(
            feed(&model, &mut cache, &next),
            feed(&model, &mut untouched, &next),
            "{preset}: a refused rewind changes nothing"
        );

        cache.reset();
        assert_eq!(cache.len(), 0);
        let mut fresh = model.new_cache(&allocation, 64).unwrap();
        let other = prompt(17, 5);
        assert_eq!(
            feed(&model, &mut cache, &other),
            feed(&model, &mut fresh, &other),
            "{preset}: reset equals fresh"
        );
    }
}

/// Without fixed states a rewind within the rings' spare slots is exact; after a reset the
/// Gemma-like model also equals a fresh cache.
#[test]
fn gemma_rewinds_and_resets_exactly() {
    let model = GemmaLike::new(GemmaLikeConfig::tiny(6)).unwrap();
    let allocation = Allocation::preset("k5v4").unwrap();
    let prefix = prompt(20, 3);
    let mut straight = model.new_cache(&allocation, 64).unwrap();
    feed(&model, &mut straight, &prefix);
    let expected = feed(&model, &mut straight, &prompt(6, 7));

    let mut rewound = model.new_cache(&allocation, 64).unwrap();
    feed(&model, &mut rewound, &prefix);
    // Rejected speculative tokens: at most prefill_chunk − 1 = 7 (the ring's spare slots).
    feed(&model, &mut rewound, &prompt(7, 11));
    rewound.truncate(20).unwrap();
    assert_eq!(feed(&model, &mut rewound, &prompt(6, 7)), expected);

    rewound.reset();
    let mut fresh = model.new_cache(&allocation, 64).unwrap();
    assert_eq!(
        feed(&model, &mut rewound, &prefix),
        feed(&model, &mut fresh, &prefix)
    );
}

/// History reaches the last token through every kind of state: changing only the first token
/// changes the last token's logits (sliding and shared KV, DeltaNet states, full KV).
#[test]
fn the_states_carry_history() {
    let f32 = Allocation::from_toml_str(F32).unwrap();
    let (a, mut b) = (prompt(6, 1), prompt(6, 1));
    b[0] = (b[0] + 1) % 48;
    let last = |logits: Vec<f32>| logits[logits.len() - 48..].to_vec();
    let gemma = GemmaLike::new(GemmaLikeConfig::tiny(2)).unwrap();
    let qwen = QwenLike::new(QwenLikeConfig {
        // No attention layer at all: only the fixed states can carry the first token.
        layers: 3,
        ..QwenLikeConfig::tiny(2)
    })
    .unwrap();
    let mut c1 = gemma.new_cache(&f32, 8).unwrap();
    let mut c2 = gemma.new_cache(&f32, 8).unwrap();
    assert_ne!(
        last(feed(&gemma, &mut c1, &a)),
        last(feed(&gemma, &mut c2, &b))
    );
    // Without attention layers nothing counts tokens (`ModelCache::len` follows KV states), so
    // each sequence goes in as one call.
    let one_call = |tokens: &[u32]| {
        let specs = qwen.state_specs(Growth::Doubling { initial: 8 });
        let mut cache = ModelCache::with_allocation(specs, &f32).unwrap();
        let mut s = HybridScratch::default();
        feed_in_chunks(
            &qwen,
            &mut cache,
            tokens,
            &[6],
            AttentionKernel::Fused,
            &mut s,
        )
        .unwrap()
    };
    assert_ne!(last(one_call(&a)), last(one_call(&b)));
}

#[test]
fn sharers_store_nothing_and_sliding_memory_is_constant() {
    let model = GemmaLike::new(GemmaLikeConfig::tiny(7)).unwrap();
    for preset in ["f16", "k5v4", "tq3.5"] {
        let allocation = Allocation::preset(preset).unwrap();
        let small = model.new_cache(&allocation, 1024).unwrap().memory();
        let large = model.new_cache(&allocation, 4096).unwrap().memory();
        for ((spec, s), l) in model
            .state_specs(Growth::Static { capacity: 1 })
            .iter()
            .zip(&small)
            .zip(&large)
        {
            assert_eq!(s.formula_bytes, s.allocated_bytes, "{preset} {}", s.name);
            match &spec.kind {
                StateKind::SharedKv { .. } => assert_eq!(l.allocated_bytes, 0),
                StateKind::Kv { layout, .. } => match layout.kind {
                    KvKind::Sliding { .. } => {
                        assert_eq!(s.allocated_bytes, l.allocated_bytes, "{preset} {}", s.name);
                        assert_eq!(
                            s.allocated_bytes,
                            layout.ring_slots().unwrap() * s.bytes_per_token
                        );
                    }
                    KvKind::Growing { .. } => {
                        assert_eq!(s.allocated_bytes, 1024 * s.bytes_per_token);
                        assert_eq!(l.allocated_bytes, 4096 * l.bytes_per_token);
                    }
                },
                StateKind::Fixed { .. } => unreachable!("the Gemma-like model has no fixed state"),
            }
        }
    }
}

#[test]
fn bad_calls_are_typed_errors_and_change_nothing() {
    let model = QwenLike::new(QwenLikeConfig::tiny(8)).unwrap();
    let f16 = Allocation::preset("f16").unwrap();
    let mut cache = model.new_cache(&f16, 64).unwrap();
    feed(&model, &mut cache, &prompt(4, 1));
    let before = cache.fixed("blk.0.rec").unwrap().to_vec();
    let mut s = HybridScratch::default();
    let positions: Vec<u32> = (0..6).collect();
    let kernel = AttentionKernel::Fused;
    // Offset 3 while 4 tokens are cached.
    assert!(matches!(
        model.forward(
            &[1, 2, 3],
            &positions,
            &mut cache,
            kernel,
            Logits::Last,
            &mut s
        ),
        Err(ModelError::Cache(CacheError::OffsetMismatch {
            cached: 4,
            offset: 3
        }))
    ));
    assert!(matches!(
        model.forward(
            &[99, 1],
            &positions,
            &mut cache,
            kernel,
            Logits::Last,
            &mut s
        ),
        Err(ModelError::TokenOutOfRange { id: 99, vocab: 48 })
    ));
    assert!(matches!(
        model.forward(&[], &positions, &mut cache, kernel, Logits::Last, &mut s),
        Err(ModelError::InvalidCall(_))
    ));
    let gemma = GemmaLike::new(GemmaLikeConfig::tiny(8)).unwrap();
    let mut foreign = gemma.new_cache(&f16, 64).unwrap();
    assert!(matches!(
        model.forward(&[1], &[0], &mut foreign, kernel, Logits::Last, &mut s),
        Err(ModelError::InvalidCall(_))
    ));
    assert_eq!(cache.fixed("blk.0.rec").unwrap(), &before[..]);
    // Invalid configurations are refused, not run.
    let mut bad = GemmaLikeConfig::tiny(1);
    bad.layers[4].shares = Some(2); // a sliding layer sharing a full layer's cache
    assert!(matches!(
        GemmaLike::new(bad),
        Err(ModelError::Unsupported(_))
    ));
    let mut bad = GemmaLikeConfig::tiny(1);
    bad.layers[4].rope = bad.layers[1].rope; // a sharer rotating unlike its producer
    assert!(matches!(
        GemmaLike::new(bad),
        Err(ModelError::Unsupported(_))
    ));
    let mut bad = QwenLikeConfig::tiny(1);
    bad.linear.conv_kernel = 1;
    assert!(matches!(
        QwenLike::new(bad),
        Err(ModelError::Unsupported(_))
    ));
}
