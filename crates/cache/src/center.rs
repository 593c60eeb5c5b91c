//! Mean-centering: a stream stores `x − μ` instead of `x`, with `μ` fixed per layer, KV head and
//! stream (keys or values).
//!
//! # Why it is exact
//!
//! - **Keys.** A query's scores become `q·(k_t − μ_k) = q·k_t − q·μ_k`: every score of the query
//!   moves by the same constant, and a softmax does not change when all its arguments move
//!   together. The attention weights change only through the quantization error, which now
//!   scales with `‖k − μ_k‖²` instead of `‖k‖²` — a gain of `−10·log10(1 − f)` dB where `f` is
//!   the share of key energy in the mean. Nothing is added back for keys.
//! - **Values.** The weights of a query sum to one, so `Σ p_t v_t = μ_v + Σ p_t (v_t − μ_v)`
//!   exactly: attention adds `μ_v` of KV head `g` once to the output of every query head of
//!   `g`'s group ([`attend`](crate::attention::attend), the one place every kernel and every
//!   shared-KV layer goes through).
//!
//! Everything a centered stream stores — the compressed body *and* the full-precision sink and
//! recent-window copies — is in the centered domain, so every kernel sees one consistent domain
//! and none of them needs to know about centering. [`Stream::decode`](crate::stream::Stream::decode)
//! returns that stored domain; [`Stream::reconstruct`](crate::stream::Stream::reconstruct) adds
//! `μ` back for callers that need the true vectors.
//!
//! # Where μ comes from
//!
//! [`CenterPolicy::FirstChunk`]: the mean of the first batch appended to the empty stream (the
//! prefill, or its first chunk), summed in f64 and stored as f32, chosen by the same two-tier
//! "calibration" step that picks outlier channels. The prefill is the only data a cache sees
//! before it must store anything, and a mean fixed from then on keeps every stored record a
//! function of its own vector: chunked appends after the first chunk reuse `μ`, rewinds stay
//! exact, and a saved cache reloads bit-identical (`μ` travels in the header as f32 bit
//! patterns). [`clear`](crate::kv_cache::KvCache::clear) and a rewind to zero tokens forget `μ`,
//! so an emptied cache behaves exactly like a fresh one.
//!
//! **Fallback.** A first batch of fewer than [`MIN_CENTER_TOKENS`] tokens (e.g. a decode-only
//! stream, one token at a time) gives `μ = 0`, recorded as chosen so later batches do not
//! recompute it: the stream then stores exactly what an uncentered stream stores.
//!
//! # Cost
//!
//! `head_dim` f32 per centered stream (`4·head_dim` bytes), stored once, not per token:
//! counted in [`Stream::fixed_bytes`](crate::stream::Stream::fixed_bytes) and so in
//! `KvCache::formula_bytes` / `allocated_bytes`, and reported per head by
//! [`ResolvedStream::metadata_bytes_per_head`](crate::allocation::ResolvedStream::metadata_bytes_per_head).
//! Amortized over `N` cached tokens that is `32/N` bits per value (0.03 at 1K tokens).
//!
//! Fixed (conv / recurrent) states are never quantized and never centered; an allocation's
//! `center` setting applies to KV states only.

use serde::{Deserialize, Serialize};

use crate::codec::CodecError;
use crate::error::CacheError;

/// Fewest tokens in a first batch for its mean to be used; shorter batches give `μ = 0`.
///
/// A mean estimated from `n` tokens is off by `Σ/n` in covariance, so a later token's centered
/// energy is `(1 + 1/n)·tr Σ` against `‖μ‖² + tr Σ` uncentered: centering pays when the mean's
/// share of the energy is `f > 1/(n + 1)`. At `n = 1` the "mean" is the first token itself and
/// doubles the energy of every later one unless `f > 1/2`; at `n = 8` the estimate costs at most
/// 1/8 (0.5 dB) of the spread and pays from `f > 0.11` — below the key shares measured on real
/// models (0.37–0.75 post-RoPE) and just below their value share (≈ 0.15), so 8 keeps every
/// real prefill and refuses only decode-sized batches, whose estimate is mostly noise.
pub const MIN_CENTER_TOKENS: usize = 8;

/// Whether and how a stream is mean-centered; the TOML spelling (`center = "…"`) is in
/// parentheses. See the [module docs](self) for why it is exact and what it costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CenterPolicy {
    /// Store the vectors as they come (`none`).
    #[default]
    None,
    /// Subtract the mean of the stream's first appended batch (`first-chunk`).
    FirstChunk,
    /// Keys only: subtract a mean that turns with RoPE, fitted on the first batch in the
    /// un-rotated domain and turned to each block of 16 tokens; the kernels add each block's
    /// `q·c` back (`rope`; see [`rope_center`](crate::rope_center)).
    Rope,
    /// Keys only, an allocation setting: [`Rope`](CenterPolicy::Rope) on a cache layout that
    /// knows the model's RoPE base (RoPE over the whole head, an even head dimension),
    /// [`FirstChunk`](CenterPolicy::FirstChunk) on any other (`rope-or-first-chunk`; what the
    /// recommended presets use, so they run on layouts without a base too). Resolved when an
    /// allocation builds a cache's stream layouts ([`resolved`](CenterPolicy::resolved)); a
    /// stream layout never holds it.
    RopeOrFirstChunk,
}

impl CenterPolicy {
    /// Whether the center depends on the token's position ([`CenterPolicy::Rope`]): the
    /// kernels then add `q·c(t)` back per block instead of relying on the softmax's shift
    /// invariance.
    pub fn turns_with_position(self) -> bool {
        matches!(self, CenterPolicy::Rope)
    }

