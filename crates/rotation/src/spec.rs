//! What identifies a rotation: its kind, dimension and seed.

use serde::{Deserialize, Serialize};

use crate::{Rotation, RotationError};

/// Which family a [`Rotation`] is drawn from.
///
/// Serialized in lowercase (`"haar"`, `"hadamard"`).
///
/// ```
/// use tq_rotation::RotationKind;
/// assert_eq!(serde_json::to_string(&RotationKind::Hadamard).unwrap(), "\"hadamard\"");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RotationKind {
    /// A Haar-distributed (uniform) orthogonal matrix: dense, O(d²) per vector.
    Haar,
    /// A randomized Walsh–Hadamard transform: O(d log d) per vector, O(d) memory.
    Hadamard,
}

impl RotationKind {
    /// The largest dimension [`Rotation::new`] accepts for this kind.
    ///
    /// Haar rotations store three dense d×d matrices (16·d² bytes), so they stop at 8192
    /// (1 GiB); Hadamard rotations store a few length-d vectors and stop at 2²⁴, where
    /// [`Rotation::to_dense_f64`] would still index without overflow.
    pub const fn max_dim(self) -> usize {
        match self {
            RotationKind::Haar => 8192,
            RotationKind::Hadamard => 1 << 24,
        }
    }
}

/// The recipe of a rotation: a [`Rotation`] is a pure function of these three fields.
///
/// A saved cache records the spec, never the matrix, and rebuilds the rotation with
/// [`RotationSpec::build`].
///
/// ```
/// use tq_rotation::{Rotation, RotationKind, RotationSpec};
/// let spec = RotationSpec { kind: RotationKind::Haar, dim: 8, seed: 42 };
/// let json = serde_json::to_string(&spec).unwrap();
/// assert_eq!(json, r#"{"kind":"haar","dim":8,"seed":42}"#);
/// let again: RotationSpec = serde_json::from_str(&json).unwrap();
/// let rotation: Rotation = again.build().unwrap();
/// assert_eq!(rotation.spec(), spec);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RotationSpec {
    /// The family the rotation is drawn from.
    pub kind: RotationKind,
    /// The dimension d of the vectors it rotates.
    pub dim: usize,
    /// The seed of the `ChaCha20Rng` every random choice is drawn from.
    pub seed: u64,
}

impl RotationSpec {
    /// Builds the rotation this spec describes; same as [`Rotation::new`].
    ///
    /// # Errors
    /// [`RotationError::ZeroDimension`] if `dim` is 0, [`RotationError::DimensionTooLarge`]
    /// if it exceeds [`RotationKind::max_dim`].
    pub fn build(&self) -> Result<Rotation, RotationError> {
        Rotation::new(self.kind, self.dim, self.seed)
    }
}
