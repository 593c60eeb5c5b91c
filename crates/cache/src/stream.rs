//! One stream of a KV cache: the keys (or the values) of one KV head of one layer.
//!
//! Every token is encoded with the stream's codec into `body` when it arrives. Full-precision
//! copies are kept beside it for the attention sinks (the first `sink_tokens` tokens) and for
//! the most recent `recent_tokens` tokens; attention reads those copies instead of the codes.
//! The recent copies live in a ring of `recent_tokens + max_rewind` slots, so a rewind of up to
//! `max_rewind` tokens still finds full-precision copies of the tokens that become recent again:
//! rewinding then re-appending is exactly the same as never having appended.
//!
//! The queries of a step (the batch just appended) read their own newest `recent_tokens`
//! tokens in full precision ([`Stream::window_start`]): the stream keeps copies of the batch
//! and of the `recent_tokens − 1` tokens before it for the step (working memory, not cache
//! bytes), so every query of a prefill reads the window a decode step at it would.
//!
//! Window copies may be stored in 8 bits instead (`recent`: [`CodecSpec::Q8`], the allocation's
//! `recent_dtype = "q8"`). Such a window is then the only copy of its tokens: a token's codes
//! are written when it leaves the window, from its 8-bit copy, so the body holds the tokens
//! `[0, len − recent_tokens)` and the window's tokens cost their 8-bit copy only. Attention
//! reads the same records either way (codes before the window, copies in it), and a rewind
//! drops the codes of tokens that become recent again, which are written again, from the same
//! copies, when they leave it again. A copy must decode to a vector the body codec stores, so a
//! token the codes would refuse is refused on arrival ([`Q8Window`](crate::codec::Q8Window)).
//!
//! A batch that fails part-way is rolled back without a rewind check: the ring copies its
//! tokens overwrote come back from the step's copies of the window before it (every window,
//! 8-bit or not), so the window is whole again and an 8-bit window's codes can still be written.
//!
//! In ring mode (sliding-window layers) the body itself is a ring of `slots` records and token
//! `t` lives in slot `t % slots`; sinks and recent copies are not used there (the window already
//! bounds the memory).
//!
//! A mean-centered stream ([`CenterPolicy`], see [`center`](crate::center)) stores `x − μ`
//! everywhere — body, sinks and recent copies — so every record, and every kernel reading it,
//! is in one (centered) domain. `μ` is chosen from the first appended batch, like the outlier
//! channels of a two-tier stream and the [basis](crate::basis) of a basis stream, and forgotten
//! with them when the stream is emptied.

use std::borrow::Cow;

use half::f16;

use crate::basis::{BasisFit, BasisPolicy};
use crate::center::CenterPolicy;
use crate::codec::{CodecError, CodecScratch};
use crate::error::CacheError;
use crate::heavy_hitters::{GatheredRow, HeavyHitters};
use crate::record_order::{BitPlanes, CodeRun, RecordOrder};
use crate::token_codec::{CodecSpec, TokenCodec};
use crate::token_store::{Growth, TokenStore};

/// A token's record as a stream reads it: the codec that decodes it, its words (borrowed, or
/// gathered from a fast-scan body) and its scales.
pub type StoredRecord<'a> = (&'a TokenCodec, Cow<'a, [u32]>, &'a [f16]);

/// Which copy of a token attention must read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// The compressed record in the body (index = slot).
    Body(usize),
    /// The full-precision sink copy (index = token).
    Sink(usize),
    /// The full-precision recent copy (index = ring slot).
    Recent(usize),
}

/// Shape and policy of one stream.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamLayout {
    /// The body codec (for a two-tier stream: ignored, see `outliers`).
    pub codec: CodecSpec,
    /// Two tiers: the outlier channels of each head, chosen by L2 norm over the first
    /// appended batch (the prefill), get their own codec.
    #[serde(default)]
    pub outliers: Option<crate::allocation::OutlierPlan>,
    /// The outlier channels once chosen (recorded so a saved cache reloads them).
    #[serde(default)]
    pub channels: Option<Vec<u16>>,
    /// Mean-centering: whether the stream stores `x − μ` (default: not centered).
    #[serde(default)]
    pub center: CenterPolicy,
    /// The mean `μ` once chosen (`head_dim` values; all zero when the first batch was too
    /// short). Recorded so a saved cache reloads it; saved as f32 bit patterns (`mean_bits`),
    /// so it reloads bit for bit.
    #[serde(default, rename = "mean_bits", with = "crate::center::mean_bits")]
    pub mean: Option<Vec<f32>>,
    /// The data-aware basis: whether the stream fits one from its first batch (`mse` streams
    /// only; see [`basis`](crate::basis)).
    #[serde(default)]
    pub basis: BasisPolicy,
    /// What the stream decided from its first batch (recorded so a saved cache reloads it bit
    /// for bit: the fit is integers).
    #[serde(default)]
    pub basis_fit: Option<BasisFit>,
    /// The widths the basis may give its groups (default: 1 to 8 bits; see
    /// [`GroupWidths`](crate::basis::GroupWidths)).
    #[serde(default, skip_serializing_if = "is_all_widths")]
    pub basis_bits: crate::basis::GroupWidths,
    /// The coordinate pairs the model's RoPE turns together (the planes of a plane basis;
    /// from [`KvLayout::rope_pairs`](crate::kv_cache::KvLayout::rope_pairs)).
    #[serde(default)]
    pub rope_pairs: crate::basis::RopePairs,
    /// The model's RoPE base (what a `center = "rope"` stream turns its mean with; from
    /// [`KvLayout::rope_base`](crate::kv_cache::KvLayout::rope_base)).
    #[serde(default)]
    pub rope_base: crate::rope_center::RopeBase,
    /// Precision of sink and recent copies (`F16` or `F32` of the same dimension).
    pub fp: CodecSpec,
    /// The recent window's copies when they are stored otherwise than `fp`: `Q8` (8 bits, and
    /// then the window's tokens have no codes until they leave it; see the module docs).
    /// `None`: `fp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent: Option<CodecSpec>,
    /// First tokens kept at full precision.
    pub sink_tokens: usize,
    /// Newest tokens kept at full precision: at least this many, and with `recent_fraction`
    /// that fraction of the tokens held ([`window_tokens`]).
    pub recent_tokens: usize,
    /// The recent window as a fraction of the tokens the stream holds, in `[0, 1)`: with `n`
    /// tokens held the window is `max(recent_tokens, round(fraction · n))` tokens, so it
    /// grows with the context and its share of the bytes stays the same at every length
    /// (`None`: the count alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_fraction: Option<f64>,
    /// Tokens a rewind may drop while staying exact.
    pub max_rewind: usize,
    /// Growth of the body (ignored in ring mode).
    pub growth: Growth,
    /// `Some(slots)` for a ring buffer of that many records.
    pub ring_slots: Option<usize>,
    /// The memory order asked of the body's records: [`RecordOrder::FastScan`] stores them
    /// the way the fast-scan kernel reads them. TQ_mse bodies whose records are whole words,
    /// fitted bases, two tiers of TQ_mse and TQ_prod take it (codes of 3 and 5 to 8 bits as bit
    /// planes); every other body keeps rows ([`body_order`]), which reads the same tokens.
    #[serde(default, skip_serializing_if = "is_rows")]
    pub order: RecordOrder,
    /// Heavy hitters: a token that drew at least this factor times the uniform share of
    /// attention while in the recent window keeps its window copy when it leaves
    /// ([`heavy_hitters`](crate::heavy_hitters)); `None`: every token leaves for its codes.
    /// Needs a recent window; ignored in ring mode (as the window is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heavy_hitters: Option<f32>,
}

fn is_all_widths(widths: &crate::basis::GroupWidths) -> bool {
    *widths == crate::basis::GroupWidths::ALL
}

fn is_rows(order: &RecordOrder) -> bool {
    *order == RecordOrder::Rows
}

