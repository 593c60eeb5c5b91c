//! A data-aware basis: the principal components of a stream's first batch (or its RoPE planes,
//! weighed by the queries), bits per component by reverse water-filling, the random rotation
//! applied inside each equal-bit group.
//!
//! # Why
//!
//! TurboQuant's random rotation makes every coordinate look alike, so every coordinate gets the
//! same bits. Real keys are far from isotropic: a few directions (low RoPE frequencies, the
//! residual mean) hold most of the energy. For a Gaussian source with component variances
//! `λ_i` the rate-distortion optimum gives each component `max(0, ½·log₂(λ_i/θ))` bits
//! (reverse water-filling); with equal bits the error is the *arithmetic* mean of the `λ_i`
//! times `4^−b`, with water-filling (all `λ_i > θ`) the *geometric* mean. The gap — several
//! dB on real keys, in-sample — is what this lever aims at (what survives estimation from a
//! prefix is another matter: see "Measured" below).
//!
//! # The codec ([`BasisCodec`])
//!
//! A stream stores `u = x/‖x‖` quantized, with the norm as f16, exactly like `TQ_mse(b)`:
//! 1. `y = Uᵀ·u`, `U` the top `r` eigenvectors (as rows, f16) of `E[u·uᵀ]` over the first
//!    batch (centered if the stream is), ordered by eigenvalue `λ_i` (descending).
//! 2. Components `[0, r)` split into groups of equal bits `β_G` (descending), chosen by
//!    [`allocate_bits`]; components past `r` get 0 bits (they decode as zero).
//! 3. In group `G`: `z = Π_G·y_G / a_G` with `Π_G` a seeded random rotation of the group's
//!    dimension and `a_G = √(d·λ̄_G)` (`λ̄_G` the group's mean eigenvalue), so `z`'s coordinates
//!    have the variance `1/d` of a rotated unit vector's and the same Lloyd-Max codebook
//!    (`Beta{d}`, `β_G` bits) quantizes them.
//!
//! Decoding is `x̃ = ‖x‖ · Σ_G U_Gᵀ·Π_Gᵀ·(a_G·c[codes_G])`. Scoring never decodes: the query is
//! projected once (`p = U·q`), each group's slice rotated and multiplied by `a_G` — the scales
//! are folded into the query — and the look-up kernel scores each group's packed codes against
//! it, as it scores the tiers of a two-tier record.
//!
//! Groups are packed one after another, each starting on a word boundary, so every group is an
//! ordinary packed run the kernels read. The allocation keeps every group but the last a whole
//! number of words and the record within `words_for(d, b)`: a basis stream costs exactly the
//! bytes per token of the `TQ_mse(b)` stream it replaces.
//!
//! # When it reduces to the plain codec
//!
//! If the allocation gives every component the stream's `b` bits (one group, `r = d`), the
//! basis adds nothing (`Π·Uᵀ` is just another rotation) and the stream stores no basis: it is
//! today's `TQ_mse(b)`, record for record ([`BasisFit::Identity`]). Nearly isotropic data ends
//! there, and so does a first batch with fewer than `head_dim` tokens ([`min_basis_tokens`]):
//! its second-moment matrix is rank-deficient, and a basis fitted to it would give 0 bits to
//! every direction the batch did not happen to span.
//!
//! # Cost
//!
//! Stored once per stream: `r·d` f16 basis rows, and per group an f32 scale and its length and
//! bits (4 bytes): [`FittedBasis::bytes`]. At `d = 64`, `r = 64` that is 8 KiB per stream —
//! `16·r/N` bits per value of the stream over `N` tokens (0.5 at 2K, 0.125 at 8K), so it can
//! only pay at long contexts; the accounting shows it
//! ([`Stream::fixed_bytes`](crate::stream::Stream::fixed_bytes)). The codec's widened f32 copy
//! of the rows is working state, like a rotation's matrices, and not counted.
//!
//! # Measured
//!
//! On SmolLM2 (ctx 2048) the lever does not pay, and fitted on a short prefix it hurts badly:
//! post-RoPE keys turn, pair by pair, with the position, so the directions a 256-token prefix
//! fills are not the ones later tokens fill (KL divergence 0.52 against 0.050 without the basis;
//! fitted in-sample on the whole chunk, 0.040 against 0.047 for 0.25 more bits per value). The
//! figures and the reasoning are in `crates/cache/presets/README.md` ("Data-aware basis"); no
//! preset uses it.
//!
//! # The plane basis
//!
//! [`BasisPolicy::Planes`] (`basis = "planes"`, keys only) is the variant that does pay: a
//! basis of whole RoPE planes ([`RopePairs`], stated by the model), bits water-filled on the
//! product of each plane's key and query energy over the first batch — the queries come with
//! the write-then-attend entry point — and the same groups, rotations and folded scales. A
//! plane's energy does not move with the position, and the queries' weights put the bits where
//! the scores read them. Its basis is a coordinate list ([`FittedBasis::components`]), about
//! 160 bytes per stream. On SmolLM2 it takes `rec4.25`'s KL divergence from 0.050 to 0.042 at
//! the same bits ([`fit_planes`] has the argument; the figures are in
//! `crates/cache/presets/README.md`).
//!
//! The eigen-decomposition is nalgebra's symmetric QR algorithm in f64 (a well-tested
//! implementation, and deterministic: the same batch gives the same basis bits on every
//! machine and thread count).