    /// Whether the stream stores `x − μ`.
    pub fn is_centered(self) -> bool {
        !matches!(self, CenterPolicy::None)
    }

    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CenterPolicy::None => "none",
            CenterPolicy::FirstChunk => "first-chunk",
            CenterPolicy::Rope => "rope",
            CenterPolicy::RopeOrFirstChunk => "rope-or-first-chunk",
        }
    }

    /// The policy a stream of a cache layout with RoPE base `base` and head dimension
    /// `head_dim` takes: [`RopeOrFirstChunk`](CenterPolicy::RopeOrFirstChunk) becomes
    /// [`Rope`](CenterPolicy::Rope) where the base is known and the head dimension even,
    /// [`FirstChunk`](CenterPolicy::FirstChunk) elsewhere; every other policy stays.
    ///
    /// ```
    /// use tq_cache::center::CenterPolicy;
    /// use tq_cache::rope_center::RopeBase;
    /// let auto = CenterPolicy::RopeOrFirstChunk;
    /// assert_eq!(auto.resolved(RopeBase::new(1e4), 64), CenterPolicy::Rope);
    /// assert_eq!(auto.resolved(RopeBase::UNKNOWN, 64), CenterPolicy::FirstChunk);
    /// assert_eq!(CenterPolicy::Rope.resolved(RopeBase::UNKNOWN, 64), CenterPolicy::Rope);
    /// ```
    pub fn resolved(self, base: crate::rope_center::RopeBase, head_dim: usize) -> CenterPolicy {
        match self {
            CenterPolicy::RopeOrFirstChunk if base.supports_center(head_dim) => CenterPolicy::Rope,
            CenterPolicy::RopeOrFirstChunk => CenterPolicy::FirstChunk,
            other => other,
        }
    }

    /// Bytes the stream stores once for its mean at head dimension `head_dim`: `4·head_dim` when
    /// centered, 0 otherwise.
    pub fn mean_bytes(self, head_dim: usize) -> usize {
        if self.is_centered() { 4 * head_dim } else { 0 }
    }
}

impl std::fmt::Display for CenterPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mean a [`CenterPolicy::FirstChunk`] stream takes from its first batch `tokens`
/// (`[n, head_dim]`, row-major): the per-channel mean summed in f64 (in token order, so a pure
/// function of the batch) and rounded once to f32, or zeros when `n < MIN_CENTER_TOKENS`.
///
/// Errors: a length that is not a multiple of `head_dim` ([`CacheError::ShapeMismatch`]) or a
/// non-finite value ([`CodecError::NonFinite`], `index` = its channel), whatever `n`.
///
/// ```
/// use tq_cache::center::{MIN_CENTER_TOKENS, first_chunk_mean};
/// let tokens: Vec<f32> = (0..8).flat_map(|t| [t as f32, 1.0]).collect();
/// assert_eq!(MIN_CENTER_TOKENS, 8);
/// assert_eq!(first_chunk_mean(&tokens, 2)?, vec![3.5, 1.0]);
/// assert_eq!(first_chunk_mean(&tokens[..14], 2)?, vec![0.0, 0.0]); // 7 tokens: too few
/// # Ok::<(), tq_cache::CacheError>(())
/// ```
pub fn first_chunk_mean(tokens: &[f32], head_dim: usize) -> Result<Vec<f32>, CacheError> {
    let n = checked_first_batch(tokens, head_dim, "first batch of a centered stream")?;
    if n < MIN_CENTER_TOKENS {
        return Ok(vec![0.0; head_dim]);
    }
    let mut sums = vec![0.0f64; head_dim];
    for row in tokens.chunks_exact(head_dim) {
        for (s, &v) in sums.iter_mut().zip(row) {
            *s += f64::from(v);
        }
    }
    // A mean of finite f32 values lies within their range, so the cast is finite.
    Ok(sums.iter().map(|s| (s / n as f64) as f32).collect())
}

/// The tokens in a first batch `tokens` of rows of `head_dim` (what every centering policy
/// fits its mean on): a length that is not a multiple of `head_dim` is a
/// [`CacheError::ShapeMismatch`] naming `what`, a non-finite value a [`CodecError::NonFinite`]
/// (`index` = its channel).
pub(crate) fn checked_first_batch(
    tokens: &[f32],
    head_dim: usize,
    what: &'static str,
) -> Result<usize, CacheError> {
    if head_dim == 0 || !tokens.len().is_multiple_of(head_dim) {
        return Err(CacheError::ShapeMismatch {
            what,
            expected: tokens.len().next_multiple_of(head_dim.max(1)),
            actual: tokens.len(),
        });
    }
    if let Some(index) = tokens.iter().position(|v| !v.is_finite()) {
        return Err(CacheError::Codec(CodecError::NonFinite {
            index: index % head_dim,
            value: tokens[index],
        }));
    }
    Ok(tokens.len() / head_dim)
}

/// Serde for a recorded mean as its f32 bit patterns (`u32`): JSON text need not round-trip an
/// f32 bit for bit, and a saved cache must reload exactly.
pub(crate) mod mean_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        mean: &Option<Vec<f32>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        mean.as_ref()
            .map(|m| m.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
            .serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<f32>>, D::Error> {
        Ok(Option::<Vec<u32>>::deserialize(deserializer)?
            .map(|bits| bits.iter().map(|&b| f32::from_bits(b)).collect()))
    }
}
