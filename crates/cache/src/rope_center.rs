//! RoPE-aware key centering (`center = "rope"`): subtract a mean that turns with the position.
//!
//! # Why
//!
//! Post-RoPE keys `k_t = R(t)·k̂_t` carry a large constant component in their *un-rotated*
//! domain (`E[k̂] = m`), which RoPE turns plane by plane with the position: in plane `p` by
//! the angle `θ_p·t`, `θ_p = base^(−2p/d)`. A fixed mean ([`CenterPolicy::FirstChunk`]) only
//! catches what is left of `R(t)·m` after averaging over the first chunk's positions — the
//! slow planes, and only near the first chunk. Measured on SmolLM2 (2048 tokens of GPL-3,
//! every layer and KV head; `crates/models/examples/key_means.rs`), the share of key energy
//! left after centering is −2.3 dB with the first chunk's mean, −3.4 dB with the mean of all
//! 2048 tokens, and −5.5 dB with this centering (−5.3 dB against −1.6 dB on 4096 held-out
//! tokens): 3 dB less energy for the codec to quantize, at the same bytes.
//!
//! # What is stored and added back
//!
//! Token `t` of the stream (its index, counted from the stream's first token: the RoPE position
//! when positions start at 0 and advance by one, as every runner here appends them) stores
//! `k_t − c(t)` with `c(t) = R(φ(t))·m`, `φ(t) = 16·⌊t/16⌋ + 8` the middle of its block of
//! [`CENTER_BLOCK`] tokens. Within a block `c` is constant, so a query's score correction
//! `q·c(t)` is one dot product per block, not per token; the attention kernels add it to
//! every score of the block ([`score_bias`]). The result is exact up to f32 rounding whatever
//! the positions are: what is subtracted is added back. Planes that turn too fast for the block
//! (`θ_p·8` near or beyond a radian) would gain nothing or lose, so the fit keeps a plane of `m`
//! only where subtracting it lowers the first batch's energy in that plane.
//!
//! # Where m comes from
//!
//! The first batch appended to the empty stream (the prefill or its first chunk), like
//! [`FirstChunk`](CenterPolicy::FirstChunk): each token turned back by its own angle,
//! `m_p = mean_t R(−θ_p·t)·k_t`, summed in f64 and rounded to f32. Fewer than
//! [`MIN_CENTER_TOKENS`] tokens give `m = 0`. `m` is stored where a centered stream stores its
//! mean (`head_dim` f32, saved bit for bit); the angles `θ_p·φ` come from the layout's RoPE base
//! ([`RopeBase`]), a model constant. Keys only: values carry no RoPE.
//!
//! # Cost
//!
//! The same bytes as a first-chunk mean. Per query and block of 16 keys: one `d`-term dot
//! product with a table of the blocks' cosines and sines ([`center_angles`]: `2·(d/2)` f32
//! per block, shared by every stream of the process with the same base and head dimension,
//! computed once per block).

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::basis::RopePairs;
use crate::center::{MIN_CENTER_TOKENS, checked_first_batch};
use crate::error::CacheError;

#[cfg(doc)]
use crate::center::CenterPolicy;

/// Tokens per block of one center `c(t)`: one score correction per block per query.
pub const CENTER_BLOCK: usize = 16;

/// The model's RoPE base frequency (`θ_p = base^(−2p/d)`), as the f32's bits so a layout stays
/// `Eq`; [`RopeBase::UNKNOWN`] (the default, and what files saved before it load as) for a
/// layout built without one, where `center = "rope"` is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RopeBase(u32);

impl RopeBase {
    /// No base known.
    pub const UNKNOWN: RopeBase = RopeBase(0);

    /// The base `base` (a finite value above 1; anything else is [`RopeBase::UNKNOWN`]).
    ///
    /// ```
    /// use tq_cache::rope_center::RopeBase;
    /// assert_eq!(RopeBase::new(10_000.0).get(), Some(10_000.0));
    /// assert_eq!(RopeBase::new(f32::NAN).get(), None);
    /// ```
    pub fn new(base: f32) -> Self {
        if base.is_finite() && base > 1.0 {
            RopeBase(base.to_bits())
        } else {
            RopeBase::UNKNOWN
        }
    }

