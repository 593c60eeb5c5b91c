//! The serde schema of an allocation file: what a user writes, field for field.
//!
//! Stream settings keep `None` for every field the file leaves out, so defaults are applied once,
//! at resolve time, after every override: a patch that switches `qjl` to `gaussian` then also
//! gets the Gaussian default scale, and writing the allocation back out reproduces the file.

use std::fmt;

use serde::{Deserialize, Serialize};
use tq_qjl::{SketchKind, SketchScale};
use tq_rotation::RotationKind;

use crate::allocation::plan::RecentWindow;
use crate::basis::BasisPolicy;
use crate::center::CenterPolicy;
use crate::record_order::RecordOrder;

/// The base seed used when a file gives none ("TQ-ALLOC" in ASCII; below 2⁶³ because TOML
/// integers are signed 64-bit).
pub const DEFAULT_SEED: u64 = 0x5451_2D41_4C4C_4F43;

fn default_seed() -> u64 {
    DEFAULT_SEED
}

/// A whole allocation file: how every key and value stream of a model is stored.
///
/// The fields mirror the TOML keys one to one (`overrides` is the `[[override]]` array); see the
/// [module docs](crate::allocation) for the schema, the defaults and the resolution order.
///
/// ```
/// use tq_cache::allocation::{Allocation, StreamKind};
/// use tq_cache::CodecSpec;
///
/// let allocation = Allocation::from_toml_str(r#"
///     name = "k5v4"
///     key = { codec = "prod", bits = 5, qjl = "haar", shrinkage = 0.7 }
///     value = { codec = "mse", bits = 4 }
///     [[override]]
///     layers = [0, -1]          # first and last layer, whatever the depth
///     key = { codec = "f16" }
/// "#)?;
/// let last = allocation.resolve(29, 30, 0, 64, StreamKind::Key)?;
/// assert_eq!(last.single(), Some(&CodecSpec::F16 { dim: 64 }));
/// let middle = allocation.resolve(10, 30, 0, 64, StreamKind::Key)?;
/// assert_eq!(middle.bytes_per_token(), 44); // 4-bit codes, 1 sign bit, two f16 scales
/// # Ok::<(), tq_cache::allocation::AllocationError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    /// A short identifier (what sweeps print and plot).
    pub name: String,
    /// Free text: what the allocation is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Base seed every rotation and sketch seed is derived from (see
    /// [`derive_seed`](crate::allocation::derive_seed)). Default [`DEFAULT_SEED`].
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The newest tokens kept unquantized, in `fp_dtype` (default 0): every stream's window
    /// unless its own table sets one ([`StreamSettings::recent_fp_tokens`]).
    #[serde(default)]
    pub recent_fp_tokens: usize,
    /// Every stream's window as a fraction of the tokens the cache holds, in `[0, 1)`, unless
    /// its own table sets a window: with `n` tokens held, `max(recent_fp_tokens, round(fraction
    /// · n))` tokens, so the window's share of the bits is the same at every context length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_fraction: Option<f64>,
    /// The first tokens (attention sinks) kept unquantized, in `fp_dtype` (default 0).
    #[serde(default)]
    pub sink_tokens: usize,
    /// The storage of the unquantized sink and recent tokens (default f16).
    #[serde(default)]
    pub fp_dtype: FpDtype,
    /// The storage of the recent window's copies, when not `fp_dtype` (default: `fp_dtype`).
    /// `q8` stores them in 8 bits, and a token's codes are then written only when it leaves
    /// the window (see [`stream`](crate::stream)): the window's tokens cost their 8-bit copy
    /// instead of their codes plus an f16 copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_dtype: Option<RecentDtype>,
    /// Base settings of every key stream (`codec` required).
    pub key: StreamSettings,
    /// Base settings of every value stream (`codec` required).
    pub value: StreamSettings,
    /// `[[override]]` entries, applied in file order after `boundary`; later ones win.
    #[serde(default, rename = "override", skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<LayerOverride>,
    /// `[boundary]`: the first and last layers, applied before the overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary: Option<BoundaryRule>,
    /// `[outliers]`: the two-tier split of quantized streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outliers: Option<OutlierRule>,
}