/// The order a body coded by `codec` takes when `asked` for: the fast-scan order holds records
/// as nibbles, each of which the kernel looks up whole, so it applies to TQ_mse codecs whose
/// records are whole words (`d·b` a multiple of 32) and to fitted bases (each group starts on
/// a word boundary): codes of 1, 2 or 4 bits fill whole nibbles (four, two or one code per
/// nibble), codes of 3 and 5 to 8 bits are stored as bit planes of 4, 2 and 1 bits
/// ([`body_planes`]); two tiers of TQ_mse and TQ_prod take it too (each tier's codes a run
/// from its first word; TQ_prod's QJL signs a run of 1-bit codes after its MSE codes). Debiased
/// codecs, tiers with QJL signs and a group whose planes do not fit its words keep rows.
///
/// ```
/// use tq_cache::record_order::RecordOrder;
/// use tq_cache::stream::body_order;
/// use tq_cache::codec::MseSpec;
/// use tq_cache::{CodecSpec, TokenCodec};
/// let order = |dim, bits| {
///     let codec = TokenCodec::new(&CodecSpec::Mse(MseSpec::new(dim, bits, 7))).unwrap();
///     body_order(RecordOrder::FastScan, &codec)
/// };
/// assert_eq!(order(64, 2), RecordOrder::FastScan);
/// assert_eq!(order(64, 3), RecordOrder::FastScan); // as planes of 2 and 1 bits
/// assert_eq!(order(12, 2), RecordOrder::Rows); // 24 bits: not a whole word
/// ```
pub fn body_order(asked: RecordOrder, codec: &TokenCodec) -> RecordOrder {
    body_layout(asked, codec).0
}

/// [`body_order`] and the bit planes a body in that order is stored with (`None` in rows or
/// where its records are their own nibbles), from one look at the codec.
fn body_layout(asked: RecordOrder, codec: &TokenCodec) -> (RecordOrder, Option<BitPlanes>) {
    match (asked, body_planes(codec)) {
        (RecordOrder::FastScan, Some(planes)) => (RecordOrder::FastScan, planes),
        _ => (RecordOrder::Rows, None),
    }
}

/// The bit planes a body coded by `codec` is stored with in the fast-scan order: `None` where
/// the order does not hold its records ([`body_order`]), `Some(None)` where they are their
/// own nibbles (every code 1, 2 or 4 bits), `Some(Some(planes))` otherwise.
pub fn body_planes(codec: &TokenCodec) -> Option<Option<BitPlanes>> {
    let runs: Vec<CodeRun> = match codec {
        TokenCodec::Mse(c) if (c.dim() * usize::from(c.spec().bits)).is_multiple_of(32) => {
            vec![CodeRun {
                bits: c.spec().bits,
                dim: c.dim(),
                first_word: 0,
                words: c.words_per_vector(),
            }]
        }
        TokenCodec::Basis(c) => c
            .groups()
            .iter()
            .map(|g| CodeRun {
                bits: g.bits,
                dim: g.len(),
                first_word: g.word_offset,
                words: g.words(),
            })
            .collect(),
        // TQ_prod: the MSE codes, then the QJL signs as 1-bit codes (`γ` their scale; the
        // kernels score them as parts of different scales).
        TokenCodec::Prod(c) => vec![
            CodeRun {
                bits: c.mse().spec().bits,
                dim: c.mse().dim(),
                first_word: 0,
                words: c.mse().words_per_vector(),
            },
            CodeRun {
                bits: 1,
                dim: c.sketch().rows(),
                first_word: c.mse().words_per_vector(),
                words: c.sign_words_per_vector(),
            },
        ],
        // Two tiers of TQ_mse: each tier's codes a run from its first word (its own norm;
        // the kernels score the tiers as parts of different scales).
        TokenCodec::TwoTier(c) => match (c.outlier(), c.rest()) {
            (TokenCodec::Mse(outlier), TokenCodec::Mse(rest)) => vec![
                CodeRun {
                    bits: outlier.spec().bits,
                    dim: outlier.dim(),
                    first_word: 0,
                    words: outlier.words_per_vector(),
                },
                CodeRun {
                    bits: rest.spec().bits,
                    dim: rest.dim(),
                    first_word: c.outlier().record_words(),
                    words: rest.words_per_vector(),
                },
            ],
            _ => return None,
        },
        _ => return None,
    };
    BitPlanes::new(codec.record_words(), &runs).ok()
}

/// The recent window with `held` tokens held: at least `count` tokens, and `round(fraction ·
/// held)` where a fraction is given. A fraction below one makes it at most one token longer
/// than with `held − 1` held, so a token that left the window never comes back to it as the
/// context grows (its window start never moves back).
///
/// ```
/// use tq_cache::stream::window_tokens;
/// assert_eq!(window_tokens(256, Some(0.125), 1024), 256); // the count is a floor
/// assert_eq!(window_tokens(256, Some(0.125), 4096), 512); // then an eighth of the context
/// assert_eq!(window_tokens(0, Some(0.125), 100), 13); // 12.5 rounds half away from zero
/// assert_eq!(window_tokens(64, None, 4096), 64);
/// ```
pub fn window_tokens(count: usize, fraction: Option<f64>, held: usize) -> usize {
    fraction.map_or(count, |f| count.max((f * held as f64).round() as usize))
}

/// The stored tokens of one stream.
#[derive(Clone, Debug)]
pub struct Stream {
    layout: StreamLayout,
    codec: TokenCodec,
    fp_codec: TokenCodec,
    /// The codec of the recent window's copies (`fp_codec` unless the layout says otherwise).
    recent_codec: TokenCodec,
    /// Whether a token's codes wait until it leaves the window (an 8-bit window).
    deferred: bool,
    /// The token leaving the window, decoded from its copy (`head_dim` values when `deferred`,
    /// else empty): working memory like `centered`.
    evicted: Vec<f32>,
    /// `x − μ` of the token being pushed (`head_dim` values for a centered stream, else empty):
    /// working memory kept so a push allocates nothing, not counted in the stream's bytes (like
    /// the encoder scratch).
    centered: Vec<f32>,
    /// For a `center = "rope"` stream: the process-wide table of block angles (shared, not
    /// counted), kept so a push or a query does not look it up each time; refreshed when a
    /// token lies beyond it.
    center_angles: Option<std::sync::Arc<crate::rope_center::CenterAngles>>,
    /// A record and its scales as the codec writes them, before the body stores them (working
    /// memory: a fast-scan body takes whole records).
    staged: (Vec<u32>, Vec<f16>),
    body: TokenStore,
    sinks: TokenStore,
    recent: TokenStore,
    sink_tokens: usize,
    /// The window's floor and fraction ([`window_tokens`]).
    recent_tokens: usize,
    recent_fraction: Option<f64>,
    /// Slots of the recent ring: the longest window the stream may need plus the rewind
    /// margin, at least one for a stream with a window (0: none, see
    /// [`windowed`](Self::windowed)). A window that grows with the context in a stream
    /// without a fixed capacity grows its ring ([`grow_ring`](Self::grow_ring)); a grown ring
    /// is always full, so a saved stream's ring records its slots.
    recent_slots: usize,
    /// The ring's slots when the stream was built (what a cleared stream returns to).
    initial_slots: usize,
    ring_slots: Option<usize>,
    len: usize,
    /// Oldest token whose body record is intact (rings overwrite the oldest).
    oldest_body: usize,
    /// Oldest token whose recent full-precision copy is intact.
    oldest_recent: usize,
    /// Full-precision copies for the current step's queries (see [`StepCopies`]).
    step: StepCopies,
    /// Tokens that keep their window copy after the window ([`heavy_hitters`](crate::heavy_hitters)):
    /// a windowed stream whose layout asks for them.
    heavy: Option<HeavyHitters>,
}

/// Full-precision copies of the tokens the queries of the current step read in their windows:
/// the `recent_tokens − 1` tokens before the batch (copied from the recent ring when the
/// batch starts) and every token of the batch (copied from the ring as each is pushed), so a
/// batch of any length gives each of its queries the same full-precision window a decode step
/// gives it (see [`Stream::window_start`]).
///
/// Working memory of the step, like the model's own keys and values of the batch: not part of
/// the cache's bytes, not saved, and emptied by a rewind; kept between calls so a decode step
/// allocates nothing.
///
/// A decode step's window is the previous step's minus its oldest tokens plus the token the
/// previous step pushed: [`Stream::begin_step`] keeps those copies, dropping the oldest from
/// the front (`skipped`), instead of copying the whole window from the ring again (at 8K
/// tokens 1024 copies per stream and step; in a profile of a `rec4.25` SmolLM2 decode step,
/// `begin_step`, `TokenStore::record_copy`, `TokenStore::slices` and `memmove` fell from 11%
/// to under 2.5% with this, not all of that the step's copies).
#[derive(Clone, Debug, Default)]
struct StepCopies {
    /// The token of the first copy.
    first: usize,
    /// Copies held.
    count: usize,
    /// Dropped copies still at the front of `words` and `scales` (removed once they are as
    /// many as the copies held, so dropping moves each copy at most once).
    skipped: usize,
    /// Words and scales of one copy.
    record_words: usize,
    record_scales: usize,
    words: Vec<u32>,
    scales: Vec<f16>,
}

