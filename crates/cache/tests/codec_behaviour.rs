//! Typed errors, zero vectors, norm correction and determinism of the codecs.

use half::f16;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::codec::{CodecError, DebiasedMse, MseSpec, ProdSpec, TqMse, TqProd};
use tq_rotation::RotationKind;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x0c0d_ec00),
        failure_persistence: None,
        ..Config::default()
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let codec = TqMse::new(MseSpec::new(64, 4, 1)).unwrap();
    let mut x = vec![0.5f32; 64];
    x[7] = f32::NAN;
    assert!(matches!(
        codec.encode(&x),
        Err(CodecError::NonFinite { index: 7, .. })
    ));
    x[7] = f32::INFINITY;
    assert!(matches!(
        codec.encode(&x),
        Err(CodecError::NonFinite { index: 7, .. })
    ));
    assert!(matches!(
        codec.encode(&[1.0; 63]),
        Err(CodecError::LengthMismatch {
            expected: 64,
            actual: 63,
            ..
        })
    ));
    assert!(matches!(
        codec.encode(&[1e5; 64]),
        Err(CodecError::NormOutOfRange { .. })
    ));
    for bits in [0u8, 9] {
        assert!(matches!(
            TqMse::new(MseSpec::new(64, bits, 1)),
            Err(CodecError::UnsupportedBits { .. })
        ));
    }
    for bits in [1u8, 10] {
        assert!(matches!(
            TqProd::new(ProdSpec::orthogonal(64, bits, 1)),
            Err(CodecError::UnsupportedBits { .. })
        ));
    }
    let mut spec = ProdSpec::orthogonal(64, 4, 1);
    spec.sketch.dim = 32;
    assert!(matches!(
        TqProd::new(spec),
        Err(CodecError::InvalidConfig(_))
    ));
    let mut spec = MseSpec::new(64, 4, 1);
    spec.norm_correction = true;
    assert!(matches!(
        DebiasedMse::new(spec),
        Err(CodecError::InvalidConfig(_))
    ));
    let prod = TqProd::new(ProdSpec::paper(64, 4, 1)).unwrap();
    assert!(matches!(
        prod.encode(&[f32::NAN; 64]),
        Err(CodecError::NonFinite { index: 0, .. })
    ));
}

#[test]
fn zero_and_subnormal_vectors_decode_to_true_zero() {
    for x in [vec![0.0f32; 96], vec![1e-12f32; 96]] {
        let mse = TqMse::new(MseSpec::new(96, 3, 2)).unwrap();
        let code = mse.encode(&x).unwrap();
        assert_eq!(code.norm, f16::ZERO);
        assert!(mse.decode(&code).unwrap().iter().all(|&v| v == 0.0));
        let prod = TqProd::new(ProdSpec::orthogonal(96, 3, 2)).unwrap();
        let code = prod.encode(&x).unwrap();
        assert_eq!(code.gamma, f16::ZERO);
        assert!(prod.decode(&code).unwrap().iter().all(|&v| v == 0.0));
    }
}

fn vector(dim: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-50.0f32..50.0, dim)
}

proptest! {
    #![proptest_config(config(64))]

    /// With norm correction the decoded vector keeps the input's norm, up to the f16 rounding
    /// of the stored scale (relative 2^-11) and f32 arithmetic.
    #[test]
    fn norm_correction_preserves_the_norm(
        x in vector(128),
        bits in 1u8..=8,
        seed in any::<u64>(),
        kind in prop_oneof![Just(RotationKind::Haar), Just(RotationKind::Hadamard)],
    ) {
        let n: f32 = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        prop_assume!(n > 1e-3);
        let codec = TqMse::new(MseSpec { dim: 128, bits, rotation: kind, seed, norm_correction: true }).unwrap();
        let decoded = codec.decode(&codec.encode(&x).unwrap()).unwrap();
        let m: f32 = decoded.iter().map(|v| v * v).sum::<f32>().sqrt();
        prop_assert!(((m - n) / n).abs() < 2.0f32.powi(-11) + 1e-5, "norm {n} decoded {m}");
    }

    /// Same spec and input: bit-identical codes, also from a codec rebuilt from the spec, and
    /// decoding what was encoded twice gives the same floats.
    #[test]
    fn codes_are_a_pure_function_of_spec_and_input(x in vector(64), seed in any::<u64>(), bits in 2u8..=9) {
        let spec = ProdSpec::orthogonal(64, bits, seed);
        let a = TqProd::new(spec).unwrap().encode(&x).unwrap();
        let b = TqProd::new(spec).unwrap().encode(&x).unwrap();
        prop_assert_eq!(&a, &b);
        let mse = MseSpec { dim: 64, bits: bits.min(8), rotation: RotationKind::Haar, seed, norm_correction: false };
        let c = TqMse::new(mse).unwrap().encode(&x).unwrap();
        let d = TqMse::new(mse).unwrap().encode(&x).unwrap();
        prop_assert_eq!(c, d);
    }

    /// TQ_prod's decode is the MSE stage plus the QJL reconstruction. With Haar S and the
    /// asymptotic scale, ‖r̂‖ = √(π/2)·γ exactly for every draw (rotations preserve it), so the
    /// decoded vector must differ from the MSE stage's by exactly that length.
    #[test]
    fn prod_decode_is_mse_part_plus_sketch(x in vector(64), seed in any::<u64>(), bits in 2u8..=9) {
        let spec = ProdSpec::orthogonal(64, bits, seed).scale(tq_qjl::SketchScale::Asymptotic);
        let codec = TqProd::new(spec).unwrap();
        let code = codec.encode(&x).unwrap();
        let mse_only = codec.mse().decode(&code.mse).unwrap();
        let full = codec.decode(&code).unwrap();
        let diff: f32 = mse_only.iter().zip(&full).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        let expected = std::f32::consts::FRAC_PI_2.sqrt() * code.gamma.to_f32();
        prop_assert!((diff - expected).abs() <= 1e-4 * expected + 1e-4, "diff {diff} expected {expected}");
    }
}