    /// The base, if known.
    pub fn get(self) -> Option<f32> {
        (self != RopeBase::UNKNOWN).then(|| f32::from_bits(self.0))
    }

    /// Whether a RoPE-aware center can turn a head of `head_dim` dimensions with this base:
    /// the base is known and the head splits into RoPE planes (an even dimension). The one
    /// rule both `rope-or-first-chunk`'s resolution and a stream's check of `rope` follow.
    pub fn supports_center(self, head_dim: usize) -> bool {
        self.get().is_some() && head_dim.is_multiple_of(2)
    }
}

/// `θ_p` of plane `p` of a `d`-dimensional head.
fn theta(base: f32, p: usize, d: usize) -> f64 {
    f64::from(base).powf(-2.0 * p as f64 / d as f64)
}

/// The middle position of block `block` (the angle its center is turned by).
fn block_middle(block: usize) -> f64 {
    (block * CENTER_BLOCK + CENTER_BLOCK / 2) as f64
}

/// Each block's `[cos(θ_p·φ_b), sin(θ_p·φ_b)]` for `p < d/2` (`d` f32 per block, block `b`
/// from `b·d`), for at least the blocks asked. Every entry is a function of its own index
/// (computed in f64, rounded once), so a table grown later holds the same values.
#[derive(Debug)]
pub struct CenterAngles {
    d: usize,
    values: Vec<f32>,
}

impl CenterAngles {
    fn new(base: f32, d: usize, blocks: usize) -> Self {
        let mut values = Vec::with_capacity(blocks * d);
        for b in 0..blocks {
            for p in 0..d / 2 {
                let (sin, cos) = (theta(base, p, d) * block_middle(b)).sin_cos();
                values.push(cos as f32);
                values.push(sin as f32);
            }
        }
        Self { d, values }
    }

    /// Blocks the table covers.
    pub fn blocks(&self) -> usize {
        self.values.len() / self.d.max(1)
    }

    /// `[cos, sin]` pairs of block `b` (`d` values).
    ///
    /// # Panics
    /// If `b` is beyond [`blocks`](Self::blocks) (callers fetch a table covering their tokens).
    pub fn block(&self, b: usize) -> &[f32] {
        &self.values[b * self.d..(b + 1) * self.d]
    }

    /// The `[cos, sin]` pairs of blocks `blocks`, one block after another (`d` values each).
    ///
    /// # Panics
    /// If the range reaches beyond [`blocks`](Self::blocks).
    pub fn span(&self, blocks: std::ops::Range<usize>) -> &[f32] {
        &self.values[blocks.start * self.d..blocks.end * self.d]
    }
}

/// The process-wide tables, one per (base, head dimension), grown by doubling.
static TABLES: Mutex<Vec<(RopeBase, usize, Arc<CenterAngles>)>> = Mutex::new(Vec::new());

/// A table of [`CenterAngles`] for `base` and head dimension `d` covering tokens `0..tokens`.
pub fn center_angles(base: f32, d: usize, tokens: usize) -> Arc<CenterAngles> {
    let key = RopeBase::new(base);
    let blocks = tokens.div_ceil(CENTER_BLOCK).max(1);
    let mut tables = TABLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, _, table)) = tables.iter().find(|(b, dim, _)| *b == key && *dim == d)
        && table.blocks() >= blocks
    {
        return Arc::clone(table);
    }
    // Doubling keeps the number of rebuilds logarithmic in the context.
    let grown = Arc::new(CenterAngles::new(
        base,
        d,
        blocks.next_power_of_two().max(64),
    ));
    tables.retain(|(b, dim, _)| !(*b == key && *dim == d));
    tables.push((key, d, Arc::clone(&grown)));
    grown
}

/// Writes `c(t) = R(φ(t))·m` into `out` (`m.len() = out.len() = d`) from a table covering
/// token `t`.
pub fn center_at(m: &[f32], t: usize, pairs: RopePairs, angles: &CenterAngles, out: &mut [f32]) {
    let d = m.len();
    let block = angles.block(t / CENTER_BLOCK);
    for p in 0..d / 2 {
        let [i, j] = pairs.plane(p, d);
        let (cos, sin) = (block[2 * p], block[2 * p + 1]);
        out[i] = m[i] * cos - m[j] * sin;
        out[j] = m[i] * sin + m[j] * cos;
    }
}

