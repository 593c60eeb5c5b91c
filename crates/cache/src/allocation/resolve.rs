//! Resolution: which settings apply to one (layer, KV head, stream), checked and turned into
//! codec specs with derived seeds.

use crate::CodecSpec;
use crate::allocation::error::{AllocationError, FieldProblem};
use crate::allocation::merge::{Merged, Resolved, Section};
use crate::allocation::plan::{
    ModelShape, OutlierPlan, RecentWindow, ResolvedStream, StreamKind, StreamPlan,
};
use crate::allocation::schema::{
    Allocation, FpDtype, LayerKind, OutlierRule, RecentDtype, StreamSettings,
};
use crate::allocation::seed::{SeedRole, Tier, derive_seed};
use crate::basis::BasisPolicy;

/// Quantized tiers need `d >= 3`: the rotated-coordinate law `(1−t²)^((d−3)/2)` has no density
/// below that.
const MIN_QUANTIZED_DIM: usize = 3;

impl Allocation {
    /// Resolves the storage of one stream: the keys or values of KV head `kv_head` of layer
    /// `layer` in a model of `num_layers` layers and head dimension `head_dim`.
    ///
    /// Settings apply in this order, each replacing only the fields it gives: the base `key` /
    /// `value` table, `[boundary]` (if `layer` is among the first or last `boundary.layers`),
    /// then every matching `[[override]]` in file order (later wins). Defaults are filled in
    /// last. If `[outliers]` names this stream and the result is quantized, the stream is split:
    /// the rest tier uses the result, the outlier tier the result patched by the outlier table.
    ///
    /// Every override's layer list is checked against `num_layers`, not only the matching ones,
    /// so a bad index fails for every call, not just for some layers.
    ///
    /// ```
    /// use tq_cache::allocation::{Allocation, StreamKind};
    /// let k5v4 = Allocation::preset("k5v4")?;
    /// let plan = k5v4.resolve(3, 30, 2, 64, StreamKind::Value)?;
    /// assert_eq!(plan.bytes_per_token(), 64 * 4 / 8 + 2);
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn resolve(
        &self,
        layer: usize,
        num_layers: usize,
        kv_head: usize,
        head_dim: usize,
        stream: StreamKind,
    ) -> Result<StreamPlan, AllocationError> {
        self.resolve_stream(layer, num_layers, kv_head, head_dim, stream)
            .map(|resolved| resolved.plan)
    }

    /// Everything [`resolve`](Self::resolve) decides for one stream plus the settings of the
    /// stream as a whole: its [`StreamPlan`] and its mean-centering
    /// ([`CenterPolicy`](crate::center::CenterPolicy)), resolved in the same order. The layer
    /// is taken as a [`LayerKind::Global`] one; [`resolve_stream_in`](Self::resolve_stream_in)
    /// names the kind.
    ///
    /// ```
    /// use tq_cache::allocation::{Allocation, StreamKind};
    /// use tq_cache::center::CenterPolicy;
    /// let centered = Allocation::preset("mse-k4v4-c")?.resolve_stream(3, 30, 0, 64, StreamKind::Key)?;
    /// assert_eq!(centered.center, CenterPolicy::FirstChunk);
    /// assert_eq!(centered.plan.bytes_per_token(), 34);      // 4-bit codes + the f16 norm
    /// assert_eq!(centered.metadata_bytes_per_head(), 256); // the mean: 64 f32, once
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn resolve_stream(
        &self,
        layer: usize,
        num_layers: usize,
        kv_head: usize,
        head_dim: usize,
        stream: StreamKind,
    ) -> Result<ResolvedStream, AllocationError> {
        self.resolve_stream_in(
            layer,
            LayerKind::Global,
            num_layers,
            kv_head,
            head_dim,
            stream,
        )
    }

