//! Applying patches to stream settings while remembering which table set each field, so a
//! rule violation found after merging still names the line the user wrote.

use std::fmt;

use tq_qjl::{QjlSpec, SketchKind, SketchScale};
use tq_rotation::RotationKind;

use crate::CodecSpec;
use crate::allocation::error::{AllocationError, FieldProblem};
use crate::allocation::plan::{RecentWindow, StreamKind};
use crate::allocation::schema::{CodecKind, StreamSettings};
use crate::basis::{BasisPolicy, GroupWidths};
use crate::center::CenterPolicy;
use crate::codec::{MseSpec, ProdSpec};
use crate::record_order::RecordOrder;

/// The table a patch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    /// The top-level `key` / `value` tables.
    Base,
    /// `[boundary]`.
    Boundary,
    /// The `[[override]]` entry with this index.
    Override(usize),
    /// `[outliers]`.
    Outliers,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Section::Base => Ok(()),
            Section::Boundary => f.write_str("boundary."),
            Section::Override(i) => write!(f, "override[{i}]."),
            Section::Outliers => f.write_str("outliers."),
        }
    }
}

/// Where a field value was written: a table and the stream sub-table inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub section: Section,
    pub stream: StreamKind,
}

impl Origin {
    /// The path of `field` in this table, e.g. `override[1].key.bits`.
    pub fn path(self, field: &str) -> String {
        format!("{}{}.{field}", self.section, self.stream)
    }
}

#[derive(Clone, Copy, Debug)]
struct Sourced<T> {
    value: T,
    origin: Origin,
}

/// Stream settings under construction, every field tagged with the table that set it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Merged {
    stream: StreamKind,
    codec: Option<Sourced<CodecKind>>,
    bits: Option<Sourced<u8>>,
    rotation: Option<Sourced<RotationKind>>,
    qjl: Option<Sourced<SketchKind>>,
    scale: Option<Sourced<SketchScale>>,
    shrinkage: Option<Sourced<f64>>,
    norm_correction: Option<Sourced<bool>>,
    center: Option<Sourced<CenterPolicy>>,
    basis: Option<Sourced<BasisPolicy>>,
    basis_bits: Option<Sourced<GroupWidths>>,
    record_order: Option<Sourced<RecordOrder>>,
    window: Option<Sourced<RecentWindow>>,
    heavy_hitters: Option<Sourced<f64>>,
}

/// Fully resolved settings of one tier: every default filled in and every rule checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resolved {
    pub codec: CodecKind,
    /// Where `codec` was set, for errors that only appear once the dimension is known.
    pub codec_origin: Origin,
    bits: u8,
    rotation: RotationKind,
    qjl: SketchKind,
    scale: SketchScale,
    shrinkage: f32,
    /// Whether the MSE reconstruction is rescaled to the stored norm.
    pub norm_correction: bool,
    /// Mean-centering of the stream (one policy for both tiers of a two-tier stream).
    pub center: CenterPolicy,
    /// The data-aware basis of the stream and the field's path when set (for the error a basis
    /// over a two-tier split gives).
    pub basis: BasisPolicy,
    pub basis_path: Option<Origin>,
    /// The widths the basis may give its groups.
    pub basis_bits: GroupWidths,
    /// The memory order of the stream's records.
    pub record_order: RecordOrder,
    /// The stream's own recent window, `None` when no table set one (the allocation's
    /// top-level `recent_fp_tokens` / `recent_fraction` apply).
    pub window: Option<RecentWindow>,
    /// The heavy-hitter factor, checked (finite and > 0 as f32, quantized codecs only), and
    /// where it was set (for the error a stream without a window gives).
    pub heavy_hitters: Option<f32>,
    pub heavy_hitters_path: Option<Origin>,
}

fn set<T: Copy>(slot: &mut Option<Sourced<T>>, value: Option<T>, origin: Origin) {
    if let Some(value) = value {
        *slot = Some(Sourced { value, origin });
    }
}

impl Merged {
    /// Nothing set yet.
    pub fn new(stream: StreamKind) -> Self {
        Self {
            stream,
            codec: None,
            bits: None,
            rotation: None,
            qjl: None,
            scale: None,
            shrinkage: None,
            norm_correction: None,
            center: None,
            basis: None,
            basis_bits: None,
            record_order: None,
            window: None,
            heavy_hitters: None,
        }
    }

