//! Bit allocations as data: which codec, how many bits and which random objects every key and
//! value stream of a model uses, read from a small TOML file.
//!
//! A user experiments by copying a preset from `crates/cache/presets/` and editing it, not by
//! editing code. [`Allocation::resolve`] turns a file into a [`StreamPlan`] for one
//! (layer, KV head, stream): the [`CodecSpec`](crate::CodecSpec) to build, or two of them for a
//! two-tier stream, with every seed derived (see [`derive_seed`]) and the exact bytes a token
//! costs ([`StreamPlan::bytes_per_token`]).
//!
//! # Schema
//!
//! ```toml
//! name = "example"                 # required
//! description = "what it is for"   # optional
//! seed = 1234                      # base seed, 0..=2^63-1 (default DEFAULT_SEED)
//! recent_fp_tokens = 0             # newest tokens kept unquantized (default 0; a stream
//!                                  # table's own window replaces it there)
//! recent_fraction = 0.125          # and/or the window as a fraction of the tokens held:
//!                                  # max(recent_fp_tokens, round(fraction · held))
//! sink_tokens = 0                  # first tokens kept unquantized (default 0)
//! fp_dtype = "f16"                 # f16 | f32: storage of those tokens (default f16)
//! recent_dtype = "q8"              # f16 | f32 | q8: the window's copies (default fp_dtype);
//!                                  # q8: 8 bits, codes written as tokens leave the window
//!
//! # Base settings, every layer and head. `codec` is required.
//! key   = { codec = "prod", bits = 5, qjl = "haar", shrinkage = 0.7, center = "first-chunk" }
//! value = { codec = "mse", bits = 4 }
//!
//! [boundary]                       # the first N and the last N layers
//! layers = 2
//! value = { bits = 5 }             # partial: only the fields given change
//!
//! [[override]]                     # applied after [boundary], in file order; later wins
//! layers = [0, -1]                 # negative indices count from the end: -1 = last layer
//! key = { codec = "f16" }
//!
//! [[override]]
//! layers = [5]
//! heads = [0, 3]                   # KV-head indices; absent = every head
//! key = { norm_correction = true }
//!
//! [[override]]
//! layers = [10]
//! key = { recent_fp_tokens = 160 } # these streams' own window (replaces the top-level one)
//! value = { recent_fp_tokens = 96, heavy_hitters = 8.0 } # keep the window copy of a token
//!                                  # that drew ≥ 8× the uniform attention share in the window
//!
//! [[override]]
//! layer_kind = "sliding"           # every sliding-window layer (or "global"); with `layers`,
//! value = { codec = "f16" }        # only the listed layers of that kind
//!
//! [[override]]
//! model_layers = 30                # only in 30-layer models: a layer map measured on one
//! layers = [2, 3]                  # model rides in a preset that serves others too
//! key = { bits = 4 }
//!
//! [outliers]                       # two tiers for the streams named below
//! fraction = 0.25                  # or `channels = 32`: exactly one of the two
//! key   = { bits = 6 }             # the outlier tier: key settings in force, patched
//! value = {}                       # split values too, both tiers with the same settings
//! ```
//!
//! Stream settings (the `key` / `value` tables, whole or partial):
//!
//! | field | values | default | applies to |
//! |---|---|---|---|
//! | `codec` | `f32`, `f16`, `mse`, `prod`, `debiased-mse` | required in the base | all |
//! | `bits` | mse / debiased-mse 1..=8; prod 2..=9 (`bits − 1` MSE + 1 QJL) | required | quantized |
//! | `rotation` | `haar`, `hadamard` | `hadamard` | quantized |
//! | `norm_correction` | `true`, `false` | `false` | quantized |
//! | `qjl` | `gaussian`, `haar`, `hadamard` | `haar` | prod |
//! | `scale` | `paper`, `asymptotic`, `exact` | `paper` for gaussian, else `exact` | prod |
//! | `shrinkage` | finite, > 0 (the seed's "damping 0.7" is 0.7) | 1 (unbiased) | prod |
//! | `center` | `none`, `first-chunk` (store `x − μ`, μ = mean of the stream's first batch) | `none` | all codecs; not in `[outliers]` |
//! | `basis` | `none`, `pca` (principal components of the first batch, water-filled bits) | `none` | mse; not in, nor with, `[outliers]` |
//! | `basis_bits` | a list of widths in 1..=8, e.g. `[4, 2, 1]` (the only widths a fitted basis may give its groups) | all of 1..=8 | mse; read only where a basis is fitted; not in `[outliers]` |
//! | `recent_fp_tokens` | 0, 1, … (this stream's newest tokens kept unquantized) | the top-level `recent_fp_tokens` | all codecs; not in `[outliers]`; ignored on sliding-window layers |
//! | `recent_fraction` | in `[0, 1)`: the window as a fraction of the tokens held (`recent_fp_tokens` its floor) | the top-level `recent_fraction` | as `recent_fp_tokens` |
//! | `record_order` | `rows`, `fast-scan` (records of 32 tokens nibble-major, codes of 3 and 5–8 bits as bit planes, scored with tables) | `rows` | `mse` bodies with `d·b` a multiple of 32 and fitted bases take it; others keep rows; not in `[outliers]` |
//! | `heavy_hitters` | finite, > 0: a token that drew at least this factor times the uniform share of attention in the window keeps its window copy when it leaves | none (every token leaves for its codes) | quantized; needs a recent window in force; not in `[outliers]`; ignored (none) on sliding-window layers |
//!
//! A stream's own window lets it differ per layer, KV head and stream, like every other stream
//! setting; a table that gives `recent_fp_tokens`, `recent_fraction` or both replaces the whole
//! window in force. With `n` tokens held a window is `max(recent_fp_tokens, round(fraction ·
//! n))` tokens ([`window_tokens`](crate::stream::window_tokens)): the count is a floor, the
//! fraction makes the window grow with the context, so its share of the bits is the same at
//! every length (a fixed count costs more bits at a short context and buys less at a long one:
//! `presets/README.md`, "A window that grows with the context"). It depends on the tokens held
//! only — not on the capacity a cache was built for — so a prompt cache that grows in pages and
//! a cache of fixed capacity keep the same windows and give the same outputs; a stream without
//! a fixed capacity grows its ring of copies with its window. The sinks stay one count for the
//! whole allocation.
//! The GPU backend reads each stream's and head's own window.
//!
//! `center` mean-centers a stream: exact up to quantization error (keys: a softmax ignores a
//! common shift of its scores; values: attention adds `μ` back, the weights summing to one), at
//! `4·head_dim` bytes per stream, once. See [`center`](crate::center) for the argument, where
//! `μ` comes from and the fallback for short first batches. Like every stream field it can
//! differ per layer (`[boundary]`, `[[override]]`) and per KV head (`heads`); it is a setting
//! of the whole stream, so `[outliers]` tables may not give it. It applies to KV states only:
//! fixed (conv / recurrent) states are never quantized nor centered, and an allocation whose
//! centering reaches no KV state is not an error.
//!
//! `basis = "pca"` fits a data-aware basis to the stream's first batch (after centering, if the
//! stream is centered): `bits` becomes the *average* bits per coordinate, spread over the
//! principal components by reverse water-filling, in the same bytes per token. See
//! [`basis`](crate::basis) for the codec, the reduction to plain `mse`, the fallback for short
//! first batches and the cost (the basis rows, counted once fitted). A switch to another codec
//! drops an inherited `basis` (and `basis_bits`). `basis_bits = [4, 2, 1]` limits the groups'
//! widths to those whose codes fill whole nibbles (the fast-scan order holds other widths as
//! bit planes); the water-filling is the same dynamic program over those widths.
//!
//! `record_order = "fast-scan"` stores the stream's records in the layout of the fast-scan
//! kernel ([`record_order`](crate::record_order)): the same bytes, permuted, so the cost per
//! token does not change. Attention then scores keys with per-query byte tables summed in
//! integers (each score within `norm·L·δ/2` of the exact one over the record's `L` nibble
//! lanes, δ the table's step: see [`attention::fast_scan`](crate::attention::fast_scan)) and
//! sums values from the same layout in integers (7-bit weights per block and head times 8-bit
//! centroids, a derived bound); codes of 3 and 5 to 8 bits are stored as bit planes and
//! scored as products of two integers (the code's centroid on a 12-bit grid, the query's
//! coordinate on the sum's). Only TQ_mse bodies with `d·b` a multiple of 32 and fitted bases
//! take it ([`body_order`](crate::stream::body_order)); other streams keep rows, so a base-level
//! `record_order` is safe over any override. A basis stream asks for it from the start: it
//! holds plain records until the basis is fitted, then the basis records.
//!
//! `heavy_hitters = factor` keeps some tokens exact-ish past the window: a token that drew at
//! least `factor` times the uniform share of attention (`1/visible tokens`, summed over the
//! rows that read it) while it was in the stream's recent window keeps its window copy (8-bit
//! or f16, the window's codec) when it leaves the window, and every kernel reads that copy
//! instead of its codes ([`heavy_hitters`](crate::heavy_hitters)). Each kept token costs its
//! copy's bytes, which depend on the data: they are counted in the cache's measured bytes, not
//! in [`StreamPlan::bytes_per_token`]. The decision is causal, made once the token has left
//! every later query's window (`presets/README.md`, "Heavy hitters"). It needs a recent window
//! in force (`recent_fp_tokens` or `recent_fraction` above 0, the stream's own or the
//! top-level one): a stream without one is an error when it resolves; on sliding-window layers,
//! which ignore windows, it resolves to none. A full-precision codec has nothing to keep (an
//! error), and a patch switching to one drops an inherited factor.
//!
//! A field given for a codec it does not apply to is an error (`qjl` on `mse`). A patch that
//! switches the codec drops the inherited fields the new codec cannot use, so
//! `key = { codec = "f16" }` over a `prod` base is fine, and `key = { codec = "mse" }` over a
//! `prod` base keeps its `bits` and `rotation`.
//!
//! # Resolution order
//!
//! For layer `l` of `L`, KV head `h`, stream `s` (key or value):
//!
//! 1. the base `s` table;
//! 2. `[boundary].s` if `l < N` or `l ≥ L − N` (`N = boundary.layers`);
//! 3. each `[[override]]` that selects `l` — its `model_layers` is `L` (when given), its
//!    `layers` contain `l` (when given) and its `layer_kind` is `l`'s kind (when given) — and
//!    whose `heads` (if given) contain `h`, in file order, so later entries win field by
//!    field;
//! 4. defaults fill every field still not given (so a patch changing `qjl` to `gaussian` also
//!    gets the Gaussian default scale);
//! 5. if `[outliers]` has an `s` table and the result is quantized, the stream splits: `k`
//!    outlier channels (`channels`, or `round(fraction·head_dim)`), chosen per head by L2 norm
//!    over the prefill tokens, use the result patched by `[outliers].s`; the other
//!    `head_dim − k` channels use the result itself. `f16`/`f32` streams are never split.
//!
//! Every tier gets its own rotation (and sketch) for its own dimension; quantized tiers need at
//! least 3 channels, because the rotated-coordinate codebook needs `d ≥ 3`.
//!
//! # Honest accounting
//!
//! [`StreamPlan::bytes_per_token`] is everything a token stores: packed codes, QJL sign words,
//! the f16 norm of each tier and `γ` of each `prod` tier, with each tier's codes padded to whole
//! `u32` words. It equals what the built codecs allocate. The outlier channel list (`2·k`
//! bytes) and the mean of a centered stream (`4·head_dim` bytes) are per head, not per token:
//! [`ResolvedStream::metadata_bytes_per_head`] (from [`Allocation::resolve_stream`]).
//!
//! # Errors
//!
//! Every problem with a file names the field as a path and says why:
//! `` `override[1].key.bits`: 10 is out of range for codec `mse` (supported: 1..=8) ``.
//! Unknown fields are errors, so a typo never silently becomes a default.

mod cache_layout;
mod error;
mod file;
mod merge;
mod plan;
mod resolve;
mod schema;
mod seed;
#[cfg(test)]
mod tests;
mod validate;

pub use crate::center::CenterPolicy;
pub use error::{AllocationError, FieldProblem};
pub use plan::{ModelShape, OutlierPlan, RecentWindow, ResolvedStream, StreamKind, StreamPlan};
pub use schema::{
    Allocation, BoundaryRule, CodecKind, DEFAULT_SEED, FpDtype, LayerKind, LayerOverride,
    OutlierRule, RecentDtype, StreamSettings,
};
pub use seed::{SeedRole, Tier, derive_seed, splitmix64};
