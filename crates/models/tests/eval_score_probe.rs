//! The score probe of `tq_models::eval` on a small synthetic cache (no model needed): it must
//! not change attention's output, must report zero error for a lossless cache, and more error
//! for fewer bits.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_models::eval::score_probe::{LayerScoreStats, ScoreProbe, ScoreRecord};
use tq_models::llama::{AttentionBackend, CpuAttention};

const LAYERS: usize = 2;
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const D: usize = 64;
const TOKENS: usize = 48;

fn cache(allocation: &str) -> ModelCache {
    let specs = (0..LAYERS)
        .map(|layer| StateSpec {
            name: format!("blk.{layer}.kv"),
            kind: StateKind::Kv {
                layer,
                layout: KvLayout {
                    kv_heads: KV_HEADS,
                    head_dim: D,
                    kind: KvKind::Growing {
                        growth: Growth::Static { capacity: TOKENS },
                    },
                    max_rewind: 0,
                    rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                    rope_base: Default::default(),
                },
            },
        })
        .collect();
    let allocation = Allocation::from_toml_str(allocation).expect("allocation parses");
    ModelCache::with_allocation(specs, &allocation).expect("cache builds")
}

fn allocation(codec: &str) -> String {
    format!("name = \"t\"\nkey = {codec}\nvalue = {codec}\n")
}

/// A standard normal sample (Box–Muller; no extra dependency).
fn normal(rng: &mut ChaCha20Rng) -> f32 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random();
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// Random inputs `(queries, keys, values)` of `n` tokens; keys carry a few large channels like
/// real post-RoPE keys do.
fn inputs(rng: &mut ChaCha20Rng, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut gaussian = |len: usize, outliers: bool| -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = normal(rng);
                if outliers && i % D < 4 { 8.0 * x } else { x }
            })
            .collect()
    };
    let q = gaussian(n * Q_HEADS * D, false);
    let k = gaussian(n * KV_HEADS * D, true);
    let v = gaussian(n * KV_HEADS * D, false);
    (q, k, v)
}

/// Runs `chunks` prefill chunks through a probe over a cache of `codec`, and the same inputs
/// through plain attention over an identical cache; returns the probe's statistics and both
/// outputs.
fn run(codec: &str, chunks: &[usize]) -> (Vec<LayerScoreStats>, Vec<f32>, Vec<f32>) {
    let mut rng = ChaCha20Rng::seed_from_u64(42);
    let mut probed = cache(&allocation(codec));
    let mut plain = cache(&allocation(codec));
    let mut record = ScoreRecord::new(LAYERS);
    let shape = AttentionShape {
        q_heads: Q_HEADS,
        scale: 1.0 / (D as f32).sqrt(),
    };
    let (mut out_probe, mut out_plain) = (Vec::new(), Vec::new());
    let mut done = 0;
    for &n in chunks {
        done += n;
        let positions: Vec<u32> = (0..done as u32).collect();
        for layer in 0..LAYERS {
            let (q, k, v) = inputs(&mut rng, n);
            let mut a = vec![0.0; q.len()];
            let mut b = vec![0.0; q.len()];
            ScoreProbe::new(&mut probed, AttentionKernel::Fused, &mut record)
                .attend(layer, &q, &k, &v, &positions, shape, &mut a)
                .expect("probe attends");
            CpuAttention {
                cache: &mut plain,
                kernel: AttentionKernel::Fused,
            }
            .attend(layer, &q, &k, &v, &positions, shape, &mut b)
            .expect("plain attends");
            out_probe.extend(a);
            out_plain.extend(b);
        }
    }
    (record.stats().to_vec(), out_probe, out_plain)
}

#[test]
fn the_probe_does_not_change_the_attention_output() {
    // Bit-identical to plain CPU attention on an identical cache: the probe only reads.
    for codec in ["{ codec = \"f16\" }", "{ codec = \"mse\", bits = 3 }"] {
        let (_, probed, plain) = run(codec, &[16, 1, 31]);
        assert_eq!(probed, plain, "{codec}");
    }
}