use std::sync::Arc;

use half::f16;
use serde::{Deserialize, Serialize};
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
use tq_rotation::Rotation;

use crate::codec::packing::words_for;
use crate::codec::{CodecError, CodecScratch, MseSpec};
use crate::error::CacheError;

/// The fewest non-zero tokens a first batch needs for a basis to be fitted: the head dimension
/// (see the [module docs](self)). Shorter batches leave the stream on the plain codec
/// ([`BasisFit::Identity`]).
pub const fn min_basis_tokens(head_dim: usize) -> usize {
    head_dim
}

/// Whether a stream fits a data-aware basis; the TOML spelling (`basis = "…"`) in parentheses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BasisPolicy {
    /// The random rotation alone (`none`).
    #[default]
    None,
    /// PCA of the first batch with water-filled bits (`pca`).
    Pca,
    /// The model's RoPE planes, bits water-filled on the product of the key and query energy
    /// of each plane over the first batch (`planes`; see [`fit_planes`]).
    Planes,
}

impl BasisPolicy {
    /// Whether the stream fits a basis from its first batch (either kind).
    pub fn fits_basis(self) -> bool {
        !matches!(self, BasisPolicy::None)
    }

    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BasisPolicy::None => "none",
            BasisPolicy::Pca => "pca",
            BasisPolicy::Planes => "planes",
        }
    }
}

impl std::fmt::Display for BasisPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The widths a basis may give its groups: a set of bit counts in `1..=8` (default: all of
/// them). `basis_bits = [4, 2, 1]` in an allocation keeps a basis record in whole nibbles,
/// the widths the fast-scan order holds without bit planes
/// ([`body_order`](crate::stream::body_order)). Written as a list, widest first.
///
/// ```
/// use tq_cache::basis::GroupWidths;
/// let nibbles = GroupWidths::new(&[1, 2, 4]).unwrap();
/// assert_eq!(nibbles, GroupWidths::NIBBLES);
/// assert!(nibbles.contains(2) && !nibbles.contains(3));
/// assert_eq!(nibbles.to_vec(), vec![4, 2, 1]);
/// assert!(GroupWidths::new(&[]).is_err() && GroupWidths::new(&[9]).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupWidths(u16);

impl GroupWidths {
    /// Every width, 1 to 8 bits.
    pub const ALL: Self = Self(0x1FE);
    /// The widths whose codes fill whole nibbles: 4, 2 and 1 bits.
    pub const NIBBLES: Self = Self((1 << 4) | (1 << 2) | (1 << 1));

    /// The set of `widths`; an error names a width outside `1..=8` or an empty list.
    pub fn new(widths: &[u8]) -> Result<Self, String> {
        if widths.is_empty() {
            return Err("basis_bits: at least one width".into());
        }
        widths.iter().try_fold(Self(0), |set, &b| {
            if (1..=8).contains(&b) {
                Ok(Self(set.0 | 1 << b))
            } else {
                Err(format!("basis_bits: widths are 1 to 8 bits, not {b}"))
            }
        })
    }

    /// Whether `bits` is in the set.
    pub fn contains(self, bits: u8) -> bool {
        bits < 16 && self.0 & (1 << bits) != 0
    }

    /// The widths, widest first.
    pub fn to_vec(self) -> Vec<u8> {
        (1..=8u8).rev().filter(|&b| self.contains(b)).collect()
    }
}

impl Default for GroupWidths {
    fn default() -> Self {
        Self::ALL
    }
}

impl Serialize for GroupWidths {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_vec().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for GroupWidths {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let widths = Vec::<u8>::deserialize(deserializer)?;
        Self::new(&widths).map_err(serde::de::Error::custom)
    }
}

/// One group of components with equal bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BasisGroup {
    /// Components in the group (consecutive, after the previous group's).
    pub len: usize,
    /// Bits per component, `1..=8`.
    pub bits: u8,
}

/// What a basis stream decided from its first batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fit", rename_all = "kebab-case")]
pub enum BasisFit {
    /// No basis: the stream is the plain codec (one group at the stream's bits, or a first
    /// batch too short to estimate a basis).
    Identity,
    /// A fitted principal-component basis.
    Pca(FittedBasis),
    /// A fitted plane basis (its components are coordinates: `rows` is empty and
    /// `components` names them).
    Planes(FittedBasis),
}

impl BasisFit {
    /// The fitted basis, if any.
    pub fn fitted(&self) -> Option<&FittedBasis> {
        match self {
            BasisFit::Identity => None,
            BasisFit::Pca(fit) | BasisFit::Planes(fit) => Some(fit),
        }
    }

    /// Whether this fit can come from `policy` (a saved stream must not pair a basis with
    /// the wrong policy).
    pub fn is_from(&self, policy: BasisPolicy) -> bool {
        match self {
            BasisFit::Identity => policy.fits_basis(),
            BasisFit::Pca(_) => policy == BasisPolicy::Pca,
            BasisFit::Planes(_) => policy == BasisPolicy::Planes,
        }
    }
}