/// The score correction coefficients of query `q` (`d` values, already scaled as the kernel
/// scales it): `q·c(t)` of a token in block `b` is `Σ_i coef_i·angles.block(b)_i`.
pub fn bias_coefficients(q: &[f32], m: &[f32], pairs: RopePairs, out: &mut [f32]) {
    let d = m.len();
    for p in 0..d / 2 {
        let [i, j] = pairs.plane(p, d);
        // q·R(φ)m in plane p = cos φ·(q_i m_i + q_j m_j) + sin φ·(q_j m_i − q_i m_j).
        out[2 * p] = q[i] * m[i] + q[j] * m[j];
        out[2 * p + 1] = q[j] * m[i] - q[i] * m[j];
    }
}

/// `q·c(t)` for a token of block `b` from [`bias_coefficients`]: eight running sums (entry `i`
/// into sum `i % 8`, in index order), then added pairwise — a fixed order written in plain
/// arithmetic, so every kernel, instruction set and thread count gets the same f32, and the
/// compiler may keep the eight sums in one vector register.
pub fn score_bias(coefficients: &[f32], angles: &CenterAngles, b: usize) -> f32 {
    let mut sums = [0.0f32; 8];
    let block = angles.block(b);
    let (c8, a8) = (coefficients.chunks_exact(8), block.chunks_exact(8));
    let (c_rest, a_rest) = (c8.remainder(), a8.remainder());
    for (c, a) in c8.zip(a8) {
        for k in 0..8 {
            sums[k] += c[k] * a[k];
        }
    }
    for (k, (c, a)) in c_rest.iter().zip(a_rest).enumerate() {
        sums[k] += c * a;
    }
    let [s0, s1, s2, s3, s4, s5, s6, s7] = sums;
    ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))
}

