//! Deterministic seeds for every rotation and sketch of a model.
//!
//! A model has one rotation (and, for `prod`, one sketch) per layer, KV head, stream and tier.
//! They must be independent of each other, and the same allocation must always give the same
//! ones (a saved cache records the seeds, and reloading must rebuild identical matrices). Both
//! follow from deriving each seed as a hash of its coordinates:
//!
//! ```text
//! h = allocation seed
//! for w in [layer, kv_head, stream (key 0, value 1), tier (whole 0, outlier 1, rest 2),
//!           role (rotation 0, sketch 1)]:
//!     h = splitmix64(h XOR w)
//! seed = h
//! ```
//!
//! `splitmix64` is Vigna's finalizer (the output function of `SplitMix64`): a bijection of `u64`
//! with full avalanche, so neighbouring coordinates give unrelated seeds, and two coordinate
//! tuples that differ only in their last word can never collide.

use crate::allocation::plan::StreamKind;

/// Which tier of a stream a seed is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// A stream stored as one tier (no outlier split).
    Whole = 0,
    /// The outlier channels of a two-tier stream.
    Outlier = 1,
    /// The remaining channels of a two-tier stream.
    Rest = 2,
}

/// Which random object of a tier a seed is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SeedRole {
    /// The rotation Π of the MSE stage.
    Rotation = 0,
    /// The QJL sketch matrix S of `prod`.
    Sketch = 1,
}

/// The SplitMix64 output function (Steele, Lea & Flood 2014; constants by Vigna).
///
/// ```
/// use tq_cache::allocation::splitmix64;
/// assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
/// ```
pub const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one rotation or sketch, derived as the module docs describe.
///
/// ```
/// use tq_cache::allocation::{derive_seed, SeedRole, StreamKind, Tier};
/// let a = derive_seed(1, 0, 0, StreamKind::Key, Tier::Whole, SeedRole::Rotation);
/// let b = derive_seed(1, 0, 1, StreamKind::Key, Tier::Whole, SeedRole::Rotation);
/// assert_ne!(a, b); // another KV head, an independent rotation
/// assert_eq!(a, derive_seed(1, 0, 0, StreamKind::Key, Tier::Whole, SeedRole::Rotation));
/// ```
pub fn derive_seed(
    base: u64,
    layer: usize,
    kv_head: usize,
    stream: StreamKind,
    tier: Tier,
    role: SeedRole,
) -> u64 {
    [
        layer as u64,
        kv_head as u64,
        stream as u64,
        tier as u64,
        role as u64,
    ]
    .into_iter()
    .fold(base, |h, word| splitmix64(h ^ word))
}