/// Which key coordinates a model's rotary position embedding turns together: the planes of
/// [`fit_planes`]. A plane's energy does not depend on the position (the rotation keeps it),
/// which is what lets a plane basis fitted on a prefix hold for later tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RopePairs {
    /// `(2i, 2i+1)`: GGUF's "normal" RoPE with permuted Q/K weights (Llama, SmolLM2).
    #[default]
    Adjacent,
    /// `(i, i + d/2)`: the NeoX layout (Gemma 3).
    Halves,
}

impl RopePairs {
    /// The two coordinates of plane `p` of a `d`-dimensional head (`p < d/2`).
    pub fn plane(self, p: usize, d: usize) -> [usize; 2] {
        match self {
            RopePairs::Adjacent => [2 * p, 2 * p + 1],
            RopePairs::Halves => [p, p + d / 2],
        }
    }
}

/// A fitted basis as stored: exactly what a saved cache records (integers, so it reloads bit
/// for bit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FittedBasis {
    /// The `r` basis rows (`r·d` f16 bit patterns, row-major), by descending eigenvalue.
    pub rows: Vec<u16>,
    /// The groups, by descending bits; their lengths sum to `r`.
    pub groups: Vec<BasisGroup>,
    /// `a_G` per group (f32 bit patterns).
    pub scales: Vec<u32>,
    /// A plane basis: the coordinate each of the `r` components is (`rows` is then empty);
    /// empty for a principal-component basis.
    #[serde(default)]
    pub components: Vec<u16>,
}

impl FittedBasis {
    /// Bytes stored once for this basis: `2·r·d` for the f16 rows of a principal-component
    /// basis or `2·r` for the component indices of a plane basis, and 8 per group (the f32
    /// scale, and its length and bits as they are saved: a `u16` and a byte, padded to 4).
    pub fn bytes(&self) -> usize {
        2 * self.rows.len()
            + 2 * self.components.len()
            + 4 * self.scales.len()
            + 4 * self.groups.len()
    }

    /// [`bytes`](Self::bytes) measured from the buffers' capacities (equal to it for a fit
    /// built by [`fit_basis`] or deserialized, whose buffers are exact). The codec built from
    /// a fit keeps a widened f32 copy of the rows for its arithmetic: like a codec's rotation
    /// and codebook, that is working state derived from the stored basis, not cache bytes.
    pub fn allocated_bytes(&self) -> usize {
        2 * self.rows.capacity()
            + 2 * self.components.capacity()
            + 4 * self.scales.capacity()
            + 4 * self.groups.capacity()
    }

    /// Components kept (`r`).
    pub fn rank(&self) -> usize {
        self.groups.iter().map(|g| g.len).sum()
    }

    /// Drops spare capacity (a deserialized fit may have grown its buffers by doubling), so
    /// [`allocated_bytes`](Self::allocated_bytes) is [`bytes`](Self::bytes).
    pub fn shrink_to_fit(&mut self) {
        self.rows.shrink_to_fit();
        self.components.shrink_to_fit();
        self.groups.shrink_to_fit();
        self.scales.shrink_to_fit();
    }
}

/// `D(β)`: the expected squared error of a unit-variance Gaussian-like coordinate quantized
/// with `β` bits by the `Beta{d}` Lloyd-Max codebook (`D(0) = 1`: the component is dropped).
///
/// Errors: the codebook cannot be built for this `d`.
pub fn distortion_table(head_dim: usize) -> Result<[f64; 9], CodecError> {
    let mut table = [1.0; 9];
    for (bits, slot) in table.iter_mut().enumerate().skip(1) {
        *slot =
            LloydMaxCodebook::cached(CoordinateDistribution::Beta { dim: head_dim }, bits as u8)?
                .unit_vector_distortion();
    }
    Ok(table)
}

/// Integer reverse water-filling under the packing constraint: bits per component for the
/// variances `variances` (sorted descending) within `words` packed `u32` words.
///
/// Minimizes `Σ_i λ_i·D(b_i)` (`D` = `distortion`, indexed by bits, `D[0] = 1`) over groups
/// of consecutive components with strictly decreasing bits `8 ≥ β_1 > β_2 > … ≥ 1`, every
/// group but the last a whole number of words (`len·β ≡ 0 mod 32`), all of them within
/// `words`; components after the last group get 0 bits. A dynamic program over (component,
/// words used, last bits): exact for this family, and deterministic (ties keep the earlier
/// candidate in a fixed order).
///
/// ```
/// use tq_cache::basis::{allocate_bits, BasisGroup};
/// let d = [1.0, 0.36, 0.12, 0.035, 0.0095, 0.0025, 6.4e-4, 1.6e-4, 4.1e-5];
/// // Equal variances: every component gets the average bits.
/// let flat = vec![1.0; 64];
/// assert_eq!(allocate_bits(&flat, 8, &d), vec![BasisGroup { len: 64, bits: 4 }]);
/// // Half the energy in 8 components: they get more bits, the quiet tail fewer.
/// let mut skewed = vec![0.01; 64];
/// skewed[..8].fill(1.0);
/// let groups = allocate_bits(&skewed, 8, &d);
/// assert!(groups[0].bits > 4 && groups.len() > 1);
/// ```
pub fn allocate_bits(variances: &[f64], words: usize, distortion: &[f64; 9]) -> Vec<BasisGroup> {
    allocate_bits_within(variances, words, distortion, GroupWidths::ALL)
}

