//! Why an allocation could not be read, validated or resolved.
//!
//! Every problem with a file's content names the field it is about as a path in the file
//! (`override[1].key.bits`, `outliers.fraction`, `key.codec`), so the message alone tells a user
//! which line to edit.

use std::path::PathBuf;

use crate::allocation::schema::CodecKind;

/// Why an allocation could not be read, validated or resolved.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    /// The text is not valid TOML, or does not fit the schema (unknown field, wrong type,
    /// missing required field). `path` is where in the document, `None` for the whole document.
    #[error("{}{message}", location(.path))]
    Toml {
        /// The field path (`override[1].key.bits`), `None` when the error is about the document.
        path: Option<String>,
        /// The parser's reason, with the line and column where known.
        message: String,
    },
    /// A field has a value the schema's rules reject.
    #[error("`{path}`: {problem}")]
    Field {
        /// The field path (`override[1].key.bits`).
        path: String,
        /// What is wrong with it.
        problem: FieldProblem,
    },
    /// An argument of [`Allocation::resolve`](crate::allocation::Allocation::resolve) or of a
    /// model shape is inconsistent (not a problem of the file).
    #[error("invalid model shape: {0}")]
    Shape(String),
    /// `name` is not a shipped preset (and, for `load`, not an existing file either).
    #[error("`{name}` is not a shipped preset ({shipped}){}", nor_file(*.tried_path))]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The shipped preset names, comma-separated.
        shipped: String,
        /// Whether `name` was also tried as a file path.
        tried_path: bool,
    },
    /// A file could not be read.
    #[error("cannot read allocation file {}: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was read but its content is invalid.
    #[error("{}: {source}", file.display())]
    InFile {
        /// The file.
        file: PathBuf,
        /// What is wrong with its content.
        source: Box<AllocationError>,
    },
    /// The allocation cannot be written as TOML (e.g. a seed above `i64::MAX`, which TOML
    /// integers cannot hold).
    #[error("cannot write the allocation as TOML: {0}")]
    Serialize(String),
}