    /// Applies a patch: the fields it gives replace those in force.
    ///
    /// A patch that names a codec first drops the inherited fields the new codec has no use
    /// for (so `key = { codec = "f16" }` over a `prod` base does not trip over the base's
    /// `qjl`), while fields the patch itself gives are kept and checked by [`Merged::finish`].
    /// `center` and the window apply to every codec and are never dropped (`heavy_hitters`, which
    /// keeps copies in place of codes, is dropped with the codes). A patch that gives
    /// `recent_fp_tokens`, `recent_fraction` or both replaces the whole window in force.
    pub fn apply(&mut self, patch: &StreamSettings, section: Section) {
        let origin = Origin {
            section,
            stream: self.stream,
        };
        if let Some(codec) = patch.codec {
            if !codec.is_quantized() {
                self.bits = None;
                self.rotation = None;
                self.norm_correction = None;
                self.heavy_hitters = None;
            }
            if codec != CodecKind::Prod {
                self.qjl = None;
                self.scale = None;
                self.shrinkage = None;
            }
            if codec != CodecKind::Mse {
                self.basis = None;
                self.basis_bits = None;
            }
        }
        set(&mut self.codec, patch.codec, origin);
        set(&mut self.bits, patch.bits, origin);
        set(&mut self.rotation, patch.rotation, origin);
        set(&mut self.qjl, patch.qjl, origin);
        set(&mut self.scale, patch.scale, origin);
        set(&mut self.shrinkage, patch.shrinkage, origin);
        set(&mut self.norm_correction, patch.norm_correction, origin);
        set(&mut self.center, patch.center, origin);
        set(&mut self.basis, patch.basis, origin);
        set(&mut self.basis_bits, patch.basis_bits, origin);
        set(&mut self.record_order, patch.record_order, origin);
        set(&mut self.window, patch.window(), origin);
        set(&mut self.heavy_hitters, patch.heavy_hitters, origin);
    }

    /// Fills in the defaults and checks every rule, naming the offending field's path.
    pub fn finish(&self) -> Result<Resolved, AllocationError> {
        let base = Origin {
            section: Section::Base,
            stream: self.stream,
        };
        let Some(codec) = self.codec else {
            return Err(AllocationError::field(
                base.path("codec"),
                FieldProblem::CodecRequired,
            ));
        };
        let kind = codec.value;
        whole_stream_only(self.center.map(|c| c.origin), "center")?;
        if let Some(c) = self.center
            && matches!(c.value, CenterPolicy::Rope | CenterPolicy::RopeOrFirstChunk)
            && self.stream == StreamKind::Value
        {
            return Err(AllocationError::field(
                c.origin.path("center"),
                FieldProblem::RopeCenterOnValues,
            ));
        }
        whole_stream_only(self.basis.map(|b| b.origin), "basis")?;
        whole_stream_only(self.basis_bits.map(|b| b.origin), "basis_bits")?;
        if let Some(b) = self.basis_bits
            && kind != CodecKind::Mse
        {
            return Err(AllocationError::field(
                b.origin.path("basis_bits"),
                FieldProblem::NotApplicable { codec: kind },
            ));
        }
        whole_stream_only(self.record_order.map(|o| o.origin), "record_order")?;
        whole_stream_only(self.heavy_hitters.map(|h| h.origin), "heavy_hitters")?;
        if let Some(w) = self.window {
            let field = match w.value.tokens {
                Some(_) => "recent_fp_tokens",
                None => "recent_fraction",
            };
            whole_stream_only(Some(w.origin), field)?;
            if let Some(f) = w.value.fraction {
                check_window_fraction(f, &w.origin.path("recent_fraction"))?;
            }
        }
        if let Some(b) = self.basis
            && b.value.fits_basis()
            && kind != CodecKind::Mse
        {
            return Err(AllocationError::field(
                b.origin.path("basis"),
                FieldProblem::NotApplicable { codec: kind },
            ));
        }
        let not_applicable = |origin: Origin, field: &str| {
            AllocationError::field(
                origin.path(field),
                FieldProblem::NotApplicable { codec: kind },
            )
        };
        if !kind.is_quantized() {
            if let Some(b) = self.bits {
                return Err(not_applicable(b.origin, "bits"));
            }
            if let Some(r) = self.rotation {
                return Err(not_applicable(r.origin, "rotation"));
            }
            if let Some(n) = self.norm_correction {
                return Err(not_applicable(n.origin, "norm_correction"));
            }
            if let Some(h) = self.heavy_hitters {
                return Err(AllocationError::field(
                    h.origin.path("heavy_hitters"),
                    FieldProblem::NothingToKeep { codec: kind },
                ));
            }
        }
        if kind != CodecKind::Prod {
            if let Some(q) = self.qjl {
                return Err(not_applicable(q.origin, "qjl"));
            }
            if let Some(s) = self.scale {
                return Err(not_applicable(s.origin, "scale"));
            }
            if let Some(s) = self.shrinkage {
                return Err(not_applicable(s.origin, "shrinkage"));
            }
        }
        let bits = match (kind.bits_range(), self.bits) {
            (None, _) => 0,
            (Some(_), None) => {
                return Err(AllocationError::field(
                    codec.origin.path("bits"),
                    FieldProblem::BitsRequired { codec: kind },
                ));
            }
            (Some((lo, hi)), Some(b)) if !(lo..=hi).contains(&b.value) => {
                return Err(AllocationError::field(
                    b.origin.path("bits"),
                    FieldProblem::BitsOutOfRange {
                        bits: b.value,
                        codec: kind,
                        supported: if kind == CodecKind::Prod {
                            "2..=9"
                        } else {
                            "1..=8"
                        },
                    },
                ));
            }
            (Some(_), Some(b)) => b.value,
        };
        let shrinkage = match self.shrinkage {
            None => 1.0,
            Some(s) => {
                // Checked after the f32 conversion too: 1e300 or 1e-50 are finite and positive
                // as f64 but become inf or 0 in the f32 the sketch uses.
                let single = s.value as f32;
                if !(s.value.is_finite() && s.value > 0.0 && single.is_finite() && single > 0.0) {
                    return Err(AllocationError::field(
                        s.origin.path("shrinkage"),
                        FieldProblem::BadShrinkage { value: s.value },
                    ));
                }
                single
            }
        };
        let heavy_hitters = match self.heavy_hitters {
            None => None,
            Some(h) => {
                // As for shrinkage: the factor the stream compares against is an f32.
                let single = h.value as f32;
                if !(h.value.is_finite() && h.value > 0.0 && single.is_finite() && single > 0.0) {
                    return Err(AllocationError::field(
                        h.origin.path("heavy_hitters"),
                        FieldProblem::BadHeavyHitters { value: h.value },
                    ));
                }
                Some(single)
            }
        };
        let qjl = self.qjl.map_or(SketchKind::Haar, |q| q.value);
        let default_scale = match qjl {
            SketchKind::Gaussian => SketchScale::Paper,
            SketchKind::Haar | SketchKind::Hadamard => SketchScale::Exact,
        };
        Ok(Resolved {
            codec: kind,
            codec_origin: codec.origin,
            bits,
            rotation: self.rotation.map_or(RotationKind::Hadamard, |r| r.value),
            qjl,
            scale: self.scale.map_or(default_scale, |s| s.value),
            shrinkage,
            norm_correction: self.norm_correction.is_some_and(|n| n.value),
            center: self.center.map_or(CenterPolicy::None, |c| c.value),
            basis: self.basis.map_or(BasisPolicy::None, |b| b.value),
            basis_path: self.basis.map(|b| b.origin),
            basis_bits: self.basis_bits.map_or(GroupWidths::ALL, |b| b.value),
            record_order: self.record_order.map_or(RecordOrder::Rows, |o| o.value),
            window: self.window.map(|w| w.value),
            heavy_hitters,
            heavy_hitters_path: self.heavy_hitters.map(|h| h.origin),
        })
    }
}

