//! The two-tier codec: outlier selection is the documented top-k, records are the two tiers'
//! records side by side, and each tier behaves exactly like its codec alone. Catches: channels
//! gathered or scattered to the wrong places, tiers sharing a record region, ties broken
//! non-deterministically, and byte counts that do not add up.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tq_cache::codec::{CodecScratch, MseSpec};
use tq_cache::two_tier::{TwoTierCodec, TwoTierError, TwoTierScratch, select_outlier_channels};
use tq_cache::{CodecSpec, TokenCodec};

/// `n` tokens of dimension `d`, standard normal-ish, with `planted` channels scaled by 10.
fn tokens(n: usize, d: usize, planted: &[usize], seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut x: Vec<f32> = (0..n * d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    for row in x.chunks_exact_mut(d) {
        for &c in planted {
            row[c] *= 10.0;
        }
    }
    x
}

fn round_trip(codec: &TwoTierCodec, x: &[f32]) -> Vec<f32> {
    let mut scratch = TwoTierScratch::new(codec);
    let mut record = vec![0u32; codec.record_words()];
    let mut scales = vec![f16::ZERO; codec.scales_per_token()];
    codec
        .encode_into(x, &mut scratch, &mut record, &mut scales)
        .unwrap();
    let mut y = vec![f32::NAN; codec.head_dim()];
    codec
        .decode_into(&record, &scales, &mut scratch, &mut y)
        .unwrap();
    y
}

#[test]
fn selection_finds_the_planted_outlier_channels() {
    let planted = [3, 17, 40, 41, 63];
    let x = tokens(32, 64, &planted, 1);
    let channels = select_outlier_channels(&x, 64, planted.len()).unwrap();
    assert_eq!(channels, planted.map(|c| c as u16));
}

#[test]
fn selection_breaks_ties_by_lower_index() {
    // All channels equal: the first k win.
    let x = vec![1.0f32; 4 * 8];
    assert_eq!(select_outlier_channels(&x, 8, 3).unwrap(), vec![0, 1, 2]);
    // Channels 5 and 2 tie for the top, then 6 and 1 tie: lower indices win each tie.
    let row = [0.0, 2.0, 3.0, 0.0, 0.0, -3.0, 2.0, 0.0];
    assert_eq!(select_outlier_channels(&row, 8, 3).unwrap(), vec![1, 2, 5]);
}

#[test]
fn selection_rejects_bad_input() {
    assert!(matches!(
        select_outlier_channels(&[0.0; 10], 4, 1),
        Err(TwoTierError::TokensShape {
            len: 10,
            head_dim: 4
        })
    ));
    assert!(matches!(
        select_outlier_channels(&[0.0; 8], 4, 4),
        Err(TwoTierError::ChannelCount { .. })
    ));
    assert!(matches!(
        select_outlier_channels(&[0.0; 8], 4, 0),
        Err(TwoTierError::ChannelCount { .. })
    ));
    let mut x = vec![0.0; 8];
    x[6] = f32::NAN;
    assert!(matches!(
        select_outlier_channels(&x, 4, 1),
        Err(TwoTierError::NonFinite {
            token: 1,
            channel: 2,
            ..
        })
    ));
}

#[test]
fn f32_tiers_round_trip_exactly() {
    let x = tokens(1, 48, &[7, 30], 2);
    let codec = TwoTierCodec::new(
        vec![7, 30],
        &CodecSpec::F32 { dim: 2 },
        &CodecSpec::F32 { dim: 46 },
    )
    .unwrap();
    assert_eq!(codec.rest_channels().len(), 46);
    assert_eq!(round_trip(&codec, &x), x);
}

#[test]
fn each_tier_behaves_exactly_like_its_codec_alone() {
    let (d, planted) = (64, [1usize, 9, 10, 22, 33, 34, 50, 60]);
    let prefill = tokens(16, d, &planted, 3);
    let channels = select_outlier_channels(&prefill, d, 8).unwrap();
    let outlier_spec = CodecSpec::Mse(MseSpec::new(8, 4, 11));
    let rest_spec = CodecSpec::Mse(MseSpec::new(56, 2, 12));
    let codec = TwoTierCodec::new(channels.clone(), &outlier_spec, &rest_spec).unwrap();

    let x = &prefill[5 * d..6 * d];
    let y = round_trip(&codec, x);

    // The outlier channels' reconstruction is bit-identical to the outlier codec run on the
    // gathered channels alone, and the same for the rest.
    for (spec, picked) in [
        (outlier_spec, channels.clone()),
        (rest_spec, codec.rest_channels().to_vec()),
    ] {
        let alone = TokenCodec::new(&spec).unwrap();
        let sub: Vec<f32> = picked.iter().map(|&c| x[usize::from(c)]).collect();
        let mut scratch = CodecScratch::new(sub.len());
        let mut record = vec![0u32; alone.record_words()];
        let mut scales = vec![f16::ZERO; alone.scales_per_token()];
        alone
            .encode_into(&sub, &mut scratch, &mut record, &mut scales)
            .unwrap();
        let mut expected = vec![0.0; sub.len()];
        alone
            .decode_into(&record, &scales, &mut scratch, &mut expected)
            .unwrap();
        let got: Vec<f32> = picked.iter().map(|&c| y[usize::from(c)]).collect();
        assert_eq!(got, expected);
    }

    // The outliers get the finer tier: their relative error is below the rest's.
    let rel = |picked: &[u16]| {
        let err: f32 = picked
            .iter()
            .map(|&c| (x[c as usize] - y[c as usize]).powi(2))
            .sum();
        let norm: f32 = picked.iter().map(|&c| x[c as usize].powi(2)).sum();
        err / norm
    };
    assert!(rel(&channels) < rel(codec.rest_channels()));
}

#[test]
fn bytes_add_up() {
    let outlier = CodecSpec::Mse(MseSpec::new(32, 4, 1));
    let rest = CodecSpec::Mse(MseSpec::new(96, 3, 2));
    let channels: Vec<u16> = (0..32).map(|c| c * 4).collect();
    let codec = TwoTierCodec::new(channels, &outlier, &rest).unwrap();
    let (o, r) = (
        TokenCodec::new(&outlier).unwrap(),
        TokenCodec::new(&rest).unwrap(),
    );
    assert_eq!(codec.record_words(), o.record_words() + r.record_words());
    assert_eq!(codec.scales_per_token(), 2);
    assert_eq!(
        codec.bytes_per_token(),
        o.bytes_per_token() + r.bytes_per_token()
    );
    // (32·4 + 96·3)/8 = 52 bytes of codes, two f16 norms: 56 bytes, 3.5 bits per value.
    assert_eq!(codec.bytes_per_token(), 56);
    assert_eq!(codec.bits_per_value(), 3.5);
    assert_eq!(codec.metadata_bytes(), 64);
}

#[test]
fn construction_rejects_inconsistent_channels() {
    let o = CodecSpec::F16 { dim: 2 };
    let r = CodecSpec::F16 { dim: 6 };
    let err = TwoTierCodec::new(vec![3, 3], &o, &r).unwrap_err();
    assert!(
        err.to_string()
            .contains("channels[1] = 3 is not above channels[0] = 3"),
        "{err}"
    );
    let err = TwoTierCodec::new(vec![1, 8], &o, &r).unwrap_err();
    assert!(
        err.to_string().contains("channel 8 is outside the head"),
        "{err}"
    );
    assert!(matches!(
        TwoTierCodec::new(vec![1, 2, 3], &o, &r),
        Err(TwoTierError::TierDim {
            tier: "outlier",
            expected: 3,
            actual: 2
        })
    ));
}

#[test]
fn encode_checks_lengths_and_finiteness() {
    let codec = TwoTierCodec::new(
        vec![0],
        &CodecSpec::F32 { dim: 1 },
        &CodecSpec::F32 { dim: 3 },
    )
    .unwrap();
    let mut scratch = TwoTierScratch::new(&codec);
    let mut record = vec![0u32; 4];
    let mut scales: Vec<f16> = vec![];
    assert!(
        codec
            .encode_into(&[0.0; 3], &mut scratch, &mut record, &mut scales)
            .is_err()
    );
    assert!(
        codec
            .encode_into(&[0.0; 4], &mut scratch, &mut record[..3], &mut scales)
            .is_err()
    );
    let err = codec
        .encode_into(
            &[0.0, 0.0, f32::INFINITY, 0.0],
            &mut scratch,
            &mut record,
            &mut scales,
        )
        .unwrap_err();
    assert!(err.to_string().contains("coordinate 2"), "{err}");
}