impl Allocation {
    /// The longest recent window any stream of the allocation can have in a cache holding
    /// `held` tokens: the top-level window or a longer one a stream table sets (base,
    /// `[boundary]`, `[[override]]`), counts and fractions of `held` alike. What a check
    /// against the context length needs. An upper bound, read from the file without a model:
    /// it also counts a top-level window every stream table replaces and windows given to
    /// sliding-window layers (which ignore them).
    ///
    /// ```
    /// use tq_cache::allocation::Allocation;
    /// let a = Allocation::from_toml_str(r#"
    ///     name = "w"
    ///     recent_fp_tokens = 32
    ///     key = { codec = "mse", bits = 4 }
    ///     value = { codec = "mse", bits = 3 }
    ///     [[override]]
    ///     layers = [10]
    ///     key = { recent_fp_tokens = 200 }
    ///     [[override]]
    ///     layers = [11]
    ///     value = { recent_fraction = 0.125, recent_fp_tokens = 64 }
    /// "#)?;
    /// assert_eq!(a.longest_recent_window(1024), 200);
    /// assert_eq!(a.longest_recent_window(4096), 512); // an eighth of 4096 tokens held
    /// assert_eq!(a.longest_recent_window(64), 200);
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn longest_recent_window(&self, held: usize) -> usize {
        let boundary = self.boundary.iter().flat_map(|b| [&b.key, &b.value]);
        let overrides = self.overrides.iter().flat_map(|o| [&o.key, &o.value]);
        [&self.key, &self.value]
            .into_iter()
            .chain(boundary.chain(overrides).flatten())
            .filter_map(StreamSettings::window)
            .chain([self.top_level_window()])
            .map(|w| w.tokens_at(held))
            .max()
            .unwrap_or(0)
    }
}

/// The storage format of the tokens an allocation keeps unquantized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FpDtype {
    /// IEEE half precision.
    #[default]
    F16,
    /// f32.
    F32,
}

/// The storage format of the recent window's copies (`recent_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecentDtype {
    /// IEEE half precision.
    F16,
    /// f32.
    F32,
    /// Absmax int8 with an f16 step per token ([`CodecSpec::Q8`](crate::CodecSpec::Q8)):
    /// `8 + 16/d` bits per value, and no codes while a token is in the window.
    Q8,
}

/// Which codec a stream uses; the TOML spelling is in parentheses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CodecKind {
    /// Uncompressed f32 (`f32`).
    F32,
    /// Half precision (`f16`).
    F16,
    /// TQ_mse, `bits` 1..=8 (`mse`).
    Mse,
    /// TQ_prod: `bits − 1` MSE bits plus a 1-bit QJL sketch, `bits` 2..=9 (`prod`).
    Prod,
    /// TQ_mse codes scored through the debiased estimator, `bits` 1..=8 (`debiased-mse`).
    DebiasedMse,
}

impl CodecKind {
    /// Whether the codec quantizes (takes `bits`, a rotation and an f16 norm).
    pub fn is_quantized(self) -> bool {
        !matches!(self, CodecKind::F32 | CodecKind::F16)
    }

    /// The supported `bits` range, `None` for the unquantized codecs.
    pub fn bits_range(self) -> Option<(u8, u8)> {
        match self {
            CodecKind::F32 | CodecKind::F16 => None,
            CodecKind::Mse | CodecKind::DebiasedMse => Some((1, 8)),
            CodecKind::Prod => Some((2, 9)),
        }
    }

    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CodecKind::F32 => "f32",
            CodecKind::F16 => "f16",
            CodecKind::Mse => "mse",
            CodecKind::Prod => "prod",
            CodecKind::DebiasedMse => "debiased-mse",
        }
    }
}

