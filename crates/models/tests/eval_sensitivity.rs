//! Per layer sensitivity (`tq_models::eval::sensitivity`): a raised variant changes exactly
//! one stream of one layer, costs what the formula says, the ranking orders by KL saved per
//! byte, and the budget is never exceeded.

use tq_cache::CodecSpec;
use tq_cache::allocation::{Allocation, ModelShape, StreamKind};
use tq_models::eval::EvalRow;
use tq_models::eval::memory::CacheCost;
use tq_models::eval::metrics::TextSummary;
use tq_models::eval::sensitivity::{bytes_per_token, raised, rank, spend_budget};

const SHAPE: ModelShape = ModelShape {
    num_layers: 30,
    num_kv_heads: 3,
    head_dim: 64,
};

fn row(name: &str, kl: f64) -> EvalRow {
    EvalRow {
        alloc: name.to_string(),
        text: TextSummary {
            positions: 10,
            perplexity: 20.0,
            mean_nll: 20f64.ln(),
            mean_kl: kl,
            max_kl: kl,
            top1_agreement: 0.9,
        },
        cost: CacheCost {
            bytes_per_token_formula: 0,
            bytes_per_token_allocated: 0.0,
            bits_per_value: 0.0,
            key_bits_per_value: 0.0,
            value_bits_per_value: 0.0,
            cache_bytes_allocated: 0,
            cache_bytes_formula: 0,
        },
        layer_score_error: Vec::new(),
        layer_weight_tv: Vec::new(),
        mean_score_error: 0.0,
        mean_weight_tv: 0.0,
        layer_key_bits: Vec::new(),
        layer_value_bits: Vec::new(),
        layer_key_distance_db: Vec::new(),
        layer_value_distance_db: Vec::new(),
        key_distance_db: None,
        value_distance_db: None,
        seconds: 1.0,
        tokens_per_s: 1.0,
        decode_steps: 0,
        decode_tokens_per_s: 0.0,
    }
}

#[test]
fn a_raised_variant_changes_one_stream_of_one_layer() {
    let base = Allocation::preset("k5v4").unwrap();
    let variant = raised(&base, 7, StreamKind::Key);
    assert_eq!(variant.name, "k5v4+L7K");
    for layer in 0..SHAPE.num_layers {
        for stream in StreamKind::BOTH {
            let before = base.resolve(layer, 30, 1, 64, stream).unwrap();
            let after = variant.resolve(layer, 30, 1, 64, stream).unwrap();
            if layer == 7 && stream == StreamKind::Key {
                assert_eq!(after.single(), Some(&CodecSpec::F16 { dim: 64 }));
            } else {
                assert_eq!(before, after, "layer {layer} {stream}");
            }
        }
    }
    // k5v4 keys cost 44 bytes per head at d = 64, f16 128: 3 heads × 84 more.
    let extra =
        bytes_per_token(&variant, &SHAPE).unwrap() - bytes_per_token(&base, &SHAPE).unwrap();
    assert_eq!(extra, 3 * (128 - 44));
    // The variant is a valid allocation that survives a TOML round trip.
    let text = variant.to_toml_string().unwrap();
    assert_eq!(Allocation::from_toml_str(&text).unwrap(), variant);
}

#[test]
fn ranking_and_budget() {
    let base = row("b", 0.10);
    let (a, b, c, d) = (
        row("a", 0.05),
        row("b", 0.08),
        row("c", 0.09),
        row("d", 0.12),
    );
    let variants = [
        (0, StreamKind::Key, 200, &a),  // saves 0.05 / 200 B
        (1, StreamKind::Value, 40, &b), // saves 0.02 / 40 B: best per byte
        (2, StreamKind::Key, 10, &c),   // saves 0.01 / 10 B: second
        (3, StreamKind::Value, 10, &d), // makes it worse
    ];
    let ranking = rank(&base, &variants);
    let order: Vec<usize> = ranking.iter().map(|s| s.layer).collect();
    assert_eq!(order, vec![2, 1, 0, 3]);
    assert!((ranking[0].kl_saved_per_byte - 0.001).abs() < 1e-12);
    assert!(ranking[3].kl_saved < 0.0);

    let allocation = Allocation::preset("mse-k4v4").unwrap();
    // 60 bytes: layers 2 (10) and 1 (40) fit, layer 0 (200) does not, layer 3 saves nothing.
    let (spent_allocation, spent) = spend_budget(&allocation, &ranking, 60);
    assert_eq!(spent, 50);
    assert_eq!(spent_allocation.overrides.len(), 2);
    assert_eq!(spent_allocation.name, "mse-k4v4-budget60");
    // A budget below every cost changes nothing.
    let (unchanged, spent) = spend_budget(&allocation, &ranking, 5);
    assert_eq!(spent, 0);
    assert_eq!(unchanged.overrides, allocation.overrides);
}