impl Resolved {
    /// The codec spec for a tier of dimension `dim` with the given rotation and sketch seeds.
    pub fn spec(&self, dim: usize, rotation_seed: u64, sketch_seed: u64) -> CodecSpec {
        let mse = MseSpec {
            dim,
            bits: self.bits,
            rotation: self.rotation,
            seed: rotation_seed,
            norm_correction: self.norm_correction,
        };
        match self.codec {
            CodecKind::F32 => CodecSpec::F32 { dim },
            CodecKind::F16 => CodecSpec::F16 { dim },
            CodecKind::Mse => CodecSpec::Mse(mse),
            CodecKind::DebiasedMse => CodecSpec::DebiasedMse(mse),
            CodecKind::Prod => CodecSpec::Prod(ProdSpec {
                dim,
                bits: self.bits,
                rotation: self.rotation,
                seed: rotation_seed,
                norm_correction: self.norm_correction,
                sketch: QjlSpec {
                    kind: self.qjl,
                    dim,
                    seed: sketch_seed,
                    scale: self.scale,
                    shrinkage: self.shrinkage,
                },
            }),
        }
    }
}

/// A window fraction must lie in `[0, 1)`: a window as long as the cache would hold no codes.
pub(crate) fn check_window_fraction(fraction: f64, path: &str) -> Result<(), AllocationError> {
    if (0.0..1.0).contains(&fraction) {
        Ok(())
    } else {
        Err(AllocationError::field(
            path,
            FieldProblem::BadWindowFraction { value: fraction },
        ))
    }
}

/// A setting of the whole stream (centering, basis, record order, window, heavy hitters) given in
/// `[outliers]`, which configures one tier: the field's path with
/// [`FieldProblem::WholeStreamOnly`].
fn whole_stream_only(origin: Option<Origin>, field: &str) -> Result<(), AllocationError> {
    match origin {
        Some(o) if o.section == Section::Outliers => Err(AllocationError::field(
            o.path(field),
            FieldProblem::WholeStreamOnly,
        )),
        _ => Ok(()),
    }
}