impl fmt::Display for CodecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The settings of one stream, or a partial patch of them.
///
/// In the base `key`/`value` tables `codec` is required; in `[[override]]`, `[boundary]` and
/// `[outliers]` every field is optional and only the fields given replace what is in force.
/// `None` means "not given": defaults are filled in after all patches (see the
/// [module docs](crate::allocation)).
///
/// ```
/// use tq_cache::allocation::{CodecKind, StreamSettings};
/// use tq_qjl::SketchKind;
///
/// let key = StreamSettings { qjl: Some(SketchKind::Haar), shrinkage: Some(0.7), ..StreamSettings::quantized(CodecKind::Prod, 5) };
/// assert_eq!(key.codec, Some(CodecKind::Prod));
/// assert_eq!(key.bits, Some(5));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSettings {
    /// The codec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<CodecKind>,
    /// Bits per coordinate (all included for `prod`: `bits − 1` MSE bits + 1 sketch bit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits: Option<u8>,
    /// The random rotation Π of the quantized codecs (default `hadamard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<RotationKind>,
    /// The QJL sketch matrix of `prod` (default `haar`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qjl: Option<SketchKind>,
    /// The QJL scale of `prod` (default `paper` for a Gaussian sketch, `exact` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<SketchScale>,
    /// The QJL shrinkage α of `prod` (default 1 = unbiased; the seed's "damping 0.7" is 0.7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrinkage: Option<f64>,
    /// Store `‖x‖/‖c[idx]‖` instead of `‖x‖` (quantized codecs; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_correction: Option<bool>,
    /// Mean-centering of the whole stream, any codec (default `none`; see
    /// [`center`](crate::center)); `rope` (keys only) centers on a mean that turns with RoPE
    /// ([`rope_center`](crate::rope_center)). Not allowed in `[outliers]`: both tiers store
    /// one centered vector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub center: Option<CenterPolicy>,
    /// A data-aware basis fitted to the stream's first batch (`mse` only, default `none`; see
    /// [`basis`](crate::basis)). Not allowed in `[outliers]`, nor together with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<BasisPolicy>,
    /// The widths a fitted basis may give its groups (`mse` only; default: 1 to 8 bits), a
    /// list such as `[4, 2, 1]` — the widths the fast-scan order holds (see
    /// [`GroupWidths`](crate::basis::GroupWidths)). Read only where a basis is fitted. Not
    /// allowed in `[outliers]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis_bits: Option<crate::basis::GroupWidths>,
    /// The memory order of the stream's compressed records (default `rows`). `fast-scan`
    /// stores TQ_mse records (and basis records) 32 tokens at a time, nibble-major, codes of
    /// 3 and 5 to 8 bits as bit planes: attention then scores keys with table look-ups and
    /// sums values in integers in that layout (see
    /// [`attention::fast_scan`](crate::attention::fast_scan)). Other codecs keep rows
    /// ([`body_order`](crate::stream::body_order)). The same bytes either way. Not allowed in
    /// `[outliers]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_order: Option<RecordOrder>,
    /// This stream's own recent window: the newest tokens kept unquantized, replacing the
    /// allocation's top-level `recent_fp_tokens` for the streams the table applies to (so an
    /// `[[override]]` can give one layer, head or stream a longer or shorter window). Not
    /// allowed in `[outliers]`: the window holds whole vectors. Ignored on sliding-window
    /// layers, whose ring already holds what attention reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_fp_tokens: Option<usize>,
    /// This stream's own window as a fraction of the tokens held, in `[0, 1)` (see
    /// [`Allocation::recent_fraction`]). A table that gives `recent_fp_tokens`,
    /// `recent_fraction` or both replaces the whole window in force (a fraction alone: no
    /// floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_fraction: Option<f64>,
    /// Heavy hitters (quantized codecs; finite, > 0): a token that drew at least this factor
    /// times the uniform share of attention while in the stream's recent window keeps its
    /// window copy (`recent_dtype`) when it leaves the window, and every kernel reads that copy
    /// instead of its codes (see [`heavy_hitters`](crate::heavy_hitters)). Default: none kept.
    /// Needs a recent window in force; resolves to none on sliding-window layers, which ignore
    /// windows. Not allowed in `[outliers]`: the copy holds the whole vector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heavy_hitters: Option<f64>,
}