/// [`allocate_bits`] with every group's width in `widths` (the same dynamic program over
/// those widths only).
///
/// ```
/// use tq_cache::basis::{allocate_bits_within, BasisGroup, GroupWidths};
/// let d = [1.0, 0.36, 0.12, 0.035, 0.0095, 0.0025, 6.4e-4, 1.6e-4, 4.1e-5];
/// let mut skewed = vec![0.01; 64];
/// skewed[..16].fill(1.0);
/// // 3 bits on average in 6 words: no group of 3, 5 or more bits.
/// let groups = allocate_bits_within(&skewed, 6, &d, GroupWidths::NIBBLES);
/// assert!(groups.iter().all(|g| matches!(g.bits, 1 | 2 | 4)));
/// assert!(groups.iter().map(|g| g.len * usize::from(g.bits)).sum::<usize>() <= 6 * 32);
/// ```
pub fn allocate_bits_within(
    variances: &[f64],
    words: usize,
    distortion: &[f64; 9],
    widths: GroupWidths,
) -> Vec<BasisGroup> {
    let d = variances.len();
    let mut prefix = vec![0.0f64; d + 1];
    for (i, &v) in variances.iter().enumerate() {
        prefix[i + 1] = prefix[i] + v.max(0.0);
    }
    let span = |a: usize, b: usize| prefix[b] - prefix[a];
    // State (pos, used words, last bits 0..=9 where 9 = no group yet).
    const LEVELS: usize = 10;
    let index = |pos: usize, used: usize, last: usize| (pos * (words + 1) + used) * LEVELS + last;
    let states = (d + 1) * (words + 1) * LEVELS;
    let mut best = vec![f64::INFINITY; states];
    // Back-pointer: the previous state and the group that led here.
    let mut from = vec![(usize::MAX, BasisGroup { len: 0, bits: 0 }); states];
    best[index(0, 0, 9)] = 0.0;
    let mut answer = (f64::INFINITY, usize::MAX, None::<BasisGroup>);
    for pos in 0..=d {
        for used in 0..=words {
            for last in (0..LEVELS).rev() {
                let here = index(pos, used, last);
                let cost = best[here];
                if !cost.is_finite() {
                    continue;
                }
                // End here: the rest gets 0 bits.
                let total = cost + span(pos, d);
                if total < answer.0 {
                    answer = (total, here, None);
                }
                if pos == d {
                    continue;
                }
                for bits in (1..last.min(9)).rev() {
                    let b = bits as u8;
                    if !widths.contains(b) {
                        continue;
                    }
                    // A final group: as long as the remaining words allow (longer is better,
                    // since D(β) < 1).
                    let room = (words - used) * 32 / bits;
                    let len = room.min(d - pos);
                    if len > 0 {
                        let total =
                            cost + span(pos, pos + len) * distortion[bits] + span(pos + len, d);
                        if total < answer.0 {
                            answer = (total, here, Some(BasisGroup { len, bits: b }));
                        }
                    }
                    // A whole-word group that others may follow.
                    let unit = 32 / gcd(bits, 32);
                    let mut len = unit;
                    while pos + len < d && used + len * bits / 32 <= words {
                        let next = index(pos + len, used + len * bits / 32, bits);
                        let total = cost + span(pos, pos + len) * distortion[bits];
                        if total < best[next] {
                            best[next] = total;
                            from[next] = (here, BasisGroup { len, bits: b });
                        }
                        len += unit;
                    }
                }
            }
        }
    }
    let (_, mut state, last) = answer;
    let mut groups: Vec<BasisGroup> = last.into_iter().collect();
    while state != index(0, 0, 9) && state != usize::MAX {
        let (previous, group) = from[state];
        groups.push(group);
        state = previous;
    }
    groups.reverse();
    groups
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Fits the plane basis of a stream (`basis = "planes"`) from its first batch `tokens`
/// (`[n, head_dim]`, in the stored domain: centered if the stream is) and the energy per
/// coordinate of the queries that batch was appended with (`query_energy`, `[head_dim]`: the
/// mean square of each query coordinate over the batch and the KV head's query heads), for a
/// `TQ_mse` stream of `bits` bits whose model turns the coordinate pairs `pairs` together.
///
/// # Why the queries
///
/// What a key's error costs is the error of its scores, `E[(q·e)²] = Σ_i E[q_i²]·E[e_i²]` for
/// errors uncorrelated across coordinates. A key codec that gives component `i` `b_i` bits
/// leaves `E[e_i²] ≈ λ_i·D(b_i)` (`λ_i` the key energy there), so the bits that minimize the
/// score error water-fill on `λ_i·E[q_i²]`, not on `λ_i` alone — and on this model the two
/// differ: the centered keys' energy is spread out, the queries' is not (on SmolLM2, over
/// the first 2048 tokens of GPL-3 at 5 bits, water-filling on the product predicts −3.1 dB of
/// score error against the plain rotation, on the key energy alone −0.6 dB).
///
/// # Why planes
///
/// RoPE turns each pair of coordinates by an angle that grows with the position, so the split
/// of a plane's energy between its two coordinates over a prefix says nothing about later
/// tokens (the principal-component basis fails there: `crates/cache/presets/README.md`),
/// while the plane's energy is the same at every position. Both coordinates of a plane are
/// given the plane's weight and placed next to each other, so the equal-bit groups hold
/// whole planes wherever the packing allows.
///
/// # The fit
///
/// Plane energies `κ_p` (mean of `u_i²` over the batch's unit vectors `u = x/‖x‖`, summed
/// over the plane) and `ρ_p` (the queries', summed over the plane); planes sorted by
/// `κ_p·ρ_p` (descending, ties by index); [`allocate_bits`] on those weights within the plain
/// record's words; each group's scale `a_G = √(d·mean κ_p/2)` over its coordinates. The basis
/// is a list of coordinates (`2·r` bytes), not rows.
///
/// Returns [`BasisFit::Identity`] (the plain codec) when the batch has fewer than `head_dim`
/// non-zero tokens, the queries carry no energy, or the allocation gives every coordinate
/// `bits` bits. Errors: an odd or ragged `head_dim`, `query_energy` of the wrong length
/// ([`CacheError::ShapeMismatch`]), a non-finite or negative value ([`CodecError::NonFinite`]),
/// bits outside `1..=8`.
///
/// ```
/// use tq_cache::basis::{fit_planes, BasisFit, RopePairs};
/// let d = 32;
/// // Keys spread over every plane; queries mostly in the plane (2, 3).
/// let keys: Vec<f32> = (0..64 * d).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
/// let mut query = vec![0.01; d];
/// query[2] = 1.0;
/// query[3] = 1.0;
/// let BasisFit::Planes(fit) = fit_planes(&keys, d, 4, RopePairs::Adjacent, &query)? else {
///     panic!("expected a plane basis");
/// };
/// // The plane the queries read comes first and gets the most bits.
/// assert_eq!(&fit.components[..2], &[2, 3]);
/// assert!(fit.groups[0].bits > 4);
/// # Ok::<(), tq_cache::CacheError>(())
/// ```
pub fn fit_planes(
    tokens: &[f32],
    head_dim: usize,
    bits: u8,
    pairs: RopePairs,
    query_energy: &[f64],
) -> Result<BasisFit, CacheError> {
    fit_planes_within(
        tokens,
        head_dim,
        bits,
        pairs,
        query_energy,
        GroupWidths::ALL,
    )
}

/// [`fit_planes`] with every group's width in `widths` ([`allocate_bits_within`]).
pub fn fit_planes_within(
    tokens: &[f32],
    head_dim: usize,
    bits: u8,
    pairs: RopePairs,
    query_energy: &[f64],
    widths: GroupWidths,
) -> Result<BasisFit, CacheError> {
    let d = head_dim;
    if d == 0
        || !d.is_multiple_of(2)
        || d > usize::from(u16::MAX) + 1
        || !tokens.len().is_multiple_of(d)
    {
        return Err(CacheError::ShapeMismatch {
            what: "first batch of a plane-basis stream (even head dimension up to 65536)",
            expected: tokens.len().next_multiple_of(d.max(2)),
            actual: tokens.len(),
        });
    }
    if query_energy.len() != d {
        return Err(CacheError::ShapeMismatch {
            what: "query energy per coordinate",
            expected: d,
            actual: query_energy.len(),
        });
    }
    check_batch(tokens, d, bits)?;
    if let Some(index) = query_energy.iter().position(|v| !v.is_finite() || *v < 0.0) {
        return Err(CacheError::Codec(CodecError::NonFinite {
            index,
            value: query_energy[index] as f32,
        }));
    }
    let mut energy = vec![0.0f64; d];
    let mut count = 0usize;
    for row in tokens.chunks_exact(d) {
        let norm2 = row
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>();
        if norm2 == 0.0 {
            continue;
        }
        for (e, &v) in energy.iter_mut().zip(row) {
            *e += f64::from(v) * f64::from(v) / norm2;
        }
        count += 1;
    }
    if count < min_basis_tokens(d) || query_energy.iter().all(|&q| q == 0.0) {
        return Ok(BasisFit::Identity);
    }
    let key: Vec<f64> = (0..d / 2)
        .map(|p| {
            let [a, b] = pairs.plane(p, d);
            (energy[a] + energy[b]) / count as f64
        })
        .collect();
    let query: Vec<f64> = (0..d / 2)
        .map(|p| {
            let [a, b] = pairs.plane(p, d);
            query_energy[a] + query_energy[b]
        })
        .collect();
    let weight = |p: usize| key[p] * query[p];
    let mut order: Vec<usize> = (0..d / 2).collect();
    order.sort_by(|&a, &b| weight(b).total_cmp(&weight(a)).then(a.cmp(&b)));
    let coordinates: Vec<usize> = order.iter().flat_map(|&p| pairs.plane(p, d)).collect();
    let weights: Vec<f64> = order.iter().flat_map(|&p| [weight(p); 2]).collect();
    let Some(groups) = allocate_groups(&weights, d, bits, widths)? else {
        return Ok(BasisFit::Identity);
    };
    let rank: usize = groups.iter().map(|g| g.len).sum();
    // Each coordinate holds half of its plane's key energy.
    let variances: Vec<f64> = order.iter().flat_map(|&p| [key[p] / 2.0; 2]).collect();
    let mut fit = FittedBasis {
        rows: Vec::new(),
        scales: group_scales(&groups, &variances, d),
        groups,
        // `d ≤ 65536` was checked, so every coordinate fits.
        components: coordinates[..rank].iter().map(|&c| c as u16).collect(),
    };
    fit.shrink_to_fit();
    Ok(BasisFit::Planes(fit))
}

/// Fits the basis of a stream from its first batch `tokens` (`[n, head_dim]` row-major, in the
/// stored domain: centered if the stream is) for a `TQ_mse` stream of `bits` bits.
///
/// Returns [`BasisFit::Identity`] when the batch has fewer than `head_dim` non-zero tokens or
/// the allocation gives every component `bits` bits; otherwise the fitted basis. Errors: a
/// ragged batch ([`CacheError::ShapeMismatch`]) or a non-finite value
/// ([`CodecError::NonFinite`]).
pub fn fit_basis(tokens: &[f32], head_dim: usize, bits: u8) -> Result<BasisFit, CacheError> {
    fit_basis_within(tokens, head_dim, bits, GroupWidths::ALL)
}

/// [`fit_basis`] with every group's width in `widths` ([`allocate_bits_within`]).
pub fn fit_basis_within(
    tokens: &[f32],
    head_dim: usize,
    bits: u8,
    widths: GroupWidths,
) -> Result<BasisFit, CacheError> {
    if head_dim == 0 || !tokens.len().is_multiple_of(head_dim) {
        return Err(CacheError::ShapeMismatch {
            what: "first batch of a basis stream",
            expected: tokens.len().next_multiple_of(head_dim.max(1)),
            actual: tokens.len(),
        });
    }
    let d = head_dim;
    check_batch(tokens, d, bits)?;
    // Second moment of the unit vectors u = x/‖x‖ (what the codec quantizes), in f64.
    let mut moment = nalgebra::DMatrix::<f64>::zeros(d, d);
    let mut count = 0usize;
    let mut unit = vec![0.0f64; d];
    for row in tokens.chunks_exact(d) {
        let norm = row
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        if norm == 0.0 {
            continue;
        }
        for (u, &v) in unit.iter_mut().zip(row) {
            *u = f64::from(v) / norm;
        }
        for j in 0..d {
            let uj = unit[j];
            for i in j..d {
                moment[(i, j)] += unit[i] * uj;
            }
        }
        count += 1;
    }
    if count < min_basis_tokens(d) {
        return Ok(BasisFit::Identity);
    }
    for j in 0..d {
        for i in j..d {
            let v = moment[(i, j)] / count as f64;
            moment[(i, j)] = v;
            moment[(j, i)] = v;
        }
    }
    let eigen = nalgebra::SymmetricEigen::new(moment);
    let mut order: Vec<usize> = (0..d).collect();
    order.sort_by(|&a, &b| {
        eigen.eigenvalues[b]
            .total_cmp(&eigen.eigenvalues[a])
            .then(a.cmp(&b))
    });
    let variances: Vec<f64> = order
        .iter()
        .map(|&i| eigen.eigenvalues[i].max(0.0))
        .collect();
    let Some(groups) = allocate_groups(&variances, d, bits, widths)? else {
        return Ok(BasisFit::Identity);
    };
    let rank: usize = groups.iter().map(|g| g.len).sum();
    let mut rows = Vec::with_capacity(rank * d);
    for &component in &order[..rank] {
        let vector = eigen.eigenvectors.column(component);
        // Eigenvectors are defined up to sign: make the largest entry positive (first on ties).
        let mut pivot = 0;
        for i in 1..d {
            if vector[i].abs() > vector[pivot].abs() {
                pivot = i;
            }
        }
        let sign = if vector[pivot] < 0.0 { -1.0 } else { 1.0 };
        rows.extend(vector.iter().map(|&v| f16::from_f64(sign * v).to_bits()));
    }
    let mut fit = FittedBasis {
        rows,
        scales: group_scales(&groups, &variances, d),
        groups,
        components: Vec::new(),
    };
    fit.shrink_to_fit();
    Ok(BasisFit::Pca(fit))
}

/// The checks both fits make on a first batch: finite values, bits the codec supports.
fn check_batch(tokens: &[f32], d: usize, bits: u8) -> Result<(), CacheError> {
    if let Some(index) = tokens.iter().position(|v| !v.is_finite()) {
        return Err(CacheError::Codec(CodecError::NonFinite {
            index: index % d,
            value: tokens[index],
        }));
    }
    if !(1..=8).contains(&bits) {
        return Err(CacheError::Codec(CodecError::UnsupportedBits {
            bits,
            supported: "1..=8",
        }));
    }
    Ok(())
}

/// [`allocate_bits_within`] on `weights` (sorted, descending) within the plain `bits`-bit
/// record's words and `widths`; `None` when it gives every coordinate `bits` bits, i.e. the
/// plain codec.
fn allocate_groups(
    weights: &[f64],
    d: usize,
    bits: u8,
    widths: GroupWidths,
) -> Result<Option<Vec<BasisGroup>>, CacheError> {
    let distortion = distortion_table(d)?;
    let groups = allocate_bits_within(weights, words_for(d, bits), &distortion, widths);
    Ok((groups != [BasisGroup { len: d, bits }]).then_some(groups))
}

/// Each group's scale `a_G = √(d·mean variance)` over its coordinates (`variances` in the
/// groups' order), as f32 bits.
fn group_scales(groups: &[BasisGroup], variances: &[f64], d: usize) -> Vec<u32> {
    let mut start = 0;
    groups
        .iter()
        .map(|group| {
            let mean = variances[start..start + group.len].iter().sum::<f64>() / group.len as f64;
            start += group.len;
            // A group of (numerically) zero variance still needs a positive, finite scale.
            let scale = (d as f64 * mean).sqrt().max(f64::from(f32::MIN_POSITIVE)) as f32;
            scale.to_bits()
        })
        .collect()
}

/// One group of a built [`BasisCodec`].
#[derive(Clone, Debug)]
pub struct GroupCodec {
    /// First component of the group.
    pub start: usize,
    /// Bits per component.
    pub bits: u8,
    /// `a_G`.
    pub scale: f32,
    /// `Π_G` (dimension = the group's length).
    pub rotation: Rotation,
    /// The `Beta{d}` codebook at `bits`.
    pub codebook: Arc<LloydMaxCodebook>,
    /// First word of the group's codes within a record.
    pub word_offset: usize,
    /// The group's component indices `start..start + len` (what the kernels gather a
    /// projected query from and scatter outputs to).
    pub components: Vec<u16>,
}

impl GroupCodec {
    /// Components in the group.
    pub fn len(&self) -> usize {
        self.components.len()
    }

    /// Whether the group is empty (never, for a built codec).
    pub fn is_empty(&self) -> bool {
        self.components.is_empty()
    }

    /// Packed words of the group's codes.
    pub fn words(&self) -> usize {
        words_for(self.len(), self.bits)
    }
}

/// The `TQ_mse` codec over a fitted basis (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct BasisCodec {
    spec: MseSpec,
    fit: FittedBasis,
    /// The basis rows widened to f32, `[r, d]`.
    rows: Vec<f32>,
    groups: Vec<GroupCodec>,
}