impl StepCopies {
    fn clear(&mut self, first: usize) {
        self.first = first;
        self.count = 0;
        self.skipped = 0;
        self.words.clear();
        self.scales.clear();
    }

    fn push(&mut self, record: &[u32], scales: &[f16]) {
        self.record_words = record.len();
        self.record_scales = scales.len();
        self.words.extend_from_slice(record);
        self.scales.extend_from_slice(scales);
        self.count += 1;
    }

    /// Drops the copies before token `first` (`first` within the copies held or just past
    /// them).
    fn drop_before(&mut self, first: usize) {
        let n = first.saturating_sub(self.first).min(self.count);
        self.first += n;
        self.count -= n;
        self.skipped += n;
        if self.skipped >= self.count {
            self.words.drain(..self.skipped * self.record_words);
            self.scales.drain(..self.skipped * self.record_scales);
            self.skipped = 0;
        }
    }

    /// The copies of tokens `t..t + n`, `n` at most `limit` and what the step holds.
    fn run(&self, t: usize, limit: usize) -> Option<(&[u32], &[f16], usize)> {
        let i = t.checked_sub(self.first).filter(|&i| i < self.count)?;
        let n = limit.min(self.count - i);
        let (w, s) = (self.record_words, self.record_scales);
        let i = i + self.skipped;
        (n > 0).then(|| {
            (
                &self.words[i * w..(i + n) * w],
                &self.scales[i * s..(i + n) * s],
                n,
            )
        })
    }

    fn record(&self, t: usize) -> Option<(&[u32], &[f16])> {
        self.run(t, 1).map(|(words, scales, _)| (words, scales))
    }
}

impl StreamLayout {
    /// Whether the layout keeps a recent window (a count or a positive fraction; a ring
    /// layout ignores it).
    pub fn has_window(&self) -> bool {
        self.recent_tokens > 0 || self.recent_fraction.is_some_and(|f| f > 0.0)
    }

    /// Whether a stream of this layout must calibrate on its first batch: choose the mean of a
    /// centered stream, the outlier channels of a two-tier one or the basis of a basis one.
    pub fn needs_calibration(&self) -> bool {
        self.needs_mean() || self.needs_channels() || self.needs_basis()
    }

    /// Whether calibrating would fit a plane basis, which needs the energy of the queries the
    /// first batch comes with.
    pub fn needs_query_energy(&self) -> bool {
        self.basis == BasisPolicy::Planes && self.needs_basis()
    }

    fn needs_mean(&self) -> bool {
        self.center.is_centered() && self.mean.is_none()
    }

    fn needs_channels(&self) -> bool {
        self.outliers.is_some() && self.channels.is_none()
    }

    fn needs_basis(&self) -> bool {
        self.basis.fits_basis() && self.basis_fit.is_none()
    }

    /// This layout with what calibration chose forgotten (mean, outlier channels, basis): the
    /// layout of a stream that has not seen its first batch.
    pub fn uncalibrated(&self) -> StreamLayout {
        StreamLayout {
            channels: None,
            mean: None,
            basis_fit: None,
            ..self.clone()
        }
    }

    /// This layout calibrated on `tokens` (`[n, head_dim]`, a stream's first batch) where it
    /// has not chosen yet: the mean of a centered stream, then the outlier channels of a
    /// two-tier stream or the basis of a basis stream — from the centered tokens, since those
    /// are what its codec will store. Every stream of a cache (CPU or GPU copy) calibrates
    /// through this.
    ///
    /// A plane basis ([`BasisPolicy::Planes`]) is fitted with `query_energy` (the mean square
    /// of each query coordinate over the batch and the KV head's query heads); without it (an
    /// append that brings no queries) the stream stays on the plain codec
    /// ([`BasisFit::Identity`]) until its next first batch.
    pub fn calibrated(
        &self,
        tokens: &[f32],
        query_energy: Option<&[f64]>,
    ) -> Result<StreamLayout, CacheError> {
        let head_dim = self.head_dim();
        let mut layout = self.clone();
        if self.needs_mean() {
            layout.mean = Some(match (self.center, self.rope_base.get()) {
                (CenterPolicy::Rope, Some(base)) => {
                    crate::rope_center::rope_mean(tokens, head_dim, self.rope_pairs, base)?
                }
                (CenterPolicy::Rope, None) => {
                    return Err(CacheError::InvalidConfig(
                        "center = \"rope\" needs the model's RoPE base".into(),
                    ));
                }
                _ => crate::center::first_chunk_mean(tokens, head_dim)?,
            });
        }
        // The batch as the codec will store it (centered on μ), for the channel choice or the
        // basis fit. A ragged batch goes on as it is, so each of them refuses it with its own
        // shape error.
        let stored: std::borrow::Cow<'_, [f32]> = match &layout.mean {
            Some(mean)
                if (self.needs_channels() || self.needs_basis())
                    && head_dim > 0
                    && tokens.len().is_multiple_of(head_dim) =>
            {
                let mut center = vec![0.0f32; head_dim];
                let mut stored = Vec::with_capacity(tokens.len());
                // One table covering the whole batch, not a look-up per token.
                let angles = self.center_angles(tokens.len() / head_dim);
                for (t, row) in tokens.chunks_exact(head_dim).enumerate() {
                    let c = match &angles {
                        Some(angles) => {
                            crate::rope_center::center_at(
                                mean,
                                t,
                                self.rope_pairs,
                                angles,
                                &mut center,
                            );
                            &center[..]
                        }
                        None => &mean[..],
                    };
                    stored.extend(row.iter().zip(c).map(|(&x, &m)| x - m));
                }
                stored.into()
            }
            _ => tokens.into(),
        };
        if self.needs_channels()
            && let Some(plan) = self.outliers
        {
            layout.channels = Some(crate::two_tier::select_outlier_channels(
                &stored,
                head_dim,
                plan.channels,
            )?);
        }
        if self.needs_basis()
            && let CodecSpec::Mse(spec) = self.codec
        {
            layout.basis_fit = Some(match (self.basis, query_energy) {
                (BasisPolicy::Planes, Some(query)) => crate::basis::fit_planes_within(
                    &stored,
                    head_dim,
                    spec.bits,
                    self.rope_pairs,
                    query,
                    self.basis_bits,
                )?,
                (BasisPolicy::Planes, None) => BasisFit::Identity,
                _ => crate::basis::fit_basis_within(&stored, head_dim, spec.bits, self.basis_bits)?,
            });
        }
        Ok(layout)
    }

    /// For a `center = "rope"` stream, a table of block angles covering token `t`
    /// ([`rope_center`](crate::rope_center)); `None` for any other stream.
    pub fn center_angles(
        &self,
        t: usize,
    ) -> Option<std::sync::Arc<crate::rope_center::CenterAngles>> {
        let base = self.rope_base.get()?;
        self.center
            .turns_with_position()
            .then(|| crate::rope_center::center_angles(base, self.head_dim(), t + 1))
    }

    /// The head dimension the stream stores.
    pub fn head_dim(&self) -> usize {
        self.outliers
            .map_or(self.codec.dim(), |plan| plan.head_dim())
    }

    /// Builds the body codec: the single codec, or the two tiers with the chosen outlier
    /// channels (the first `k` channels until calibration chooses).
    pub fn build_codec(&self) -> Result<TokenCodec, CacheError> {
        if self.basis.fits_basis() {
            let CodecSpec::Mse(spec) = self.codec else {
                return Err(CacheError::InvalidConfig(format!(
                    "basis = \"{}\" needs an mse codec, not {:?}",
                    self.basis, self.codec
                )));
            };
            if self.outliers.is_some() {
                return Err(CacheError::InvalidConfig(format!(
                    "basis = \"{}\" cannot be combined with [outliers]",
                    self.basis
                )));
            }
            if spec.norm_correction {
                // The basis codec scales each group by its fitted scale and keeps the plain norm.
                return Err(CacheError::InvalidConfig(format!(
                    "basis = \"{}\" cannot be combined with norm_correction",
                    self.basis
                )));
            }
            return match &self.basis_fit {
                Some(fit) if !fit.is_from(self.basis) => Err(CacheError::InvalidConfig(format!(
                    "a recorded basis of another kind on a stream with basis = \"{}\"",
                    self.basis
                ))),
                Some(fit) => match fit.fitted() {
                    Some(fitted) => Ok(TokenCodec::Basis(Box::new(crate::basis::BasisCodec::new(
                        spec,
                        fitted.clone(),
                    )?))),
                    // Fitted to the identity: the plain codec.
                    None => Ok(TokenCodec::new(&self.codec)?),
                },
                // Not fitted yet: the plain codec.
                None => Ok(TokenCodec::new(&self.codec)?),
            };
        }
        if self.basis_fit.is_some() {
            return Err(CacheError::InvalidConfig(
                "a recorded basis on a stream without a basis policy".into(),
            ));
        }
        match &self.outliers {
            None => Ok(TokenCodec::new(&self.codec)?),
            Some(plan) => {
                let channels = self
                    .channels
                    .clone()
                    .unwrap_or_else(|| (0..plan.channels as u16).collect());
                Ok(TokenCodec::TwoTier(Box::new(plan.build(channels)?)))
            }
        }
    }
}

