//! What resolving an allocation gives for one stream: the codec spec(s) and their exact cost.

use std::fmt;

use crate::basis::BasisPolicy;
use crate::center::CenterPolicy;
use crate::codec::packing::words_for;
use crate::two_tier::{TwoTierCodec, TwoTierError};
use crate::{CodecSpec, TokenCodec};

/// The keys or the values of a KV head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// The key vectors.
    Key = 0,
    /// The value vectors.
    Value = 1,
}

impl StreamKind {
    /// Both streams, keys first.
    pub const BOTH: [StreamKind; 2] = [StreamKind::Key, StreamKind::Value];

    /// The TOML table name (`key` / `value`).
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Key => "key",
            StreamKind::Value => "value",
        }
    }
}

impl fmt::Display for StreamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The dimensions of a model's KV cache that an allocation is resolved against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelShape {
    /// Transformer layers.
    pub num_layers: usize,
    /// KV heads per layer.
    pub num_kv_heads: usize,
    /// Dimension of one key or value vector.
    pub head_dim: usize,
}

/// How one stream (the keys or values of one KV head of one layer) is stored.
///
/// ```
/// use tq_cache::allocation::{Allocation, StreamKind, StreamPlan};
/// let plan = Allocation::preset("tq2.5")?.resolve(0, 32, 0, 128, StreamKind::Key)?;
/// let StreamPlan::TwoTier(tiers) = &plan else { unreachable!() };
/// assert_eq!(tiers.channels, 32);
/// assert_eq!(plan.bytes_per_token(), 40);       // (32·3 + 96·2)/8 code bytes + two f16 norms
/// assert_eq!(plan.bits_per_value(), 2.5);
/// assert_eq!(plan.metadata_bytes_per_head(), 64); // 32 channel indices as u16
/// # Ok::<(), tq_cache::allocation::AllocationError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StreamPlan {
    /// One codec over the whole head.
    Single(CodecSpec),
    /// Two tiers: the outlier channels and the rest, each with its own codec.
    TwoTier(OutlierPlan),
}

/// The two tiers of a stream split by `[outliers]`.
///
/// Which channels are outliers is data (chosen per head from the prefill tokens by
/// [`select_outlier_channels`](crate::two_tier::select_outlier_channels)); the plan fixes only
/// how many, and each tier's codec for its own dimension.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutlierPlan {
    /// Outlier channels per head (`outlier.dim()`).
    pub channels: usize,
    /// The codec of the outlier channels, dimension `channels`.
    pub outlier: CodecSpec,
    /// The codec of the other channels, dimension `head_dim − channels`.
    pub rest: CodecSpec,
}

impl OutlierPlan {
    /// Bytes one token costs: both tiers' records and scales.
    pub fn bytes_per_token(&self) -> usize {
        spec_bytes_per_token(&self.outlier) + spec_bytes_per_token(&self.rest)
    }

    /// Bytes stored once per head, not per token: the outlier channel list as `u16` indices.
    pub fn metadata_bytes_per_head(&self) -> usize {
        2 * self.channels
    }

    /// The head dimension the plan covers.
    pub fn head_dim(&self) -> usize {
        self.outlier.dim() + self.rest.dim()
    }

    /// Builds the two-tier codec for this head's chosen outlier channels (sorted, distinct,
    /// exactly `self.channels` of them).
    pub fn build(&self, channels: Vec<u16>) -> Result<TwoTierCodec, TwoTierError> {
        TwoTierCodec::new(channels, &self.outlier, &self.rest)
    }
}

impl StreamPlan {
    /// The single codec's spec, `None` for a two-tier plan.
    pub fn single(&self) -> Option<&CodecSpec> {
        match self {
            StreamPlan::Single(spec) => Some(spec),
            StreamPlan::TwoTier(_) => None,
        }
    }

    /// The two tiers, `None` for a single-codec plan.
    pub fn two_tier(&self) -> Option<&OutlierPlan> {
        match self {
            StreamPlan::Single(_) => None,
            StreamPlan::TwoTier(plan) => Some(plan),
        }
    }

    /// The head dimension the plan covers.
    pub fn head_dim(&self) -> usize {
        match self {
            StreamPlan::Single(spec) => spec.dim(),
            StreamPlan::TwoTier(plan) => plan.head_dim(),
        }
    }

    /// Bytes one token of this stream costs, everything stored: packed codes, sign words, f16
    /// norms and residual norms of every tier. Equal to what the built codecs'
    /// `bytes_per_token` allocate (computed from the same formulas without building them).
    pub fn bytes_per_token(&self) -> usize {
        match self {
            StreamPlan::Single(spec) => spec_bytes_per_token(spec),
            StreamPlan::TwoTier(plan) => plan.bytes_per_token(),
        }
    }

    /// Stored bits per coordinate per token: `8·bytes_per_token / head_dim`.
    pub fn bits_per_value(&self) -> f64 {
        8.0 * self.bytes_per_token() as f64 / self.head_dim() as f64
    }