    /// [`resolve_stream`](Self::resolve_stream) for a layer of the given kind: overrides with
    /// a `layer_kind` apply only to layers of that kind.
    ///
    /// ```
    /// use tq_cache::allocation::{Allocation, LayerKind, StreamKind};
    /// let a = Allocation::from_toml_str(r#"
    ///     name = "global-only"
    ///     key = { codec = "mse", bits = 4 }
    ///     value = { codec = "mse", bits = 4 }
    ///     [[override]]
    ///     layer_kind = "sliding"
    ///     key = { codec = "f16" }
    ///     value = { codec = "f16" }
    /// "#)?;
    /// let sliding = a.resolve_stream_in(0, LayerKind::Sliding, 18, 0, 256, StreamKind::Key)?;
    /// assert_eq!(sliding.plan.bytes_per_token(), 512);          // f16
    /// let global = a.resolve_stream_in(5, LayerKind::Global, 18, 0, 256, StreamKind::Key)?;
    /// assert_eq!(global.plan.bytes_per_token(), 256 * 4 / 8 + 2); // 4-bit codes + f16 norm
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn resolve_stream_in(
        &self,
        layer: usize,
        kind: LayerKind,
        num_layers: usize,
        kv_head: usize,
        head_dim: usize,
        stream: StreamKind,
    ) -> Result<ResolvedStream, AllocationError> {
        if layer >= num_layers {
            return Err(AllocationError::Shape(format!(
                "layer {layer} is out of range for a {num_layers}-layer model"
            )));
        }
        if head_dim == 0 {
            return Err(AllocationError::Shape("head_dim is 0".into()));
        }
        let mut merged = Merged::new(stream);
        merged.apply(&self.key_or_value(stream), Section::Base);
        if let Some(boundary) = &self.boundary {
            let n = boundary.layers;
            if (layer < n || layer + n >= num_layers)
                && let Some(patch) = stream_patch(stream, &boundary.key, &boundary.value)
            {
                merged.apply(patch, Section::Boundary);
            }
        }
        for (i, rule) in self.overrides.iter().enumerate() {
            if rule.model_layers.is_some_and(|n| n != num_layers) {
                continue;
            }
            let mut hits_layer = false;
            for (j, &index) in rule.layers.iter().enumerate() {
                let absolute = absolute_layer(index, num_layers).ok_or_else(|| {
                    AllocationError::field(
                        format!("override[{i}].layers[{j}]"),
                        FieldProblem::LayerOutOfRange { index, num_layers },
                    )
                })?;
                hits_layer |= absolute == layer;
            }
            // An empty list with a kind selects every layer of the kind.
            hits_layer |= rule.layers.is_empty();
            hits_layer &= rule.layer_kind.is_none_or(|k| k == kind);
            let hits_head = rule.heads.as_ref().is_none_or(|h| h.contains(&kv_head));
            if hits_layer
                && hits_head
                && let Some(patch) = stream_patch(stream, &rule.key, &rule.value)
            {
                merged.apply(patch, Section::Override(i));
            }
        }
        let whole = merged.finish()?;
        let (center, basis) = (whole.center, whole.basis);
        let recent = whole.window.unwrap_or(self.top_level_window());
        // A sliding-window layer ignores windows (its ring holds what attention reads), so it
        // keeps no heavy hitters either; elsewhere they need a window to be judged in.
        let heavy_hitters = whole.heavy_hitters.filter(|_| kind == LayerKind::Global);
        if heavy_hitters.is_some()
            && !recent.is_open()
            && let Some(origin) = whole.heavy_hitters_path
        {
            return Err(AllocationError::field(
                origin.path("heavy_hitters"),
                FieldProblem::HeavyHittersWithoutWindow,
            ));
        }
        if basis == BasisPolicy::Planes
            && stream == StreamKind::Value
            && let Some(origin) = whole.basis_path
        {
            return Err(AllocationError::field(
                origin.path("basis"),
                FieldProblem::PlanesOnValues,
            ));
        }
        if basis.fits_basis()
            && whole.norm_correction
            && let Some(origin) = whole.basis_path
        {
            return Err(AllocationError::field(
                origin.path("basis"),
                FieldProblem::BasisWithNormCorrection,
            ));
        }
        let seed = |tier, role| derive_seed(self.seed, layer, kv_head, stream, tier, role);
        let split = self.outliers.as_ref().and_then(|rule| {
            stream_patch(stream, &rule.key, &rule.value).map(|patch| (rule, patch))
        });
        let plan = match split {
            Some((rule, patch)) if whole.codec.is_quantized() => {
                if let Some(origin) = whole.basis_path
                    && basis.fits_basis()
                {
                    return Err(AllocationError::field(
                        origin.path("basis"),
                        FieldProblem::BasisWithOutliers,
                    ));
                }
                let (channels, count_field) = outlier_channels(rule, head_dim)?;
                let mut outlier_merged = merged;
                outlier_merged.apply(patch, Section::Outliers);
                let outlier = outlier_merged.finish()?;
                check_width(&outlier, channels, "outlier tier", count_field)?;
                check_width(&whole, head_dim - channels, "rest tier", count_field)?;
                StreamPlan::TwoTier(OutlierPlan {
                    channels,
                    outlier: outlier.spec(
                        channels,
                        seed(Tier::Outlier, SeedRole::Rotation),
                        seed(Tier::Outlier, SeedRole::Sketch),
                    ),
                    rest: whole.spec(
                        head_dim - channels,
                        seed(Tier::Rest, SeedRole::Rotation),
                        seed(Tier::Rest, SeedRole::Sketch),
                    ),
                })
            }
            _ => {
                check_width(&whole, head_dim, "head", &whole.codec_origin.path("codec"))?;
                StreamPlan::Single(whole.spec(
                    head_dim,
                    seed(Tier::Whole, SeedRole::Rotation),
                    seed(Tier::Whole, SeedRole::Sketch),
                ))
            }
        };
        Ok(ResolvedStream {
            plan,
            center,
            basis,
            basis_bits: whole.basis_bits,
            record_order: whole.record_order,
            recent,
            heavy_hitters,
        })
    }