impl Stream {
    /// An empty stream.
    pub fn new(layout: &StreamLayout) -> Result<Self, CacheError> {
        let codec = layout.build_codec()?;
        let fp_codec = TokenCodec::new(&layout.fp)?;
        if !matches!(layout.fp, CodecSpec::F16 { .. } | CodecSpec::F32 { .. })
            || fp_codec.dim() != codec.dim()
        {
            return Err(CacheError::InvalidConfig(
                "full-precision copies must be f16 or f32 of the stream's dimension".into(),
            ));
        }
        if matches!(layout.codec, CodecSpec::Q8 { .. }) {
            return Err(CacheError::InvalidConfig(
                "q8 stores recent-window copies, not a stream's body".into(),
            ));
        }
        let recent_spec = layout.recent.unwrap_or(layout.fp);
        let recent_codec = TokenCodec::new(&recent_spec)?;
        if !matches!(
            recent_spec,
            CodecSpec::F16 { .. } | CodecSpec::F32 { .. } | CodecSpec::Q8 { .. }
        ) || recent_codec.dim() != codec.dim()
        {
            return Err(CacheError::InvalidConfig(
                "recent-window copies must be f16, f32 or q8 of the stream's dimension".into(),
            ));
        }
        let head_dim = layout.head_dim();
        match (&layout.mean, layout.center.is_centered()) {
            (Some(_), false) => {
                return Err(CacheError::InvalidConfig(
                    "a recorded mean on a stream that is not centered".into(),
                ));
            }
            (Some(mean), true) if mean.len() != head_dim || mean.iter().any(|m| !m.is_finite()) => {
                return Err(CacheError::InvalidConfig(format!(
                    "a stream's mean must be {head_dim} finite values, got {} values",
                    mean.len()
                )));
            }
            _ => {}
        }
        if layout.center == CenterPolicy::RopeOrFirstChunk {
            return Err(CacheError::InvalidConfig(
                "center = \"rope-or-first-chunk\" is an allocation setting: resolve it with \
                 CenterPolicy::resolved (Allocation::stream_layouts does)"
                    .into(),
            ));
        }
        if layout.center.turns_with_position() && !layout.rope_base.supports_center(head_dim) {
            return Err(CacheError::InvalidConfig(format!(
                "center = \"rope\" needs the model's RoPE base and an even head dimension \
                 (base {:?}, head_dim {head_dim})",
                layout.rope_base.get()
            )));
        }
        let ring = layout.ring_slots;
        if ring == Some(0) {
            return Err(CacheError::InvalidConfig(
                "a ring needs at least one slot".into(),
            ));
        }
        if let Some(f) = layout.recent_fraction
            && !(0.0..1.0).contains(&f)
        {
            return Err(CacheError::InvalidConfig(format!(
                "a recent window's fraction must be in [0, 1), got {f}"
            )));
        }
        let (sink_tokens, recent_tokens, recent_fraction) = if ring.is_some() {
            (0, 0, None)
        } else {
            let fraction = layout.recent_fraction.filter(|&f| f > 0.0);
            (layout.sink_tokens, layout.recent_tokens, fraction)
        };
        let windowed = ring.is_none() && layout.has_window();
        // The longest window the stream will need: at its capacity where it has one; a
        // growing stream starts with its floor and grows its ring as the window does.
        let longest = match layout.growth {
            Growth::Static { capacity } => window_tokens(recent_tokens, recent_fraction, capacity),
            Growth::Doubling { .. } => recent_tokens,
        };
        let recent_slots = if windowed {
            (longest + layout.max_rewind).max(1)
        } else {
            0
        };
        let deferred = recent_slots > 0 && matches!(recent_codec, TokenCodec::Q8(_));
        let body_growth = match (ring, layout.growth) {
            (Some(slots), _) => Growth::Static { capacity: slots },
            // The window's tokens have no codes: a static body needs room for the rest only
            // (the most at its capacity, as `n − window(n)` never falls as `n` grows).
            (None, Growth::Static { capacity }) if deferred => Growth::Static {
                capacity: capacity - longest.min(capacity),
            },
            (None, growth) => growth,
        };
        let store_of = |codec: &TokenCodec, capacity: usize| {
            TokenStore::new(
                codec.record_words(),
                codec.scales_per_token(),
                Growth::Static { capacity },
            )
        };
        let mut layout = layout.clone();
        if let Some(BasisFit::Pca(fit) | BasisFit::Planes(fit)) = &mut layout.basis_fit {
            fit.shrink_to_fit();
        }
        let centered = if layout.center.is_centered() {
            vec![0.0; head_dim]
        } else {
            Vec::new()
        };
        // A stream that asks for the fast-scan order holds its records in whole blocks of 32
        // whichever order its codec takes (the plain codec's rows until a fit of nibble
        // groups, and again after a clear): its memory, and the formula that counts it, do not
        // depend on the fit, and a change of order keeps its pages.
        let (body_order, planes) = body_layout(layout.order, &codec);
        let mut body = match layout.order {
            RecordOrder::FastScan => TokenStore::in_blocks(
                codec.record_words(),
                codec.scales_per_token(),
                body_growth,
                body_order,
            )?,
            RecordOrder::Rows => TokenStore::with_order(
                codec.record_words(),
                codec.scales_per_token(),
                body_growth,
                body_order,
            )?,
        };
        body.set_planes(planes)?;
        let heavy = match layout.heavy_hitters {
            Some(factor) if windowed => Some(HeavyHitters::new(factor, &recent_codec)?),
            _ => None,
        };
        Ok(Self {
            layout,
            body,
            staged: (
                vec![0; codec.record_words()],
                vec![f16::ZERO; codec.scales_per_token()],
            ),
            sinks: store_of(&fp_codec, sink_tokens)?,
            recent: store_of(&recent_codec, recent_slots)?,
            centered,
            center_angles: None,
            evicted: if deferred {
                vec![0.0; head_dim]
            } else {
                Vec::new()
            },
            codec,
            fp_codec,
            recent_codec,
            deferred,
            sink_tokens,
            recent_tokens,
            recent_fraction,
            recent_slots,
            initial_slots: recent_slots,
            ring_slots: ring,
            len: 0,
            oldest_body: 0,
            oldest_recent: 0,
            step: StepCopies::default(),
            heavy,
        })
    }

    /// The layout the stream was built from (what a saved cache records).
    pub fn layout(&self) -> &StreamLayout {
        &self.layout
    }

    /// Tokens appended so far (in ring mode, including those the ring has overwritten).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body codec.
    pub fn codec(&self) -> &TokenCodec {
        &self.codec
    }

    /// The full-precision codec of the sink copies (and of the recent copies unless the layout
    /// gives those their own: [`recent_codec`](Self::recent_codec)).
    pub fn fp_codec(&self) -> &TokenCodec {
        &self.fp_codec
    }

    /// The codec of the recent window's copies.
    pub fn recent_codec(&self) -> &TokenCodec {
        &self.recent_codec
    }