impl BasisCodec {
    /// Builds the codec of a `TQ_mse` stream `spec` over `fit`. Group `k`'s rotation has the
    /// stream's rotation kind and the seed `spec.seed + k`.
    ///
    /// Errors: groups that do not fit `words_for(d, b)` words or leave the head, rows that are
    /// not `r·d` finite values, scales that are not finite and positive
    /// ([`CodecError::InvalidConfig`]); bits outside `1..=8`.
    pub fn new(spec: MseSpec, fit: FittedBasis) -> Result<Self, CodecError> {
        if spec.norm_correction {
            return Err(CodecError::InvalidConfig(
                "a basis codec keeps the plain norm: norm_correction does not apply",
            ));
        }
        let d = spec.dim;
        let rank = fit.rank();
        let dense = fit.components.is_empty();
        if fit.groups.is_empty()
            || rank == 0
            || rank > d
            || d > usize::from(u16::MAX) + 1
            || fit.rows.len() != if dense { rank * d } else { 0 }
            || !(dense || fit.components.len() == rank)
            || fit.scales.len() != fit.groups.len()
        {
            return Err(CodecError::InvalidConfig(
                "a basis needs 1..=d components in groups, r·d rows or r coordinates, and a scale per group",
            ));
        }
        let rows: Vec<f32> = if dense {
            fit.rows
                .iter()
                .map(|&b| f16::from_bits(b).to_f32())
                .collect()
        } else {
            // A plane basis: unit rows at distinct coordinates (working state, like a
            // rotation's matrix; what is stored is the coordinate list).
            let mut seen = vec![false; d];
            let mut rows = vec![0.0f32; rank * d];
            for (row, &c) in rows.chunks_exact_mut(d).zip(&fit.components) {
                let c = usize::from(c);
                if c >= d || std::mem::replace(&mut seen[c], true) {
                    return Err(CodecError::InvalidConfig(
                        "a plane basis needs distinct coordinates below the head dimension",
                    ));
                }
                row[c] = 1.0;
            }
            rows
        };
        if rows.iter().any(|v| !v.is_finite()) {
            return Err(CodecError::InvalidConfig("a basis row is not finite"));
        }
        let mut groups = Vec::with_capacity(fit.groups.len());
        let (mut start, mut word) = (0usize, 0usize);
        for (k, (group, &scale)) in fit.groups.iter().zip(&fit.scales).enumerate() {
            let scale = f32::from_bits(scale);
            if !(1..=8).contains(&group.bits) {
                return Err(CodecError::UnsupportedBits {
                    bits: group.bits,
                    supported: "1..=8",
                });
            }
            if group.len == 0 || !scale.is_finite() || scale <= 0.0 {
                return Err(CodecError::InvalidConfig(
                    "a basis group needs components and a finite positive scale",
                ));
            }
            let last = k + 1 == fit.groups.len();
            if !last && !(group.len * usize::from(group.bits)).is_multiple_of(32) {
                return Err(CodecError::InvalidConfig(
                    "every basis group but the last must fill whole words",
                ));
            }
            groups.push(GroupCodec {
                start,
                bits: group.bits,
                scale,
                rotation: Rotation::new(
                    spec.rotation,
                    group.len,
                    spec.seed.wrapping_add(k as u64),
                )?,
                codebook: LloydMaxCodebook::cached(
                    CoordinateDistribution::Beta { dim: d },
                    group.bits,
                )?,
                word_offset: word,
                // `d ≤ 65536` was checked, so every index fits.
                components: (start..start + group.len).map(|i| i as u16).collect(),
            });
            start += group.len;
            word += words_for(group.len, group.bits);
        }
        if word > words_for(d, spec.bits) {
            return Err(CodecError::InvalidConfig(
                "the basis groups need more words than the stream's codec",
            ));
        }
        Ok(Self {
            spec,
            fit,
            rows,
            groups,
        })
    }