impl StreamSettings {
    /// The window this table sets, `None` when it gives neither `recent_fp_tokens` nor
    /// `recent_fraction` (a table that gives either replaces the whole window in force).
    pub fn window(&self) -> Option<RecentWindow> {
        (self.recent_fp_tokens.is_some() || self.recent_fraction.is_some()).then_some(
            RecentWindow {
                tokens: self.recent_fp_tokens,
                fraction: self.recent_fraction,
            },
        )
    }

    /// Settings naming only a codec (enough for `f16`/`f32`).
    pub fn codec_only(codec: CodecKind) -> Self {
        Self {
            codec: Some(codec),
            ..Self::default()
        }
    }

    /// Settings naming a codec and its bits, every other field at its default.
    pub fn quantized(codec: CodecKind, bits: u8) -> Self {
        Self {
            codec: Some(codec),
            bits: Some(bits),
            ..Self::default()
        }
    }
}

/// What a layer's attention sees, for `[[override]]` entries that select layers by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// Every earlier position (a growing cache); every layer of a model without sliding
    /// windows.
    #[default]
    Global,
    /// A sliding window of recent positions (a ring of bounded size), as 15 of Gemma 3's 18
    /// layers.
    Sliding,
}

impl LayerKind {
    /// The TOML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LayerKind::Global => "global",
            LayerKind::Sliding => "sliding",
        }
    }
}

/// One `[[override]]` entry: new settings for some layers (and optionally some KV heads),
/// chosen by index (`layers`), by kind (`layer_kind`), or both (the listed layers of that
/// kind). At least one of the two must be given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerOverride {
    /// Layer indices; negative ones count from the end (−1 is the last layer). Empty (or
    /// absent) with `layer_kind` given: every layer of that kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<i64>,
    /// Only layers of this kind (`"global"` or `"sliding"`); absent: either kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_kind: Option<LayerKind>,
    /// Only in models of exactly this many layers; absent: any model. A layer map measured on
    /// one model (its layer numbers mean nothing on another) rides in a preset that serves
    /// several: on a model of another depth the rule selects nothing and its `layers` are not
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_layers: Option<usize>,
    /// KV-head indices; absent means every head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<Vec<usize>>,
    /// Patch of the key settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<StreamSettings>,
    /// Patch of the value settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<StreamSettings>,
}

/// `[boundary]`: patches for the first `layers` and the last `layers` layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundaryRule {
    /// How many layers at each end (0 turns the rule off).
    pub layers: usize,
    /// Patch of the key settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<StreamSettings>,
    /// Patch of the value settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<StreamSettings>,
}

/// `[outliers]`: split each named, quantized stream into an outlier tier and the rest.
///
/// Give the tier size as `channels` (a count per head) or `fraction` (of `head_dim`, rounded to
/// the nearest integer, so one file fits every head dimension).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierRule {
    /// Outlier channels per head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<usize>,
    /// Outlier channels as a fraction of `head_dim`, in (0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Patch giving the key outlier tier's settings (on top of the key settings in force).
    /// Absent: key streams are not split. `{}`: split, both tiers with the same settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<StreamSettings>,
    /// Patch giving the value outlier tier's settings, as for `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<StreamSettings>,
}

impl OutlierRule {
    /// The outlier channel count for `head_dim` (`fraction` rounded to nearest), unchecked;
    /// `None` if neither or both of `channels` and `fraction` are given.
    pub fn channels_for(&self, head_dim: usize) -> Option<usize> {
        match (self.channels, self.fraction) {
            (Some(k), None) => Some(k),
            // Rounding to nearest makes 0.25 give exactly 16 at d = 64 and 32 at d = 128.
            (None, Some(f)) => Some((f * head_dim as f64).round() as usize),
            _ => None,
        }
    }
}