    /// Whether the window's tokens have no codes until they leave it (an 8-bit window: see the
    /// module docs); the body then holds [`body_tokens`](Self::body_tokens) records.
    pub fn defers_codes(&self) -> bool {
        self.deferred
    }

    /// Records the body holds when `len` tokens were appended (growing streams): `len`, or
    /// `len − window(len)` when the window's tokens wait for their codes.
    pub fn body_tokens(&self, len: usize) -> usize {
        if self.deferred {
            len.saturating_sub(self.window(len))
        } else {
            len
        }
    }

    /// The recent window's tokens when `held` tokens are held ([`window_tokens`] of the
    /// layout's count and fraction; 0 without a window and in ring mode).
    pub fn window(&self, held: usize) -> usize {
        if self.windowed() {
            window_tokens(self.recent_tokens, self.recent_fraction, held)
        } else {
            0
        }
    }

    /// Whether the stream keeps a recent window (its ring has slots; never in ring mode).
    fn windowed(&self) -> bool {
        self.recent_slots > 0
    }

    /// Slots of the recent ring now (0 without a window): the window at a fixed capacity plus
    /// the rewind margin, or in a stream that grows in pages, a ring that grows (at least twice
    /// as long) as the window does.
    pub fn recent_slots(&self) -> usize {
        self.recent_slots
    }

    /// The compressed records.
    pub fn body(&self) -> &TokenStore {
        &self.body
    }

    /// The heavy-hitter state ([`heavy_hitters`](crate::heavy_hitters)): `None` for a stream
    /// whose layout asks for none or that keeps no window.
    pub fn heavy_hitters(&self) -> Option<&HeavyHitters> {
        self.heavy.as_ref()
    }

    /// The first token at or after `t` read from a kept heavy-hitter copy (in
    /// [`recent_codec`](Self::recent_codec)) rather than its codes, outside sinks and windows.
    /// Kernels end a run of body records there.
    pub fn next_kept(&self, t: usize) -> Option<usize> {
        self.heavy.as_ref()?.next_kept(t)
    }

    /// The kept heavy hitters within `range`, ascending ([`HeavyHitters::kept_within`]).
    pub fn kept_within(&self, range: std::ops::Range<usize>) -> &[u32] {
        self.heavy
            .as_ref()
            .map_or(&[], |heavy| heavy.kept_within(range))
    }

    /// The first kept heavy hitters within `range` whose copies lie together, and those
    /// copies' words and scales ([`HeavyHitters::copies_within`]).
    pub fn kept_copies_within(
        &self,
        range: std::ops::Range<usize>,
    ) -> Option<(&[u32], &[u32], &[f16])> {
        self.heavy.as_ref()?.copies_within(range)
    }

    /// Token `t`'s kept heavy-hitter copy (words, scales in
    /// [`recent_codec`](Self::recent_codec)), if it has one.
    pub fn kept_copy(&self, t: usize) -> Option<(&[u32], &[f16])> {
        self.heavy.as_ref()?.copy(t)
    }

    /// Bytes of the kept heavy-hitter copies and their indices, by formula (data-dependent,
    /// so not in [`fixed_bytes`](Self::fixed_bytes)).
    pub fn kept_bytes(&self) -> usize {
        self.heavy.as_ref().map_or(0, HeavyHitters::kept_bytes)
    }

    /// Adds what one query row gave this stream's window tokens (`weights[i]` for token
    /// `row.first + i`; the row reads its own window, as in a step) to the heavy-hitter counts.
    pub(crate) fn add_received(&mut self, row: GatheredRow, weights: &[f32]) {
        let from = self
            .window_start(row.end, true)
            .max(self.sink_end())
            .max(row.first);
        let Some(heavy) = &mut self.heavy else {
            return;
        };
        let uniform = 1.0 / row.visible.max(1) as f32;
        if from < row.end {
            heavy.add_run(
                from,
                &weights[from - row.first..row.end - row.first],
                uniform,
            );
        }
    }

    /// Decides the heavy hitters among the tokens that the next query (a decode step) no
    /// longer reads in its window.
    pub(crate) fn settle_kept(&mut self) -> Result<(), CacheError> {
        let end = self.len + 1;
        self.settle_before(end.saturating_sub(self.window(end)))
    }

    fn settle_before(&mut self, end: usize) -> Result<(), CacheError> {
        let Some(mut heavy) = self.heavy.take() else {
            return Ok(());
        };
        let result = heavy.settle(end, |t| {
            self.recent_copy(t)
                .map(|(_, words, scales)| (words, scales))
        });
        self.heavy = Some(heavy);
        result
    }

    /// Bytes held by every buffer of the stream, measured from the buffers (the mean of a
    /// centered stream included).
    pub fn allocated_bytes(&self) -> usize {
        self.heavy.as_ref().map_or(0, HeavyHitters::allocated_bytes)
            + self.body.allocated_bytes()
            + self.sinks.allocated_bytes()
            + self.recent.allocated_bytes()
            + self.layout.mean.as_ref().map_or(0, |m| 4 * m.capacity())
            + self
                .layout
                .basis_fit
                .as_ref()
                .and_then(BasisFit::fitted)
                .map_or(0, |fit| fit.allocated_bytes())
    }

    /// Bytes stored once rather than per token, by formula: the sink and recent copies
    /// (allocated at creation, each in its codec) and, once chosen, the mean of a centered
    /// stream (`4·head_dim`) and a fitted basis
    /// ([`FittedBasis::bytes`](crate::basis::FittedBasis::bytes)).
    pub fn fixed_bytes(&self) -> usize {
        self.sink_tokens * self.fp_codec.bytes_per_token()
            + self.recent_slots * self.recent_codec.bytes_per_token()
            + self.layout.center.mean_bytes(self.layout.head_dim())
                * usize::from(self.layout.mean.is_some())
            + self
                .layout
                .basis_fit
                .as_ref()
                .and_then(BasisFit::fitted)
                .map_or(0, |fit| fit.bytes())
    }

    /// The stream's basis policy.
    pub fn basis(&self) -> BasisPolicy {
        self.layout.basis
    }

    /// What a basis stream decided from its first batch (`None` before it, or without a basis).
    pub fn basis_fit(&self) -> Option<&BasisFit> {
        self.layout.basis_fit.as_ref()
    }

    /// The stream's centering policy.
    pub fn center(&self) -> CenterPolicy {
        self.layout.center
    }

    /// For a `center = "rope"` stream whose `m` is chosen: `m`, the RoPE pairs and a table of
    /// block angles covering its tokens — what a kernel needs to add each block's `q·c(t)` back
    /// ([`rope_center::score_bias`](crate::rope_center::score_bias)); `None` otherwise.
    pub fn rope_center(
        &self,
    ) -> Option<(
        &[f32],
        crate::basis::RopePairs,
        std::sync::Arc<crate::rope_center::CenterAngles>,
    )> {
        let mean = self.layout.mean.as_deref()?;
        let angles = self.angles_covering(self.len.max(1) - 1)?;
        Some((mean, self.layout.rope_pairs, angles))
    }

    /// The block angles of a `center = "rope"` stream covering token `t`: the kept table when
    /// it does, else the process-wide one; `None` for any other stream.
    fn angles_covering(
        &self,
        t: usize,
    ) -> Option<std::sync::Arc<crate::rope_center::CenterAngles>> {
        match &self.center_angles {
            Some(a) if a.blocks() * crate::rope_center::CENTER_BLOCK > t => Some(a.clone()),
            _ => self.layout.center_angles(t),
        }
    }

    /// The mean `μ` a centered stream subtracts from every vector it stores, once chosen from
    /// its first batch (all zero if that batch was too short); `None` for a stream that is not
    /// centered or has not seen a token since it was created or emptied.
    pub fn mean(&self) -> Option<&[f32]> {
        self.layout.mean.as_deref()
    }