    /// Bytes stored once per head rather than per token (the outlier channel list), 0 for a
    /// single codec. The mean of a centered stream is a setting of the stream, not of its
    /// plan: see [`ResolvedStream::metadata_bytes_per_head`].
    pub fn metadata_bytes_per_head(&self) -> usize {
        self.two_tier()
            .map_or(0, OutlierPlan::metadata_bytes_per_head)
    }

    /// Builds the codec of a single-codec plan; `None` for a two-tier plan, whose codec needs
    /// the head's outlier channels ([`OutlierPlan::build`]).
    pub fn build_single(&self) -> Option<Result<TokenCodec, crate::codec::CodecError>> {
        self.single().map(TokenCodec::new)
    }
}

/// Everything an allocation decides for one stream: how each token is stored ([`StreamPlan`])
/// and the settings of the stream as a whole (its mean-centering, basis and recent window). From
/// [`Allocation::resolve_stream`](crate::allocation::Allocation::resolve_stream).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedStream {
    /// How each token is stored.
    pub plan: StreamPlan,
    /// Whether the stream stores `x − μ` (see [`center`](crate::center)).
    pub center: CenterPolicy,
    /// Whether the stream fits a data-aware basis (see [`basis`](crate::basis)).
    pub basis: BasisPolicy,
    /// The widths the basis may give its groups (`basis_bits`; all of 1 to 8 by default).
    pub basis_bits: crate::basis::GroupWidths,
    /// The memory order asked of the stream's records
    /// ([`body_order`](crate::stream::body_order) says which take it).
    pub record_order: crate::record_order::RecordOrder,
    /// The newest tokens the stream keeps unquantized: its own window if a table set one, else
    /// the allocation's top-level one (ignored on sliding-window layers). A count, a fraction
    /// of the tokens held or both: [`RecentWindow::tokens_at`] gives its tokens at a length.
    pub recent: RecentWindow,
    /// The heavy-hitter factor (`heavy_hitters`): a token that drew at least this many times
    /// the uniform share of attention in the window keeps its window copy when it leaves
    /// ([`heavy_hitters`](crate::heavy_hitters)). `None` when no table set it and on
    /// sliding-window layers, which ignore windows.
    pub heavy_hitters: Option<f32>,
}

/// A stream's recent window as the allocation gives it: a token count (`recent_fp_tokens`), a
/// fraction of the tokens held (`recent_fraction`), or both (the count a floor).
///
/// ```
/// use tq_cache::allocation::RecentWindow;
/// let w = RecentWindow { tokens: Some(256), fraction: Some(0.125) };
/// assert_eq!(w.tokens_at(1024), 256); // the floor
/// assert_eq!(w.tokens_at(4096), 512); // an eighth of the tokens held
/// assert_eq!(RecentWindow { tokens: None, fraction: Some(0.125) }.tokens_at(1024), 128);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RecentWindow {
    /// Tokens (`recent_fp_tokens`): the window, or with a fraction its floor.
    pub tokens: Option<usize>,
    /// A fraction of the tokens held (`recent_fraction`), in `[0, 1)`: `round(fraction · n)`
    /// tokens with `n` held, at least `tokens`.
    pub fraction: Option<f64>,
}

impl RecentWindow {
    /// The window's tokens when `held` tokens are held
    /// ([`window_tokens`](crate::stream::window_tokens)): what a cache holding `held` tokens
    /// keeps unquantized, whatever capacity it was built for.
    pub fn tokens_at(&self, held: usize) -> usize {
        crate::stream::window_tokens(self.tokens.unwrap_or(0), self.fraction, held)
    }

    /// Whether the window holds any token at some length: a count above 0 or a fraction
    /// above 0 (what a stream with heavy hitters needs).
    pub fn is_open(&self) -> bool {
        self.tokens.is_some_and(|t| t > 0) || self.fraction.is_some_and(|f| f > 0.0)
    }
}

impl ResolvedStream {
    /// Bytes stored once per head rather than per token: the outlier channel list of a
    /// two-tier plan and the mean of a centered stream (`4·head_dim`). A basis depends on the
    /// data (its rank and groups), so it is counted once fitted, by
    /// [`Stream::fixed_bytes`](crate::stream::Stream::fixed_bytes), not here.
    pub fn metadata_bytes_per_head(&self) -> usize {
        self.plan.metadata_bytes_per_head() + self.center.mean_bytes(self.plan.head_dim())
    }
}

/// Bytes per token of the codec a spec describes, by the formulas of
/// [`TokenCodec::bytes_per_token`] (`4·record_words + 2·scales`); the allocation tests check the
/// two agree for every preset.
pub(crate) fn spec_bytes_per_token(spec: &CodecSpec) -> usize {
    let (words, scales) = match spec {
        CodecSpec::F32 { dim } => (*dim, 0),
        CodecSpec::F16 { dim } => (dim.div_ceil(2), 0),
        CodecSpec::Q8 { dim } => (dim.div_ceil(4), 1),
        CodecSpec::Mse(s) | CodecSpec::DebiasedMse(s) => (words_for(s.dim, s.bits), 1),
        CodecSpec::Prod(s) => (
            words_for(s.dim, s.bits.saturating_sub(1)) + s.dim.div_ceil(32),
            2,
        ),
    };
    4 * words + 2 * scales
}