/// The `m` a `center = "rope"` stream takes from its first batch `tokens` (`[n, d]`, token `i`
/// at position `i`): each token turned back by its angle and averaged in f64, then each plane
/// kept only where subtracting its block centers lowers the batch's energy in that plane (see
/// the [module docs](self)); zeros when `n < MIN_CENTER_TOKENS`. Errors as
/// [`first_chunk_mean`](crate::center::first_chunk_mean).
///
/// ```
/// use tq_cache::basis::RopePairs;
/// use tq_cache::rope_center::rope_mean;
/// // A constant un-rotated key (1, 0) in plane 1 (θ = 10⁴^(−1/2) = 0.01 rad per token), turned
/// // by RoPE: the fit finds it back. Plane 0 holds nothing and stays zero.
/// let tokens: Vec<f32> = (0..64)
///     .flat_map(|t| {
///         let a = 0.01 * t as f64;
///         [0.0, 0.0, a.cos() as f32, a.sin() as f32]
///     })
///     .collect();
/// let m = rope_mean(&tokens, 4, RopePairs::Adjacent, 10_000.0)?;
/// assert_eq!(&m[..2], &[0.0, 0.0]);
/// assert!((m[2] - 1.0).abs() < 1e-5 && m[3].abs() < 1e-5, "{m:?}");
/// # Ok::<(), tq_cache::CacheError>(())
/// ```
pub fn rope_mean(
    tokens: &[f32],
    d: usize,
    pairs: RopePairs,
    base: f32,
) -> Result<Vec<f32>, CacheError> {
    const WHAT: &str = "first batch of a RoPE-centered stream";
    let n = checked_first_batch(tokens, d, WHAT)?;
    if !d.is_multiple_of(2) {
        // RoPE turns coordinate pairs: an odd head has no planes.
        return Err(CacheError::ShapeMismatch {
            what: WHAT,
            expected: tokens.len().next_multiple_of(2 * d),
            actual: tokens.len(),
        });
    }
    if n < MIN_CENTER_TOKENS {
        return Ok(vec![0.0; d]);
    }
    let mut m = vec![0.0f32; d];
    for p in 0..d / 2 {
        let [i, j] = pairs.plane(p, d);
        let th = theta(base, p, d);
        let (mut a, mut b) = (0.0f64, 0.0f64);
        for (t, row) in tokens.chunks_exact(d).enumerate() {
            let (sin, cos) = (th * t as f64).sin_cos();
            let (x, y) = (f64::from(row[i]), f64::from(row[j]));
            a += x * cos + y * sin;
            b += -x * sin + y * cos;
        }
        let (a, b) = (a / n as f64, b / n as f64);
        // Kept only if the block centers lower this plane's energy over the batch.
        let (mut with, mut without) = (0.0f64, 0.0f64);
        for (t, row) in tokens.chunks_exact(d).enumerate() {
            let (sin, cos) = (th * block_middle(t / CENTER_BLOCK)).sin_cos();
            let (cx, cy) = (a * cos - b * sin, a * sin + b * cos);
            let (x, y) = (f64::from(row[i]), f64::from(row[j]));
            with += (x - cx).powi(2) + (y - cy).powi(2);
            without += x * x + y * y;
        }
        if with < without {
            m[i] = a as f32;
            m[j] = b as f32;
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::CodecError;

    #[test]
    fn a_table_grown_later_holds_the_same_values() {
        let small = CenterAngles::new(10_000.0, 8, 3);
        let large = center_angles(10_000.0, 8, 40 * CENTER_BLOCK);
        for b in 0..3 {
            assert_eq!(small.block(b), large.block(b));
        }
        assert!(large.blocks() >= 40);
    }

    #[test]
    fn the_bias_is_the_query_against_the_center() {
        let d = 8;
        let m: Vec<f32> = (0..d).map(|i| 0.3 * i as f32 - 1.0).collect();
        let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.7).sin()).collect();
        let angles = center_angles(500.0, d, 100);
        for pairs in [RopePairs::Adjacent, RopePairs::Halves] {
            let mut coef = vec![0.0; d];
            bias_coefficients(&q, &m, pairs, &mut coef);
            for t in [0usize, 15, 16, 99] {
                let mut c = vec![0.0; d];
                center_at(&m, t, pairs, &angles, &mut c);
                let dot: f32 = q.iter().zip(&c).map(|(a, b)| a * b).sum();
                let bias = score_bias(&coef, &angles, t / CENTER_BLOCK);
                assert!(
                    (dot - bias).abs() < 1e-5,
                    "{pairs:?} t={t}: {dot} vs {bias}"
                );
                // A rotation keeps the center's length.
                let (lc, lm): (f32, f32) =
                    (c.iter().map(|v| v * v).sum(), m.iter().map(|v| v * v).sum());
                assert!((lc - lm).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn planes_that_do_not_pay_are_dropped() {
        // Both planes carry a constant un-rotated component. Plane 0 turns 1 rad per token,
        // so a block's middle angle is up to 8 rad off its tokens' and subtracting doubles the
        // plane's energy: dropped. Plane 1 turns 1e-4 rad per token: kept.
        let (d, base) = (4, 1.0e8f32);
        let tokens: Vec<f32> = (0..64)
            .flat_map(|t| {
                let (fast, slow) = (t as f64, theta(base, 1, d) * t as f64);
                [
                    2.0 * fast.cos(),
                    2.0 * fast.sin(),
                    3.0 * slow.cos(),
                    3.0 * slow.sin(),
                ]
                .map(|v| v as f32)
            })
            .collect();
        let m = rope_mean(&tokens, d, RopePairs::Adjacent, base).unwrap();
        assert_eq!(&m[..2], &[0.0, 0.0]);
        assert!((m[2] - 3.0).abs() < 1e-4 && m[3].abs() < 1e-4, "{m:?}");
    }

    #[test]
    fn bad_batches_get_typed_errors_and_short_ones_zeros() {
        assert!(rope_mean(&[0.0; 7], 4, RopePairs::Adjacent, 1e4).is_err());
        assert!(rope_mean(&[0.0; 9], 3, RopePairs::Adjacent, 1e4).is_err());
        let mut bad = vec![1.0; 64];
        bad[5] = f32::NAN;
        assert!(matches!(
            rope_mean(&bad, 4, RopePairs::Adjacent, 1e4),
            Err(CacheError::Codec(CodecError::NonFinite { index: 1, .. }))
        ));
        assert_eq!(
            rope_mean(&[1.0; 28], 4, RopePairs::Adjacent, 1e4).unwrap(),
            vec![0.0; 4]
        );
    }
}