    /// Appends one token. A centered stream stores `x − μ` (body, sink and recent copies); a
    /// `center = "rope"` stream `x − c(t)`, its mean turned to token `t`'s block.
    pub fn push(&mut self, x: &[f32], scratch: &mut CodecScratch) -> Result<(), CacheError> {
        // Taken out for the push (and put back) so the stored vector can borrow it while the
        // stores are written.
        let mut centered = std::mem::take(&mut self.centered);
        let t = self.len;
        if self.layout.center.turns_with_position()
            && self
                .center_angles
                .as_ref()
                .is_none_or(|a| a.blocks() * crate::rope_center::CENTER_BLOCK <= t)
        {
            self.center_angles = self.layout.center_angles(t);
        }
        let stored = match &self.layout.mean {
            Some(mean) => {
                if x.len() != mean.len() {
                    self.centered = centered;
                    return Err(CacheError::Codec(CodecError::LengthMismatch {
                        what: "input vector",
                        expected: mean.len(),
                        actual: x.len(),
                    }));
                }
                match &self.center_angles {
                    Some(angles) => {
                        let pairs = self.layout.rope_pairs;
                        crate::rope_center::center_at(mean, t, pairs, angles, &mut centered);
                        for (c, &v) in centered.iter_mut().zip(x) {
                            *c = v - *c;
                        }
                    }
                    None => {
                        for ((c, &v), &m) in centered.iter_mut().zip(x).zip(mean) {
                            *c = v - m;
                        }
                    }
                }
                &centered[..]
            }
            None => x,
        };
        let result = self.push_stored(stored, scratch);
        self.centered = centered;
        result
    }

    /// [`push`](Self::push) of a vector already in the stored domain.
    fn push_stored(&mut self, x: &[f32], scratch: &mut CodecScratch) -> Result<(), CacheError> {
        let t = self.len;
        // A body whose window's tokens wait for their codes may still have room when the
        // window grows: the capacity bounds the tokens, not the records.
        if let (None, Growth::Static { capacity }) = (self.ring_slots, self.layout.growth)
            && t >= capacity
        {
            return Err(CacheError::ContextOverflow { capacity });
        }
        let needed = self.window(t + 1) + self.layout.max_rewind;
        if self.recent_slots > 0 && needed > self.recent_slots {
            self.grow_ring(needed.max(2 * self.recent_slots))?;
        }
        match self.ring_slots {
            Some(slots) => {
                self.write_body(t % slots, x, scratch)?;
                self.oldest_body = self.oldest_body.max((t + 1).saturating_sub(slots));
            }
            None if self.deferred => {
                // Token t − W(t) leaves the window unless the window grows by one: its codes
                // are written now, from its copy, before token t's copy may take its slot. A
                // window of no tokens yet (a fraction of few tokens held) lets token t leave
                // as it arrives: its codes come from its copy once written, below.
                let old = self.body.len();
                if old < self.body_tokens(t + 1) && old < t {
                    self.write_codes_from_copy(old, scratch)?;
                }
            }
            None => self.write_body(t, x, scratch)?,
        }
        let mut copied = self.push_copies(t, x, scratch);
        if copied.is_ok() && self.deferred && self.body.len() < self.body_tokens(t + 1) {
            copied = self.write_codes_from_copy(t, scratch);
        }
        if let Err(e) = copied {
            // Leave the stream as it was: no codes (or copies) for a token that did not go in.
            if self.ring_slots.is_none() {
                self.body.truncate(self.body_tokens(t));
            }
            self.sinks.truncate(t.min(self.sink_tokens));
            return Err(e);
        }
        self.len += 1;
        if let Some(heavy) = &mut self.heavy
            && t >= self.sink_tokens
        {
            heavy.track(t);
        }
        Ok(())
    }

    /// Writes token `t`'s codes (the next record of the body) from its window copy: what an
    /// 8-bit window does as a token leaves it.
    fn write_codes_from_copy(
        &mut self,
        t: usize,
        scratch: &mut CodecScratch,
    ) -> Result<(), CacheError> {
        let (record, scales) =
            self.recent
                .record(t % self.recent_slots)
                .ok_or(CacheError::ShapeMismatch {
                    what: "window copy of the token leaving the window",
                    expected: t,
                    actual: self.recent.len(),
                })?;
        self.recent_codec
            .decode_into(record, scales, scratch, &mut self.evicted)?;
        let evicted = std::mem::take(&mut self.evicted);
        let written = self.write_body(t, &evicted, scratch);
        self.evicted = evicted;
        written
    }

    /// Encodes `x` into body slot `slot`: a new record when `slot` is the body's length, an
    /// overwrite (a ring) otherwise. Nothing is stored when the codec refuses `x`.
    fn write_body(
        &mut self,
        slot: usize,
        x: &[f32],
        scratch: &mut CodecScratch,
    ) -> Result<(), CacheError> {
        let (words, scales) = &mut self.staged;
        // Sized here: a calibration may change the codec.
        words.clear();
        words.resize(self.codec.record_words(), 0);
        scales.clear();
        scales.resize(self.codec.scales_per_token(), f16::ZERO);
        self.codec.encode_into(x, scratch, words, scales)?;
        if slot < self.body.len() {
            self.body.write_record(slot, words, scales)
        } else {
            self.body.push_record(words, scales)
        }
    }

    /// Moves the recent ring to `slots` slots (more than it has): every copy still held keeps
    /// its token, now at `t mod slots`. The new ring is filled to all its slots, so a saved
    /// stream records its slots in its ring's length.
    fn grow_ring(&mut self, slots: usize) -> Result<(), CacheError> {
        let mut ring = TokenStore::new(
            self.recent_codec.record_words(),
            self.recent_codec.scales_per_token(),
            Growth::Static { capacity: slots },
        )?;
        for _ in 0..slots {
            ring.push()?;
        }
        let from = self
            .oldest_recent
            .max(self.len.saturating_sub(self.recent_slots));
        for t in from..self.len {
            if let Some((words, scales)) = self.recent.record(t % self.recent_slots) {
                let (to, to_scales) = ring.record_mut(t % slots)?;
                to.copy_from_slice(words);
                to_scales.copy_from_slice(scales);
            }
        }
        self.recent = ring;
        self.recent_slots = slots;
        Ok(())
    }

    /// The ring as the stream was built (a cleared stream's, or a fresh one about to read a
    /// saved ring of `slots` slots).
    fn reset_ring(&mut self, slots: usize) -> Result<(), CacheError> {
        if slots != self.recent_slots || self.recent.len() > slots {
            self.recent = TokenStore::new(
                self.recent_codec.record_words(),
                self.recent_codec.scales_per_token(),
                Growth::Static { capacity: slots },
            )?;
            self.recent_slots = slots;
        }
        Ok(())
    }

    /// Writes token `t`'s sink and recent copies.
    fn push_copies(
        &mut self,
        t: usize,
        x: &[f32],
        scratch: &mut CodecScratch,
    ) -> Result<(), CacheError> {
        if t < self.sink_tokens {
            let (record, scales) = self.sinks.push()?;
            self.fp_codec.encode_into(x, scratch, record, scales)?;
        }
        if self.recent_slots > 0 {
            let slot = t % self.recent_slots;
            // After a rewind the ring already holds (stale) records past `slot`: overwrite them.
            let (record, scales) = if slot < self.recent.len() {
                self.recent.record_mut(slot)?
            } else {
                self.recent.push()?
            };
            self.recent_codec.encode_into(x, scratch, record, scales)?;
            self.oldest_recent = self
                .oldest_recent
                .max((t + 1).saturating_sub(self.recent_slots));
            if let Some((record, scales)) = self.recent.record(slot) {
                self.step.push(record, scales);
            }
        }
        Ok(())
    }

    /// Starts a step (a batch about to be pushed): keeps full-precision copies of the
    /// `recent_tokens − 1` tokens before it, which the batch's first queries read in their
    /// windows and which the batch's own copies may overwrite in the ring.
    pub(crate) fn begin_step(&mut self) {
        if self.recent_slots == 0 {
            return;
        }
        // The whole window before the batch (its first queries read the last `recent − 1`
        // of it): a batch that fails part-way is rolled back from these copies (`truncate`).
        let first = self
            .len
            .saturating_sub(self.window(self.len))
            .max(self.oldest_recent);
        // Tokens no query of the batch reads in its window are decided while their copies are
        // still held (a stream appended to without attention has counted nothing for them).
        // The heavy-hitter copy cannot fail but on allocation: a token that fails is not kept.
        let _ = self.settle_before(first);
        // The previous step's copies reach `len` (its batch pushed its own) and the ring has
        // not changed under them since (a rewind or a clear empties them): keep them.
        if self.step.count > 0
            && self.step.first <= first
            && self.step.first + self.step.count == self.len
        {
            self.step.drop_before(first);
            return;
        }
        self.step.clear(first);
        for t in first..self.len {
            if let Some((record, scales)) = self.recent.record(t % self.recent_slots) {
                self.step.push(record, scales);
            }
        }
    }