    /// Checks the allocation against a whole model: every override's layer and head indices,
    /// and every (layer, KV head, stream) resolves, as a global and as a sliding-window layer.
    /// Returns the first problem found.
    pub fn validate_for(&self, shape: &ModelShape) -> Result<(), AllocationError> {
        check_shape(shape)?;
        for (i, rule) in self.overrides.iter().enumerate() {
            if rule.model_layers.is_some_and(|n| n != shape.num_layers) {
                continue;
            }
            for (j, &index) in rule.heads.iter().flatten().enumerate() {
                if index >= shape.num_kv_heads {
                    return Err(AllocationError::field(
                        format!("override[{i}].heads[{j}]"),
                        FieldProblem::HeadOutOfRange {
                            index,
                            num_kv_heads: shape.num_kv_heads,
                        },
                    ));
                }
            }
        }
        // A rule selecting by `layer_kind` must resolve whichever kind a layer turns out to be.
        let sliding = vec![LayerKind::Sliding; shape.num_layers];
        self.plans(shape)
            .chain(self.plans_in(shape, &sliding))
            .try_for_each(|plan| plan.map(drop))
    }

    /// Every stream plan of a model, layer-major, then KV head, then key before value (every
    /// layer a global one; see [`plans_in`](Self::plans_in)).
    pub fn plans<'a>(
        &'a self,
        shape: &'a ModelShape,
    ) -> impl Iterator<Item = Result<StreamPlan, AllocationError>> + 'a {
        self.plans_in(shape, &[])
    }

    /// [`plans`](Self::plans) on a model whose layer `l` is of kind `kinds[l]` (layers beyond
    /// `kinds` are global, so `&[]` means a model without sliding windows).
    pub fn plans_in<'a>(
        &'a self,
        shape: &'a ModelShape,
        kinds: &'a [LayerKind],
    ) -> impl Iterator<Item = Result<StreamPlan, AllocationError>> + 'a {
        self.streams_in(shape, kinds, &StreamKind::BOTH)
            .map(|resolved| resolved.map(|r| r.plan))
    }

    /// Every `streams` stream of every layer and KV head, resolved for the layer's kind
    /// (`kinds[l]`, global beyond), layer-major, then KV head, then in `streams` order.
    fn streams_in<'a>(
        &'a self,
        shape: &'a ModelShape,
        kinds: &'a [LayerKind],
        streams: &'a [StreamKind],
    ) -> impl Iterator<Item = Result<ResolvedStream, AllocationError>> + 'a {
        (0..shape.num_layers).flat_map(move |layer| {
            let kind = kinds.get(layer).copied().unwrap_or_default();
            (0..shape.num_kv_heads).flat_map(move |head| {
                streams.iter().map(move |&stream| {
                    self.resolve_stream_in(
                        layer,
                        kind,
                        shape.num_layers,
                        head,
                        shape.head_dim,
                        stream,
                    )
                })
            })
        })
    }

    /// Stored bits per value of one stream kind, averaged over every layer and KV head of the
    /// model, everything per token included (codes, sign bits, f16 norms and residual norms of
    /// every tier). Excludes what does not scale with tokens (the outlier channel lists and the
    /// means of centered streams, see [`ResolvedStream::metadata_bytes_per_head`]) and the
    /// unquantized sink and recent tokens, whose share depends on the sequence length. Every
    /// layer counts as a global one ([`bits_per_value_in`](Self::bits_per_value_in) takes the
    /// layer kinds).
    ///
    /// ```
    /// use tq_cache::allocation::{Allocation, ModelShape, StreamKind};
    /// let shape = ModelShape { num_layers: 32, num_kv_heads: 8, head_dim: 128 };
    /// let bits = Allocation::preset("tq3.5")?.bits_per_value(&shape, StreamKind::Key)?;
    /// assert_eq!(bits, 3.5);
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn bits_per_value(
        &self,
        shape: &ModelShape,
        stream: StreamKind,
    ) -> Result<f64, AllocationError> {
        self.bits_per_value_in(shape, &[], stream)
    }

    /// [`bits_per_value`](Self::bits_per_value) on a model whose layer `l` is of kind
    /// `kinds[l]` (layers beyond `kinds` are global): every layer weighs the same, as if each
    /// stored the token.
    ///
    /// ```
    /// use tq_cache::allocation::{Allocation, LayerKind, ModelShape, StreamKind};
    /// let shape = ModelShape { num_layers: 6, num_kv_heads: 1, head_dim: 256 };
    /// let mut kinds = vec![LayerKind::Sliding; 5];
    /// kinds.push(LayerKind::Global);
    /// let a = Allocation::preset("rec4.25-global")?;
    /// // Five f16 sliding layers and one global layer of 5-bit keys with an f16 norm.
    /// let bits = a.bits_per_value_in(&shape, &kinds, StreamKind::Key)?;
    /// assert_eq!(bits, (5.0 * 16.0 + 5.0625) / 6.0);
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn bits_per_value_in(
        &self,
        shape: &ModelShape,
        kinds: &[LayerKind],
        stream: StreamKind,
    ) -> Result<f64, AllocationError> {
        check_shape(shape)?;
        let mut bytes = 0usize;
        for resolved in self.streams_in(shape, kinds, &[stream]) {
            bytes += resolved?.plan.bytes_per_token();
        }
        let values = shape.num_layers * shape.num_kv_heads * shape.head_dim;
        Ok(8.0 * bytes as f64 / values as f64)
    }

    /// The window of every stream whose own table sets none: the top-level `recent_fp_tokens`
    /// and `recent_fraction`.
    pub fn top_level_window(&self) -> RecentWindow {
        RecentWindow {
            tokens: Some(self.recent_fp_tokens),
            fraction: self.recent_fraction,
        }
    }

    /// The codec of the tokens kept unquantized (sinks and the recent window).
    pub fn fp_codec(&self, head_dim: usize) -> CodecSpec {
        match self.fp_dtype {
            FpDtype::F16 => CodecSpec::F16 { dim: head_dim },
            FpDtype::F32 => CodecSpec::F32 { dim: head_dim },
        }
    }

    /// The codec of the recent window's copies: `recent_dtype`, or the sinks' codec
    /// ([`fp_codec`](Self::fp_codec)) when the file gives none.
    ///
    /// ```
    /// use tq_cache::allocation::Allocation;
    /// use tq_cache::CodecSpec;
    /// let a = Allocation::from_toml_str(r#"
    ///     name = "w"
    ///     recent_fp_tokens = 200
    ///     recent_dtype = "q8"
    ///     key = { codec = "mse", bits = 4 }
    ///     value = { codec = "mse", bits = 3 }
    /// "#)?;
    /// assert_eq!(a.recent_codec(64), CodecSpec::Q8 { dim: 64 });
    /// assert!(a.window_defers_codes());
    /// # Ok::<(), tq_cache::allocation::AllocationError>(())
    /// ```
    pub fn recent_codec(&self, head_dim: usize) -> CodecSpec {
        match self.recent_dtype {
            None => self.fp_codec(head_dim),
            Some(RecentDtype::F16) => CodecSpec::F16 { dim: head_dim },
            Some(RecentDtype::F32) => CodecSpec::F32 { dim: head_dim },
            Some(RecentDtype::Q8) => CodecSpec::Q8 { dim: head_dim },
        }
    }

    /// Whether a windowed stream's tokens have no codes until they leave the window (an 8-bit
    /// window: see [`stream`](crate::stream)), so a stream holding `n` tokens stores
    /// `n − window` codes.
    pub fn window_defers_codes(&self) -> bool {
        self.recent_dtype == Some(RecentDtype::Q8)
    }

    pub(crate) fn key_or_value(&self, stream: StreamKind) -> StreamSettings {
        match stream {
            StreamKind::Key => self.key,
            StreamKind::Value => self.value,
        }
    }
}