#[test]
fn a_lossless_cache_has_zero_score_error() {
    // f32 storage returns the keys exactly, so compressed and exact scores are the same
    // numbers; an indexing bug (wrong token, head or GQA group) would make them differ.
    let (stats, _, _) = run("{ codec = \"f32\" }", &[16, 1, 31]);
    for s in &stats {
        assert_eq!(s.squared_error, 0.0);
        assert_eq!(s.relative_error(), 0.0);
        assert_eq!(s.mean_weight_tv(), 0.0);
        assert!(s.squared_exact > 0.0);
    }
}

#[test]
fn every_query_row_of_every_chunk_is_scored() {
    let chunks = [16, 1, 31];
    let (stats, _, _) = run("{ codec = \"f16\" }", &chunks);
    let rows: usize = chunks.iter().sum::<usize>() * Q_HEADS;
    assert_eq!(stats.len(), LAYERS);
    for s in &stats {
        assert_eq!(s.rows, rows);
        // f16 rounding is small but not zero.
        assert!(
            s.relative_error() > 0.0 && s.relative_error() < 1e-2,
            "{s:?}"
        );
    }
}

#[test]
fn fewer_bits_give_more_score_error() {
    // TQ_mse distortion falls about 4x per bit; 2-, 3- and 4-bit keys on the same inputs must
    // order their errors accordingly, and every weight TV distance is a proper one.
    let errors: Vec<f64> = [2, 3, 4]
        .iter()
        .map(|bits| {
            let (stats, _, _) = run(&format!("{{ codec = \"mse\", bits = {bits} }}"), &[24, 24]);
            for s in &stats {
                assert!((0.0..=1.0).contains(&s.mean_weight_tv()), "{s:?}");
            }
            stats
                .iter()
                .map(LayerScoreStats::relative_error)
                .sum::<f64>()
                / LAYERS as f64
        })
        .collect();
    assert!(
        errors[0] > errors[1] && errors[1] > errors[2] && errors[2] > 0.0,
        "{errors:?}"
    );
}

#[test]
fn a_layer_outside_the_record_is_an_error() {
    let mut cache = cache(&allocation("{ codec = \"f16\" }"));
    let mut record = ScoreRecord::new(1);
    let shape = AttentionShape {
        q_heads: Q_HEADS,
        scale: 0.125,
    };
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let (q, k, v) = inputs(&mut rng, 2);
    let mut out = vec![0.0; q.len()];
    let result = ScoreProbe::new(&mut cache, AttentionKernel::Fused, &mut record).attend(
        1,
        &q,
        &k,
        &v,
        &[0, 1],
        shape,
        &mut out,
    );
    assert!(result.is_err());
}