    /// The first token that a query whose visible tokens end at `end` (exclusive) reads from
    /// a full-precision copy rather than the codes (sinks aside; `len` when none does).
    ///
    /// Without `in_step` — attention over a stored cache — that is the recent window
    /// `[len − window(len), len)`, whatever the query. With `in_step` — the queries of the
    /// batch just appended — each query reads its own newest `window(end)` tokens,
    /// `[end − window(end), end)`: what a decode step at that query reads, so a prefill batch
    /// of any length gives every query the window decoding would (a superset of the recent
    /// window for the tokens the query sees).
    pub fn window_start(&self, end: usize, in_step: bool) -> usize {
        let recent = self.recent_start();
        if !in_step || !self.windowed() {
            return recent;
        }
        let covered = if self.step.count == 0 {
            recent
        } else {
            self.step.first.min(recent)
        };
        end.saturating_sub(self.window(end))
            .max(covered)
            .min(recent)
    }

    /// The full-precision copy of token `t` and its codec, in the stored domain: a sink (in
    /// [`fp_codec`](Self::fp_codec)), a recent copy or a copy of the current step (in
    /// [`recent_codec`](Self::recent_codec)); `None` when the stream holds none.
    pub fn full_precision(&self, t: usize) -> Option<(&TokenCodec, &[u32], &[f16])> {
        if t >= self.len {
            return None;
        }
        let with = |codec, (record, scales)| (codec, record, scales);
        if t < self.sink_end() {
            return self.sinks.record(t).map(|r| with(&self.fp_codec, r));
        }
        self.recent_copy(t)
    }

    /// Token `t`'s copy in the recent window (or the current step), in
    /// [`recent_codec`](Self::recent_codec) — also for a sink, whose window copy
    /// [`full_precision`](Self::full_precision) does not show: an 8-bit window writes every
    /// token's codes from this copy, sinks included. `None` when the stream holds none.
    pub fn recent_copy(&self, t: usize) -> Option<(&TokenCodec, &[u32], &[f16])> {
        if t >= self.len {
            return None;
        }
        let with = |codec, (record, scales)| (codec, record, scales);
        if self.recent_slots > 0 && t >= self.recent_start() && t >= self.oldest_recent {
            return self
                .recent
                .record(t % self.recent_slots)
                .map(|r| with(&self.recent_codec, r));
        }
        self.step.record(t).map(|r| with(&self.recent_codec, r))
    }

    /// The copies of consecutive tokens from `t`, as [`recent_copy`](Self::recent_copy) gives
    /// them one at a time: `(codec, words, scales, n)` for tokens `t..t + n`, `n ≤ limit`, the
    /// longest run that lies in one store (the ring up to its wrap, or the current step's
    /// copies). `None` when the stream holds no copy of `t`. Kernels walk a window run by run.
    pub fn recent_copies(
        &self,
        t: usize,
        limit: usize,
    ) -> Option<(&TokenCodec, &[u32], &[f16], usize)> {
        let limit = limit.min(self.len.saturating_sub(t));
        let ring_from = self.recent_start().max(self.oldest_recent);
        let (words, scales, n) = if self.recent_slots > 0 && t >= ring_from {
            let slot = t % self.recent_slots;
            self.recent.run(slot, limit.min(self.recent_slots - slot))?
        } else if self.recent_slots > 0 {
            self.step.run(t, limit.min(ring_from - t))?
        } else {
            self.step.run(t, limit)?
        };
        Some((&self.recent_codec, words, scales, n))
    }

    /// The slot of token `t`'s compressed record in [`body`](Self::body).
    pub fn body_slot(&self, t: usize) -> usize {
        self.ring_slots.map_or(t, |slots| t % slots)
    }

