//! Per layer sensitivity (`tq_models::eval::sensitivity`): a raised variant changes exactly
//! one stream of one layer, costs what the formula says, the ranking orders by KL saved per
//! byte, and the budget is never exceeded. A one-bit step changes one stream's bits; the trades
//! pair the best raises with the cheapest lowerings at the same bytes, never step one stream
//! both ways, stop where a pair stops paying, and are written for the measured model's depth
//! only.

use tq_cache::CodecSpec;
use tq_cache::allocation::{Allocation, LayerKind, ModelShape, StreamKind};
use tq_models::eval::EvalRow;
use tq_models::eval::memory::CacheCost;
use tq_models::eval::metrics::TextSummary;
use tq_models::eval::sensitivity::{
    BitStep, bytes_per_token, raised, rank, spend_budget, stepped, stream_bits, trade_prefixes,
    traded,
};

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

fn mse_bits(a: &Allocation, layer: usize, num_layers: usize, stream: StreamKind) -> u8 {
    match a
        .resolve(layer, num_layers, 0, 64, stream)
        .unwrap()
        .single()
    {
        Some(CodecSpec::Mse(s)) => s.bits,
        other => panic!("expected mse, got {other:?}"),
    }
}

#[test]
fn a_one_bit_step_changes_one_stream_and_only_at_its_depth() {
    let base = Allocation::preset("mse-k4v4").unwrap();
    assert_eq!(
        stream_bits(&base, &SHAPE, 3, LayerKind::Global, StreamKind::Key).unwrap(),
        Some(4)
    );
    let f16 = Allocation::preset("f16").unwrap();
    assert_eq!(
        stream_bits(&f16, &SHAPE, 3, LayerKind::Global, StreamKind::Key).unwrap(),
        None
    );
    let up = stepped(&base, 30, 7, StreamKind::Value, 4, 5);
    assert_eq!(up.name, "mse-k4v4+L7V+1");
    let down = stepped(&base, 30, 7, StreamKind::Key, 4, 3);
    assert_eq!(down.name, "mse-k4v4+L7K-1");
    for layer in 0..30 {
        for stream in StreamKind::BOTH {
            let want = |hit: StreamKind, bits: u8| {
                if layer == 7 && stream == hit { bits } else { 4 }
            };
            assert_eq!(mse_bits(&up, layer, 30, stream), want(StreamKind::Value, 5));
            assert_eq!(mse_bits(&down, layer, 30, stream), want(StreamKind::Key, 3));
        }
    }
    // A one-bit step at d = 64 moves 8 bytes per head.
    let diff = |a: &Allocation| {
        bytes_per_token(a, &SHAPE)
            .unwrap()
            .abs_diff(bytes_per_token(&base, &SHAPE).unwrap())
    };
    assert_eq!(diff(&up), 3 * 8);
    assert_eq!(diff(&down), 3 * 8);
    // On a model of another depth the step is not applied.
    for layer in 0..18 {
        assert_eq!(mse_bits(&up, layer, 18, StreamKind::Value), 4);
    }
}

fn step(layer: usize, stream: &'static str, from: u8, to: u8, kl_change: f64) -> BitStep {
    BitStep {
        layer,
        stream,
        from_bits: from,
        to_bits: to,
        bytes_per_token: 24,
        kl: 0.0,
        kl_change,
    }
}

#[test]
fn trades_pair_the_best_raises_with_the_cheapest_lowerings() {
    let steps = [
        step(0, "key", 3, 4, 0.010),   // best raise
        step(0, "key", 3, 2, 0.001),   // cheapest lowering, but of the raised stream
        step(1, "value", 2, 3, 0.006), // second raise
        step(1, "value", 2, 1, 0.050),
        step(2, "key", 3, 4, 0.002), // third raise: costs more than its lowering saves
        step(5, "key", 3, 2, 0.004), // fourth-cheapest lowering
        step(3, "key", 3, 4, -0.001), // a raise that made it worse: never taken
        step(3, "key", 3, 2, 0.003), // third-cheapest lowering
        step(4, "value", 2, 3, 0.0005),
        step(4, "value", 2, 1, 0.0035),
    ];
    let prefixes = trade_prefixes(&steps);
    let names: Vec<Vec<(usize, usize)>> = prefixes
        .iter()
        .map(|p| p.iter().map(|(r, l)| (r.layer, l.layer)).collect())
        .collect();
    // Raise 0K pays for lowering 3K (0K's own lowering skipped), raise 1V for lowering 4V
    // (0.0035 < 0.006); raise 2K (0.002) would not pay for the next lowering, 5K (0.004), so
    // the list stops there.
    assert_eq!(names, vec![vec![(0, 3)], vec![(0, 3), (1, 4)]]);

    let base = Allocation::from_toml_str(
        r#"
        name = "k3v2"
        key = { codec = "mse", bits = 3, center = "first-chunk" }
        value = { codec = "mse", bits = 2, norm_correction = true }
        "#,
    )
    .unwrap();
    let written = traded(&base, 30, &prefixes[1]);
    assert_eq!(written.name, "k3v2-trades2");
    let text = written.to_toml_string().unwrap();
    let back = Allocation::from_toml_str(&text).unwrap();
    assert_eq!(back, written);
    let bits = |a: &Allocation, layer, n, stream| {
        stream_bits(
            a,
            &ModelShape {
                num_layers: n,
                ..SHAPE
            },
            layer,
            LayerKind::Global,
            stream,
        )
        .unwrap()
        .unwrap()
    };
    assert_eq!(bits(&written, 0, 30, StreamKind::Key), 4);
    assert_eq!(bits(&written, 3, 30, StreamKind::Key), 2);
    assert_eq!(bits(&written, 1, 30, StreamKind::Value), 3);
    assert_eq!(bits(&written, 4, 30, StreamKind::Value), 1);
    assert_eq!(bits(&written, 5, 30, StreamKind::Key), 3);
    // The same bytes per token as the base.
    assert_eq!(
        bytes_per_token(&written, &SHAPE).unwrap(),
        bytes_per_token(&base, &SHAPE).unwrap()
    );
    // On another depth the file is the base.
    for layer in 0..18 {
        for stream in StreamKind::BOTH {
            assert_eq!(
                bits(&written, layer, 18, stream),
                bits(&base, layer, 18, stream)
            );
        }
    }
}
