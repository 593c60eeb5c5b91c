//! Decode steps over one layer's cache, for counting instructions: this VM's timings drift by
//! up to 20% between runs, a count of executed instructions does not.
//!
//! It fills one cache of SmolLM2's attention shape (3 KV heads, 9 query heads, d = 64; or, with
//! `TQ_SHAPE=d128`, 8 KV heads, 32 query heads and d = 128) with
//! `TOKENS` Gaussian tokens as `tq bench attention` does (one batch with queries whose energy
//! falls 256× over the RoPE planes, so plane bases get fitted), runs `STEPS` decode steps of
//! the fused kernel on the best instruction set (`TQ_SIMD=avx2` or `scalar` picks another),
//! and prints a hash of the last output's bits (a change that should keep the output can be
//! checked by it). A step's instructions are the
//! difference between two runs, `STEPS` and 0, under callgrind:
//!
//! ```sh
//! cargo build --release -p tq-cache --example decode_steps
//! for n in 0 30; do
//!   RAYON_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=cg.$n \
//!     target/release/examples/decode_steps rec3.25 8192 $n
//! done   # (I refs of the second − the first) / 30
//! ```
//!
//! `CONFIG` is `f16`, a preset name or an allocation TOML file. The steps' mean wall time goes
//! to stderr: compare binaries by it only in interleaved runs on a quiet machine.
use tq_cache::CodecSpec;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionShape;
use tq_cache::attention::simd::{Isa, fused_attention_on};
use tq_cache::basis::RopePairs;
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::token_store::Growth;

/// `(KV heads, query heads, d)` of the shape `TQ_SHAPE` names: SmolLM2's (the default) or
/// `d128`, `tq bench attention`'s other shape.
fn shape() -> Result<(usize, usize, usize), String> {
    match std::env::var("TQ_SHAPE").as_deref() {
        Err(_) | Ok("smollm2") => Ok((3, 9, 64)),
        Ok("d128") => Ok((8, 32, 128)),
        Ok(other) => Err(format!("TQ_SHAPE: unknown shape `{other}` (smollm2, d128)")),
    }
}

/// A standard normal sample from a xorshift stream (Box–Muller): enough for test data, and no
/// dependency beyond the cache crate's own.
fn gaussian(state: &mut u64) -> f32 {
    let mut uniform = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        ((*state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (a, b) = (uniform(), uniform());
    ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, config, tokens, steps] = args.as_slice() else {
        return Err("usage: decode_steps CONFIG TOKENS STEPS".into());
    };
    let (tokens, steps): (usize, usize) = (tokens.parse()?, steps.parse()?);
    let (kv_heads, q_heads, d) = shape()?;
    if tokens == 0 {
        return Err("TOKENS must be at least 1".into());
    }
    let layout = KvLayout {
        kv_heads,
        head_dim: d,
        kind: KvKind::Growing {
            growth: Growth::Static { capacity: tokens },
        },
        max_rewind: 0,
        rope_pairs: RopePairs::Adjacent,
        // Llama's base, so `center = "rope"` allocations run (the Gaussian tokens give them
        // a center near zero: what is measured is the correction's cost).
        rope_base: tq_cache::rope_center::RopeBase::new(10_000.0),
    };
    let mut cache = match config.as_str() {
        "f16" => KvCache::uniform(layout, CodecSpec::F16 { dim: d }, CodecSpec::F16 { dim: d })?,
        other => KvCache::with_allocation(layout, &Allocation::load(other)?, 0, 1)?,
    };
    let mut state = 0x1234_5678_9abc_def1u64;
    let queries: Vec<f32> = (0..64 * q_heads * d)
        .map(|i| {
            let plane = (i % d) / 2;
            16f32.powf(-(plane as f32) / (d / 2) as f32) * gaussian(&mut state)
        })
        .collect();
    let width = kv_heads * d;
    let keys: Vec<f32> = (0..tokens * width).map(|_| gaussian(&mut state)).collect();
    let values: Vec<f32> = (0..tokens * width).map(|_| gaussian(&mut state)).collect();
    let positions: Vec<u32> = (0..tokens as u32).collect();
    cache.append_with_queries(&keys, &values, &positions, &queries, q_heads)?;
    let query: Vec<f32> = (0..q_heads * d).map(|_| gaussian(&mut state)).collect();
    let mut out = vec![0.0f32; q_heads * d];
    let shape = AttentionShape {
        q_heads,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let isa = Isa::detect();
    let start = std::time::Instant::now();
    for _ in 0..steps {
        fused_attention_on(isa, &cache, &query, &[tokens as u32 - 1], shape, &mut out)?;
    }
    let elapsed = start.elapsed();
    // FNV-1a over the output's bits.
    let hash = out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
    });
    println!("{} {hash:016x}", isa.name());
    if steps > 0 {
        // On stderr, so the hash line stays comparable between runs.
        eprintln!(
            "{:.1} us per step",
            elapsed.as_secs_f64() * 1e6 / steps as f64
        );
    }
    Ok(())
}
