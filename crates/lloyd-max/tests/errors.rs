//! Bad input gives typed errors, never panics.

use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook, LloydMaxError};

#[test]
fn unsupported_bit_widths() {
    for bits in [0u8, 9, 255] {
        assert_eq!(
            LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 64 }, bits),
            Err(LloydMaxError::UnsupportedBits { bits })
        );
    }
}

#[test]
fn dimensions_below_each_laws_minimum() {
    for dim in [0, 1, 2] {
        assert_eq!(
            LloydMaxCodebook::new(CoordinateDistribution::Beta { dim }, 2),
            Err(LloydMaxError::DimensionTooSmall {
                law: "beta",
                dim,
                min: 3
            })
        );
    }
    assert_eq!(
        LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim: 0 }, 2),
        Err(LloydMaxError::DimensionTooSmall {
            law: "gaussian",
            dim: 0,
            min: 1
        })
    );
    // The smallest valid dimensions work.
    assert!(LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 3 }, 2).is_ok());
    assert!(LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim: 1 }, 2).is_ok());
}

#[test]
fn density_helpers_reject_invalid_input() {
    let bad = CoordinateDistribution::Beta { dim: 2 };
    assert!(matches!(
        bad.cdf(0.0),
        Err(LloydMaxError::DimensionTooSmall { .. })
    ));
    assert!(matches!(
        bad.pdf(0.0),
        Err(LloydMaxError::DimensionTooSmall { .. })
    ));
    let good = CoordinateDistribution::Gaussian { dim: 4 };
    assert_eq!(good.cdf(f64::NAN), Err(LloydMaxError::NanArgument));
    assert_eq!(good.survival(f64::NAN), Err(LloydMaxError::NanArgument));
    assert_eq!(
        good.partial_mean(0.0, f64::NAN),
        Err(LloydMaxError::NanArgument)
    );
    assert_eq!(good.pdf(f64::NAN), Err(LloydMaxError::NanArgument));
}

#[test]
fn length_mismatch() {
    let codebook =
        LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim: 16 }, 4).expect("solvable");
    let mut codes = vec![0u8; 3];
    assert_eq!(
        codebook.quantize_slice(&[0.1, 0.2], &mut codes),
        Err(LloydMaxError::LengthMismatch {
            expected: 2,
            actual: 3
        })
    );
    assert!(codebook.quantize_slice(&[], &mut []).is_ok());
}

#[test]
fn errors_display_their_context() {
    let message = LloydMaxError::UnsupportedBits { bits: 9 }.to_string();
    assert!(
        message.contains('9') && message.contains("1..=8"),
        "{message}"
    );
    let message = LloydMaxError::DimensionTooSmall {
        law: "beta",
        dim: 2,
        min: 3,
    }
    .to_string();
    assert!(
        message.contains("beta") && message.contains('2') && message.contains('3'),
        "{message}"
    );
}