/// What is wrong with one field of an allocation.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FieldProblem {
    /// The base `key`/`value` settings must name a codec.
    #[error("required in the base settings (one of f32, f16, mse, prod, debiased-mse)")]
    CodecRequired,
    /// A quantized codec needs `bits`.
    #[error("required for codec `{codec}`")]
    BitsRequired {
        /// The codec in force.
        codec: CodecKind,
    },
    /// The field has no meaning for the codec in force (e.g. `qjl` on `mse`).
    #[error("does not apply to codec `{codec}`{}", hint(*.codec))]
    NotApplicable {
        /// The codec in force.
        codec: CodecKind,
    },
    /// `bits` outside what the codec supports.
    #[error("{bits} is out of range for codec `{codec}` (supported: {supported})")]
    BitsOutOfRange {
        /// The value given.
        bits: u8,
        /// The codec in force.
        codec: CodecKind,
        /// The supported range.
        supported: &'static str,
    },
    /// Shrinkage must be a finite number > 0 that survives conversion to f32.
    #[error("must be finite and > 0 (as f32), got {value}")]
    BadShrinkage {
        /// The value given.
        value: f64,
    },
    /// The seed does not fit a TOML integer.
    #[error("must be at most 2^63 - 1 (TOML integers are signed 64-bit), got {seed}")]
    SeedTooLarge {
        /// The seed.
        seed: u64,
    },
    /// A count that must be at least 1.
    #[error("must be at least 1")]
    Zero,
    /// A list or string that must not be empty.
    #[error("must not be empty")]
    Empty,
    /// An `[[override]]` that selects no layer (none of `layers`, `layer_kind`,
    /// `model_layers`).
    #[error(
        "selects no layer: give `layers`, `layer_kind` (\"global\" or \"sliding\"), \
         `model_layers` or a combination"
    )]
    NoLayers,
    /// A rule that would change nothing (no `key` and no `value` table).
    #[error("names neither `key` nor `value`, so it changes nothing")]
    NoStream,
    /// `[outliers]` must give exactly one of `channels` and `fraction`.
    #[error("give exactly one of `channels` and `fraction`")]
    OutlierCount,
    /// `outliers.fraction` must lie strictly between 0 and 1.
    #[error("must be in (0, 1), got {value}")]
    BadFraction {
        /// The value given.
        value: f64,
    },
    /// A window's `recent_fraction` must lie in `[0, 1)`.
    #[error("must be in [0, 1) (a fraction of the tokens the cache holds), got {value}")]
    BadWindowFraction {
        /// The value given.
        value: f64,
    },
    /// A `heavy_hitters` factor must be a finite number > 0 that survives conversion to f32.
    #[error(
        "must be finite and > 0 (as f32): the multiple of the uniform share of attention a \
         token must draw in the window to be kept, got {value}"
    )]
    BadHeavyHitters {
        /// The value given.
        value: f64,
    },
    /// `heavy_hitters` on a stream with no recent window in force (neither `recent_fp_tokens`
    /// nor `recent_fraction` above 0): a token is judged by the attention it draws in the
    /// window, and keeps its window copy.
    #[error(
        "heavy_hitters needs a recent window: give the stream `recent_fp_tokens` or \
         `recent_fraction` above 0 (or the allocation a top-level one)"
    )]
    HeavyHittersWithoutWindow,
    /// `heavy_hitters` on a full-precision stream: its tokens already are what a kept copy
    /// would be.
    #[error(
        "nothing to keep: the body is full precision (codec `{codec}`); heavy_hitters applies \
         to quantized codecs"
    )]
    NothingToKeep {
        /// The codec in force.
        codec: CodecKind,
    },
    /// The outlier tier must leave at least one channel to each tier.
    #[error(
        "{channels} outlier channels do not fit head_dim {head_dim} \
         (need 1 <= channels < head_dim)"
    )]
    ChannelsOutOfRange {
        /// The number of outlier channels (after applying a fraction).
        channels: usize,
        /// The head dimension.
        head_dim: usize,
    },
    /// A quantized tier (or a whole quantized head) narrower than the codebook allows.
    #[error(
        "the {tier} has {dim} channels but codec `{codec}` needs at least 3 \
         (the rotated-coordinate codebook needs d >= 3)"
    )]
    TierTooNarrow {
        /// Which tier: `outlier tier`, `rest tier` or `head`.
        tier: &'static str,
        /// Its dimension.
        dim: usize,
        /// Its codec.
        codec: CodecKind,
    },
    /// A setting of the whole stream given for one tier (`center` in `[outliers]`).
    #[error(
        "applies to the whole stream, not to one tier: set it in the stream's own settings \
         (base, `[boundary]` or `[[override]]`)"
    )]
    WholeStreamOnly,
    /// `basis = "pca"` on a stream that `[outliers]` splits in two tiers.
    #[error(
        "a basis cannot be combined with [outliers]: both decide how a head's directions get \
         their bits; drop one of them for this stream"
    )]
    BasisWithOutliers,
    /// `basis = "planes"` on a value stream: the planes are where RoPE turns the keys, and the
    /// fit weighs them by the queries that score the keys; values have neither.
    #[error(
        "basis = \"planes\" applies to keys only (RoPE planes weighed by the queries); \
         use basis = \"pca\" or none for values"
    )]
    PlanesOnValues,
    /// `center = "rope"` (or `"rope-or-first-chunk"`) on a value stream: values carry no RoPE,
    /// so their mean does not turn.
    #[error(
        "center = \"rope\" and \"rope-or-first-chunk\" apply to keys only (values carry no \
         RoPE); use \"first-chunk\" or \"none\" for values"
    )]
    RopeCenterOnValues,
    /// A basis on a stream with `norm_correction = true`: a basis codec keeps the plain norm
    /// and scales each group by its fitted scale, so the option would be silently ignored.
    #[error(
        "a basis cannot be combined with norm_correction = true (a basis codec keeps the plain \
         norm); drop one of them for this stream"
    )]
    BasisWithNormCorrection,
    /// A layer index outside the model (negative indices count from the end).
    #[error("layer {index} is out of range for a {num_layers}-layer model")]
    LayerOutOfRange {
        /// The index as written.
        index: i64,
        /// Layers in the model.
        num_layers: usize,
    },
    /// A KV-head index outside the model.
    #[error("KV head {index} is out of range for a model with {num_kv_heads} KV heads")]
    HeadOutOfRange {
        /// The index as written.
        index: usize,
        /// KV heads in the model.
        num_kv_heads: usize,
    },
}

fn location(path: &Option<String>) -> String {
    path.as_deref()
        .map(|p| format!("`{p}`: "))
        .unwrap_or_default()
}

fn nor_file(tried_path: bool) -> &'static str {
    if tried_path {
        " nor an existing file"
    } else {
        ""
    }
}

fn hint(codec: CodecKind) -> &'static str {
    match codec {
        CodecKind::F32 | CodecKind::F16 => " (unquantized codecs take no settings)",
        CodecKind::Mse | CodecKind::DebiasedMse => " (only `prod` has a QJL sketch)",
        CodecKind::Prod => "",
    }
}

impl AllocationError {
    pub(crate) fn field(path: impl Into<String>, problem: FieldProblem) -> Self {
        AllocationError::Field {
            path: path.into(),
            problem,
        }
    }
}