    /// The record a query reads for token `t` when its full-precision window starts at
    /// `window_start` ([`window_start`](Self::window_start)): the full-precision copy for a
    /// sink or a token of the window, the compressed record otherwise.
    pub fn read(&self, t: usize, window_start: usize) -> Option<StoredRecord<'_>> {
        if t >= self.len || t < self.first_stored() {
            return None;
        }
        if t < self.sink_end() || t >= window_start {
            let (codec, record, scales) = self.full_precision(t)?;
            return Some((codec, Cow::Borrowed(record), scales));
        }
        if let Some((record, scales)) = self.kept_copy(t) {
            return Some((&self.recent_codec, Cow::Borrowed(record), scales));
        }
        let (record, scales) = self.body.record_copy(self.body_slot(t))?;
        Some((&self.codec, record, scales))
    }

    /// Where token `t` (< len, still stored) must be read from.
    pub fn source(&self, t: usize) -> TokenSource {
        if let Some(slots) = self.ring_slots {
            return TokenSource::Body(t % slots);
        }
        if t < self.sink_tokens {
            TokenSource::Sink(t)
        } else if self.windowed() && t + self.window(self.len) >= self.len {
            TokenSource::Recent(t % self.recent_slots)
        } else {
            TokenSource::Body(t)
        }
    }

    /// Tokens from here to `len` are read from full-precision recent copies (`len` if none).
    pub fn recent_start(&self) -> usize {
        self.len.saturating_sub(self.window(self.len))
    }

    /// Tokens before this are read from full-precision sink copies.
    pub fn sink_end(&self) -> usize {
        self.sink_tokens.min(self.len)
    }

    /// The oldest token still stored (a ring forgets what it overwrote).
    pub fn first_stored(&self) -> usize {
        self.oldest_body
    }

    /// The record and codec of token `t`, in the stored domain (`x − μ` for a centered
    /// stream, see [`mean`](Self::mean)): what [`source`](Self::source) names, i.e.
    /// [`read`](Self::read) with the stream-wide recent window.
    pub fn token(&self, t: usize) -> Option<StoredRecord<'_>> {
        self.read(t, self.recent_start())
    }

    /// Decodes token `t` into `out` **in the stored domain**: `x − μ` for a centered stream
    /// (what every attention kernel reads), `x` otherwise. [`reconstruct`](Self::reconstruct)
    /// gives the true vector.
    pub fn decode(
        &self,
        t: usize,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CacheError> {
        self.decode_read(t, self.recent_start(), scratch, out)?;
        Ok(())
    }

    /// [`decode`](Self::decode) of the record [`read`](Self::read) gives for a query whose
    /// full-precision window starts at `window_start`; returns the codec it decoded with.
    pub fn decode_read(
        &self,
        t: usize,
        window_start: usize,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<&TokenCodec, CacheError> {
        let (codec, record, scales) =
            self.read(t, window_start)
                .ok_or(CacheError::ShapeMismatch {
                    what: "token index",
                    expected: self.len,
                    actual: t,
                })?;
        codec.decode_into(&record, scales, scratch, out)?;
        Ok(codec)
    }

    /// Decodes token `t` into `out` as a true vector: [`decode`](Self::decode) plus the mean of
    /// a centered stream (the same as `decode` for a stream that is not centered).
    pub fn reconstruct(
        &self,
        t: usize,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CacheError> {
        self.decode(t, scratch, out)?;
        self.add_center(t, out);
        Ok(())
    }

    /// Adds to `out` (a decoded token `t` in the stored domain) what a centered stream
    /// subtracted from it: `μ`, or for `center = "rope"` the center `c(t)` of its block
    /// ([`rope_center`](crate::rope_center)); nothing for a stream that is not centered.
    pub fn add_center(&self, t: usize, out: &mut [f32]) {
        let Some(mean) = self.mean() else {
            return;
        };
        match self.angles_covering(t) {
            Some(angles) => {
                let mut center = vec![0.0f32; mean.len()];
                let pairs = self.layout.rope_pairs;
                crate::rope_center::center_at(mean, t, pairs, &angles, &mut center);
                for (o, m) in out.iter_mut().zip(&center) {
                    *o += m;
                }
            }
            None => {
                for (o, m) in out.iter_mut().zip(mean) {
                    *o += m;
                }
            }
        }
    }

    /// Whether the next append must calibrate first: choose the outlier channels of a two-tier
    /// stream, the mean of a centered one or the basis of a basis stream, from its first batch.
    pub fn needs_calibration(&self) -> bool {
        self.len == 0 && self.layout.needs_calibration()
    }

    fn needs_basis(&self) -> bool {
        self.layout.needs_basis()
    }

    /// Whether the next append fits a plane basis, which needs the energy of the queries the
    /// first batch comes with (see [`KvCache::append_with_queries`](crate::kv_cache::KvCache::append_with_queries)).
    pub fn needs_query_energy(&self) -> bool {
        self.len == 0 && self.layout.needs_query_energy()
    }

    fn needs_mean(&self) -> bool {
        self.layout.needs_mean()
    }

    /// Calibrates from `tokens` (`[n, head_dim]`, the first appended batch) as
    /// [`StreamLayout::calibrated`] chooses, and rebuilds the codec if the outlier channels or
    /// the basis changed (the record size does not change). On error nothing changes.
    pub(crate) fn calibrate(
        &mut self,
        tokens: &[f32],
        query_energy: Option<&[f64]>,
    ) -> Result<(), CacheError> {
        let layout = self.layout.calibrated(tokens, query_energy)?;
        if layout.channels != self.layout.channels || layout.basis_fit != self.layout.basis_fit {
            self.codec = layout.build_codec()?;
            self.layout = layout;
            // Calibration comes before the first token, so the body is empty.
            return self.match_body_order();
        }
        self.layout = layout;
        Ok(())
    }

    /// Puts an empty body in the order its codec takes ([`body_order`]) when the codec
    /// changed with a calibration or a clear (a fitted basis of nibble groups may take the
    /// fast-scan order where the plain codec does not), keeping its pages
    /// ([`TokenStore::reorder`]). A body that holds tokens is left as it is.
    fn match_body_order(&mut self) -> Result<(), CacheError> {
        let (order, planes) = body_layout(self.layout.order, &self.codec);
        if (order != self.body.order() || self.body.planes() != planes.as_ref())
            && self.body.is_empty()
        {
            self.body.reorder(order)?;
            self.body.set_planes(planes)?;
        }
        Ok(())
    }

    /// Forgets every token (allocations are kept for reuse).
    pub(crate) fn clear(&mut self) {
        self.forget_calibration();
        self.len = 0;
        self.oldest_body = 0;
        self.oldest_recent = 0;
        self.body.truncate(0);
        self.sinks.truncate(0);
        self.recent.truncate(0);
        // A ring that grew returns to its first size, as a saved empty stream reloads it (the
        // size it was built with, so this cannot fail).
        let _ = self.reset_ring(self.initial_slots);
        self.step.clear(0);
        if let Some(heavy) = &mut self.heavy {
            heavy.clear();
        }
        // Back to the uncalibrated codec's order; a body that cannot be reallocated keeps its
        // order, which reads and writes the same records.
        let _ = self.match_body_order();
    }

    /// Checks that dropping every token from `new_len` on leaves exactly the state that
    /// appending only `new_len` tokens would have built, for a layer whose queries look back
    /// `window` tokens (`None`: all of them).
    pub(crate) fn check_rewind(
        &self,
        new_len: usize,
        window: Option<usize>,
    ) -> Result<(), CacheError> {
        let requested = self.len.saturating_sub(new_len);
        // The next query (position new_len) sees tokens from `needed` on.
        let needed = window.map_or(0, |w| (new_len + 1).saturating_sub(w));
        if self.oldest_body > needed {
            return Err(CacheError::RewindTooFar {
                requested,
                reason: "the ring buffer has overwritten tokens the window would need again",
            });
        }
        if self.windowed() && self.oldest_recent > new_len.saturating_sub(self.window(new_len)) {
            return Err(CacheError::RewindTooFar {
                requested,
                reason: "full-precision copies of the tokens that would become recent are gone (raise max_rewind)",
            });
        }
        Ok(())
    }

    /// Drops tokens from `new_len` on; call [`check_rewind`](Self::check_rewind) first.
    pub(crate) fn truncate(&mut self, new_len: usize) {
        if new_len >= self.len {
            // A first batch that failed before any token went in still calibrated the stream
            // from that batch: forget it, so the next first batch calibrates afresh.
            if new_len == 0 {
                self.forget_calibration();
            }
            return;
        }
        self.len = new_len;
        // Copies the batch overwrote in the ring (a batch that failed part-way, rolled back
        // without `check_rewind`) come back from the step's copies of the window before it, so
        // the window is whole again; an 8-bit window writes its tokens' codes from them later.
        if self.recent_slots > 0 {
            let from = new_len.saturating_sub(self.window(new_len));
            let mut restored = new_len;
            for t in (from..new_len).rev() {
                let Some((record, scales)) = self.step.record(t) else {
                    break;
                };
                let slot = t % self.recent_slots;
                if let Ok((to, to_scales)) = self.recent.record_mut(slot) {
                    to.copy_from_slice(record);
                    to_scales.copy_from_slice(scales);
                    restored = t;
                }
            }
            self.oldest_recent = self.oldest_recent.min(restored);
        }
        // The step's copies belong to the batch as it was written.
        self.step.clear(new_len);
        // A ring that has wrapped stays full: its slots past `new_len` are stale but unread.
        let body_len = self.body_tokens(new_len);
        if self.body.len() > body_len && self.oldest_body == 0 {
            self.body.truncate(body_len);
        }
        self.oldest_body = self.oldest_body.min(new_len);
        self.sinks.truncate(new_len.min(self.sink_tokens));
        if let Some(heavy) = &mut self.heavy {
            heavy.truncate(new_len);
        }
        if new_len == 0 {
            self.forget_calibration();
        }
    }

    /// An empty stream chooses its mean, outlier channels and basis again from its next first
    /// batch, exactly as a stream that never saw the dropped tokens would.
    fn forget_calibration(&mut self) {
        let layout = self.layout.uncalibrated();
        let rebuild =
            layout.channels != self.layout.channels || layout.basis_fit != self.layout.basis_fit;
        self.layout = layout;
        if rebuild && let Ok(codec) = self.layout.build_codec() {
            self.codec = codec;
        }
    }

    /// Appends the stream's state to a saved-cache body.
    pub(crate) fn write_to(&self, out: &mut crate::persist::ByteWriter) {
        out.u64(self.len as u64);
        out.u64(self.oldest_body as u64);
        out.u64(self.oldest_recent as u64);
        for store in [&self.body, &self.sinks, &self.recent] {
            out.store(store);
        }
        if let Some(heavy) = &self.heavy {
            heavy.write_to(out);
        }
    }

    /// Restores what [`write_to`](Self::write_to) wrote into a freshly built, empty stream.
    pub(crate) fn read_from(
        &mut self,
        input: &mut crate::persist::ByteReader<'_>,
    ) -> Result<(), crate::persist::PersistError> {
        // The step's copies are of the tokens held before.
        self.step.clear(0);
        self.len = input.usize()?;
        self.oldest_body = input.usize()?;
        self.oldest_recent = input.usize()?;
        input.store(&mut self.body)?;
        input.store(&mut self.sinks)?;
        // A ring longer than the built one grew with its window (grown rings are full).
        let saved = input.store_len(&self.recent)?;
        if saved > self.initial_slots {
            let grows = self.recent_fraction.is_some()
                && matches!(self.layout.growth, Growth::Doubling { .. });
            if !grows {
                return Err(crate::persist::PersistError::Inconsistent(
                    "a recent ring longer than its stream's window needs",
                ));
            }
            self.reset_ring(saved)
                .map_err(crate::persist::PersistError::Cache)?;
        }
        input.store(&mut self.recent)?;
        let len = self.len;
        if let Some(heavy) = &mut self.heavy {
            heavy.read_from(input, len)?;
        }
        let stored = self.body.len();
        let consistent = match self.ring_slots {
            Some(slots) => stored == self.len.min(slots) || stored == slots,
            None => stored == self.body_tokens(self.len),
        } && self.oldest_body <= self.len
            && self.oldest_recent <= self.len
            && self.sinks.len() == self.len.min(self.sink_tokens)
            && self.recent.len() <= self.recent_slots;
        if !consistent {
            return Err(crate::persist::PersistError::Inconsistent(
                "stream lengths disagree",
            ));
        }
        // Centered records are meaningless without the mean they were centered on.
        if self.len > 0 && self.needs_mean() {
            return Err(crate::persist::PersistError::Inconsistent(
                "a centered stream holds tokens but no mean",
            ));
        }
        if self.len > 0 && self.needs_basis() {
            return Err(crate::persist::PersistError::Inconsistent(
                "a basis stream holds tokens but no basis",
            ));
        }
        Ok(())
    }
}
