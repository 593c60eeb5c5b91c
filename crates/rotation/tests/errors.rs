//! Bad input is a typed error, never a panic: zero or oversized dimensions, wrong vector
//! lengths, and batches that are not a whole number of vectors.

use tq_rotation::{Rotation, RotationError, RotationKind, RotationSpec};

const KINDS: [RotationKind; 2] = [RotationKind::Haar, RotationKind::Hadamard];

#[test]
fn zero_dimension_is_rejected() {
    for kind in KINDS {
        assert_eq!(
            Rotation::new(kind, 0, 1).unwrap_err(),
            RotationError::ZeroDimension
        );
        let spec = RotationSpec {
            kind,
            dim: 0,
            seed: 1,
        };
        assert_eq!(spec.build().unwrap_err(), RotationError::ZeroDimension);
    }
}

/// Rejected before anything is allocated (a Haar matrix of 8193² would take 1 GiB).
#[test]
fn oversized_dimension_is_rejected() {
    for kind in KINDS {
        let dim = kind.max_dim() + 1;
        assert_eq!(
            Rotation::new(kind, dim, 1).unwrap_err(),
            RotationError::DimensionTooLarge {
                kind,
                dim,
                max: kind.max_dim()
            }
        );
    }
    assert_eq!(RotationKind::Haar.max_dim(), 8192);
}

#[test]
fn wrong_vector_lengths_are_rejected() {
    for kind in KINDS {
        let rotation = Rotation::new(kind, 6, 3).unwrap();
        let mismatch = |actual| RotationError::DimensionMismatch {
            expected: 6,
            actual,
        };
        let (short, good, long) = ([0.0f32; 5], [1.0f32; 6], [0.0f32; 7]);
        let (mut out_short, mut out_good, mut out_long) = ([0.0f32; 5], [0.0f32; 6], [0.0f32; 7]);
        assert_eq!(
            rotation.apply(&short, &mut out_good).unwrap_err(),
            mismatch(5)
        );
        assert_eq!(
            rotation.apply(&long, &mut out_good).unwrap_err(),
            mismatch(7)
        );
        assert_eq!(
            rotation.apply(&good, &mut out_short).unwrap_err(),
            mismatch(5)
        );
        assert_eq!(
            rotation.apply(&good, &mut out_long).unwrap_err(),
            mismatch(7)
        );
        assert_eq!(
            rotation.apply_inverse(&short, &mut out_good).unwrap_err(),
            mismatch(5)
        );
        assert_eq!(
            rotation.apply_inverse(&good, &mut out_long).unwrap_err(),
            mismatch(7)
        );
        assert_eq!(rotation.apply(&[], &mut []).unwrap_err(), mismatch(0));
        // A rejected call leaves the output untouched.
        assert_eq!(out_good, [0.0f32; 6]);
        rotation.apply(&good, &mut out_good).unwrap();
    }
}

#[test]
fn malformed_batches_are_rejected() {
    for kind in KINDS {
        let rotation = Rotation::new(kind, 4, 3).unwrap();
        let inputs = [1.0f32; 10];
        let mut outputs = [0.0f32; 10];
        let not_whole = RotationError::BatchLength { len: 10, dim: 4 };
        assert_eq!(
            rotation.apply_batch(&inputs, &mut outputs).unwrap_err(),
            not_whole
        );
        assert_eq!(
            rotation
                .apply_inverse_batch(&inputs, &mut outputs)
                .unwrap_err(),
            not_whole
        );

        let inputs = [1.0f32; 8];
        for out_len in [4usize, 7, 12] {
            let mut outputs = vec![0.0f32; out_len];
            let mismatch = RotationError::DimensionMismatch {
                expected: 8,
                actual: out_len,
            };
            assert_eq!(
                rotation.apply_batch(&inputs, &mut outputs).unwrap_err(),
                mismatch
            );
            assert_eq!(
                rotation
                    .apply_inverse_batch(&inputs, &mut outputs)
                    .unwrap_err(),
                mismatch
            );
            assert!(outputs.iter().all(|&v| v == 0.0));
        }
    }
}

/// The messages name the numbers involved, so a caller's log says what went wrong.
#[test]
fn error_messages_name_the_lengths() {
    let message = RotationError::DimensionMismatch {
        expected: 128,
        actual: 127,
    }
    .to_string();
    assert!(
        message.contains("128") && message.contains("127"),
        "{message}"
    );
    let message = RotationError::BatchLength { len: 10, dim: 4 }.to_string();
    assert!(message.contains("10") && message.contains('4'), "{message}");
}