/// The probe's reconstruction error of the compressed body, against what it must be: zero for
/// f32, the Lloyd-Max codebook's own distortion for TQ_mse (a rotated unit vector's expected
/// squared error; 192 vectors put the sample mean within a few percent of it, so the factor
/// 0.7–1.4 has a false-failure rate far below 1e-6 and still catches a decode of the wrong
/// record or a missing norm), and for a centered stream the error of `x − μ` with μ added back
/// (without the add-back the error would be ‖μ‖² per vector, 9× the energy of the rest).
#[test]
fn reconstruction_error_is_the_codecs() {
    use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
    let run_keys = |codec: &str, offset: f32| {
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let mut probed = cache(&allocation(codec));
        let mut record = ScoreRecord::new(LAYERS);
        let shape = AttentionShape {
            q_heads: Q_HEADS,
            scale: 1.0 / (D as f32).sqrt(),
        };
        let positions: Vec<u32> = (0..TOKENS as u32).collect();
        for layer in 0..LAYERS {
            let (q, mut k, v) = inputs(&mut rng, TOKENS);
            for (i, x) in k.iter_mut().enumerate() {
                *x += offset * if i % 2 == 0 { 1.0 } else { -1.0 };
            }
            let mut out = vec![0.0; q.len()];
            ScoreProbe::new(&mut probed, AttentionKernel::Fused, &mut record)
                .attend(layer, &q, &k, &v, &positions, shape, &mut out)
                .expect("probe attends");
        }
        let r = record.reconstruction();
        assert_eq!(r.len(), LAYERS);
        let mut sum = tq_models::eval::ReconstructionStats::default();
        for layer in r {
            assert_eq!(layer[0].vectors, TOKENS * KV_HEADS);
            sum.squared_error += layer[0].squared_error;
            sum.squared_energy += layer[0].squared_energy;
        }
        sum.relative_mse()
    };
    assert_eq!(run_keys("{ codec = \"f32\" }", 0.0), 0.0);
    let book = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: D }, 4).unwrap();
    let expected = book.unit_vector_distortion();
    let plain = run_keys("{ codec = \"mse\", bits = 4 }", 0.0);
    assert!(
        (0.7..1.4).contains(&(plain / expected)),
        "{plain} vs the codebook's {expected}"
    );
    // The keys' spread has energy 4·64 + 60 = 316 per head (four channels of standard
    // deviation 8): an offset of 3·√(316/64) per coordinate carries 9× that.
    let offset = 3.0 * (316.0 / D as f32).sqrt();
    let uncentered = run_keys("{ codec = \"mse\", bits = 4 }", offset);
    let centered = run_keys(
        "{ codec = \"mse\", bits = 4, center = \"first-chunk\" }",
        offset,
    );
    assert!(
        centered < 0.3 * uncentered,
        "centering shrinks the error relative to the uncentered energy: {centered} vs {uncentered}"
    );
}

/// A stream with an 8-bit window writes a token's codes only when the token leaves the window,
/// so its body error is measured then: over 48 tokens in chunks of 8 with a 16-token window,
/// the 32 tokens that left it are compared once each (a probe that looked only at each chunk's
/// own tokens would compare none, as `tq eval` did for `rec4.25`'s keys), and their error is
/// the codec's (the same 0.7–1.4× band as `reconstruction_error_is_the_codecs`, 128 vectors).
#[test]
fn a_windowed_stream_is_measured_as_its_tokens_leave_the_window() {
    use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
    const WINDOW: usize = 16;
    let text = format!(
        "name = \"w\"\nrecent_dtype = \"q8\"\n\
         key = {{ codec = \"mse\", bits = 4, recent_fp_tokens = {WINDOW} }}\n\
         value = {{ codec = \"mse\", bits = 4, recent_fp_tokens = {WINDOW} }}\n"
    );
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let mut probed = cache(&text);
    let mut record = ScoreRecord::new(LAYERS);
    let shape = AttentionShape {
        q_heads: Q_HEADS,
        scale: 1.0 / (D as f32).sqrt(),
    };
    let mut done = 0;
    for n in [8; TOKENS / 8] {
        done += n;
        let positions: Vec<u32> = (0..done as u32).collect();
        for layer in 0..LAYERS {
            let (q, k, v) = inputs(&mut rng, n);
            let mut out = vec![0.0; q.len()];
            ScoreProbe::new(&mut probed, AttentionKernel::Fused, &mut record)
                .attend(layer, &q, &k, &v, &positions, shape, &mut out)
                .expect("probe attends");
        }
    }
    let book = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: D }, 4).unwrap();
    let expected = book.unit_vector_distortion();
    for (layer, r) in record.reconstruction().iter().enumerate() {
        for (which, stats) in r.iter().enumerate() {
            assert_eq!(
                stats.vectors,
                (TOKENS - WINDOW) * KV_HEADS,
                "layer {layer}, stream {which}: every token that left the window, once"
            );
            let ratio = stats.relative_mse() / expected;
            assert!(
                (0.7..1.4).contains(&ratio),
                "layer {layer}, stream {which}: {ratio} × the codebook's distortion"
            );
        }
    }
}