    /// The stream's `TQ_mse` spec (dimension, average bits, rotation kind, seed).
    pub fn spec(&self) -> MseSpec {
        self.spec
    }

    /// What the codec was built from (what a saved cache records).
    pub fn fit(&self) -> &FittedBasis {
        &self.fit
    }

    /// Head dimension `d`.
    pub fn dim(&self) -> usize {
        self.spec.dim
    }

    /// Components kept (`r`).
    pub fn rank(&self) -> usize {
        self.rows.len() / self.spec.dim
    }

    /// The basis rows `[r, d]` as f32.
    pub fn rows(&self) -> &[f32] {
        &self.rows
    }

    /// The groups, in record order.
    pub fn groups(&self) -> &[GroupCodec] {
        &self.groups
    }

    /// Words per record: `words_for(d, b)`, the plain codec's (unused tail words are zero).
    pub fn record_words(&self) -> usize {
        words_for(self.spec.dim, self.spec.bits)
    }

    /// `p = U·q` (`[r]`): the projection every score and every output goes through.
    pub fn project(&self, x: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.rows.chunks_exact(self.spec.dim)) {
            *o = crate::codec::dot(row, x);
        }
    }

    /// `x = Uᵀ·p`: adds the components `p` (`[r]`) back to `out` (`[d]`).
    pub fn add_back(&self, components: &[f32], out: &mut [f32]) {
        for (&p, row) in components.iter().zip(self.rows.chunks_exact(self.spec.dim)) {
            if p != 0.0 {
                for (o, &u) in out.iter_mut().zip(row) {
                    *o += p * u;
                }
            }
        }
    }

    /// Encodes `x` into `record` and returns the f16 norm. Allocation-free (uses `scratch`,
    /// built for dimension `d`).
    pub fn encode_into(
        &self,
        x: &[f32],
        scratch: &mut CodecScratch,
        record: &mut [u32],
    ) -> Result<f16, CodecError> {
        let d = self.spec.dim;
        let norm = crate::codec::checked_norm(x, d)?;
        scratch.check(d)?;
        if record.len() != self.record_words() {
            return Err(CodecError::LengthMismatch {
                what: "packed words",
                expected: self.record_words(),
                actual: record.len(),
            });
        }
        if norm > f16::MAX.to_f32() {
            return Err(CodecError::NormOutOfRange { norm });
        }
        let stored = f16::from_f32(norm);
        record.fill(0);
        if stored == f16::ZERO {
            return Ok(f16::ZERO);
        }
        let inv = 1.0 / norm;
        let projected = &mut scratch.residual[..self.rank()];
        self.project(x, projected);
        for group in &self.groups {
            let len = group.len();
            let slice = &projected[group.start..group.start + len];
            let rotated = &mut scratch.rotated[..len];
            group.rotation.apply(slice, rotated)?;
            let factor = inv / group.scale;
            for v in rotated.iter_mut() {
                *v *= factor;
            }
            let codes = &mut scratch.codes[..len];
            group.codebook.quantize_slice(rotated, codes)?;
            let words = &mut record[group.word_offset..group.word_offset + group.words()];
            crate::codec::packing::pack(codes, group.bits, words)?;
        }
        Ok(stored)
    }

    /// Decodes a record into `out` (`[d]`). Allocation-free.
    pub fn decode_into(
        &self,
        record: &[u32],
        norm: f16,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        let d = self.spec.dim;
        scratch.check(d)?;
        if record.len() != self.record_words() || out.len() != d {
            return Err(CodecError::LengthMismatch {
                what: "decode buffers",
                expected: self.record_words() + d,
                actual: record.len() + out.len(),
            });
        }
        let n = norm.to_f32();
        let rank = self.rank();
        let CodecScratch {
            codes,
            residual,
            sketch,
            ..
        } = scratch;
        for group in &self.groups {
            let len = group.len();
            let codes = &mut codes[..len];
            let words = &record[group.word_offset..group.word_offset + group.words()];
            crate::codec::packing::unpack(words, group.bits, codes)?;
            let centroids = group.codebook.centroids_f32();
            let step = n * group.scale;
            let coded = &mut sketch[..len];
            for (o, &c) in coded.iter_mut().zip(codes.iter()) {
                *o = step * centroids[usize::from(c)];
            }
            group
                .rotation
                .apply_inverse(coded, &mut residual[group.start..group.start + len])?;
        }
        out.fill(0.0);
        self.add_back(&residual[..rank], out);
        Ok(())
    }
}