fn check_shape(shape: &ModelShape) -> Result<(), AllocationError> {
    if shape.num_layers == 0 || shape.num_kv_heads == 0 || shape.head_dim == 0 {
        return Err(AllocationError::Shape(format!(
            "every dimension must be positive, got {shape:?}"
        )));
    }
    Ok(())
}

/// The patch of `stream` among a rule's `key` / `value` tables.
pub(crate) fn stream_patch<'a>(
    stream: StreamKind,
    key: &'a Option<StreamSettings>,
    value: &'a Option<StreamSettings>,
) -> Option<&'a StreamSettings> {
    match stream {
        StreamKind::Key => key.as_ref(),
        StreamKind::Value => value.as_ref(),
    }
}

/// A layer index as written (negative counts from the end) as an index into the model.
pub(super) fn absolute_layer(index: i64, num_layers: usize) -> Option<usize> {
    let n = i64::try_from(num_layers).ok()?;
    let absolute = if index < 0 { n + index } else { index };
    (0..n).contains(&absolute).then_some(absolute as usize)
}

/// The outlier channel count at `head_dim`, and the path of the field that set it.
fn outlier_channels(
    rule: &OutlierRule,
    head_dim: usize,
) -> Result<(usize, &'static str), AllocationError> {
    let field = if rule.fraction.is_some() {
        "outliers.fraction"
    } else {
        "outliers.channels"
    };
    let channels = rule
        .channels_for(head_dim)
        .ok_or_else(|| AllocationError::field("outliers", FieldProblem::OutlierCount))?;
    if channels == 0 || channels >= head_dim {
        return Err(AllocationError::field(
            field,
            FieldProblem::ChannelsOutOfRange { channels, head_dim },
        ));
    }
    Ok((channels, field))
}

/// Checks a quantized tier is wide enough; `path` names the field to change if it is not.
fn check_width(
    tier: &Resolved,
    dim: usize,
    name: &'static str,
    path: &str,
) -> Result<(), AllocationError> {
    if tier.codec.is_quantized() && dim < MIN_QUANTIZED_DIM {
        return Err(AllocationError::field(
            path,
            FieldProblem::TierTooNarrow {
                tier: name,
                dim,
                codec: tier.codec,
            },
        ));
    }
    Ok(())
}
