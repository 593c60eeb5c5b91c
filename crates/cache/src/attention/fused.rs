//! Fused rotated-domain attention over packed codes.
//!
//! Per query head: rotate the (scaled) query once, `q̃ = Π_K·q`, and for TQ_prod keys project it
//! once more, `α·s·S·q̃` (the sketch query). A compressed key then costs one unpack of its codes
//! into centroids, shared by every query head of the GQA group, and per head one dot product
//! with the centroids and one with the ±1 signs: `score = norm·⟨q̃, c[idx]⟩ + γ·⟨α·s·S·q̃, z⟩`.
//! Values accumulate in the rotated domain, `Σ p·norm·c[idx]`, and for TQ_prod values in the
//! sketch domain too, `Σ p·γ·z`; each output then costs one `Sᵀ` and one `Π_Vᵀ`, not one per
//! token. Full-precision tokens (f16/f32 streams, sinks, the recent window) accumulate in the
//! original domain beside them. A two-tier record is two parts, each with its own channels,
//! codec and rotation: scores add over the parts, and each part's output is mapped back and
//! scattered to its channels. A record over a data-aware [basis](crate::basis) is one part per
//! equal-bit group: the query is projected onto the basis once (`U·q`), each group gathers its
//! components, rotates them and folds its scale `a_G` in; outputs scatter to the components
//! (times `a_G`) and map back through `Uᵀ` once per output row. The inner loops are the run kernels of [`simd`](super::simd)
//! (AVX2, NEON or scalar, chosen once per call). A body stored in the fast-scan order
//! ([`RecordOrder::FastScan`]: TQ_mse records or basis records, 32 tokens per block,
//! nibble-major, codes of 3 and 5 to 8 bits as bit planes) is scored with per-head tables (one
//! over all of a basis record's groups) and its values summed in integers from its blocks,
//! group by group, by the [`fast_scan`] run kernels instead.
//!
//! Work splits into blocks of [`block_tokens`] visible tokens per (query, KV head) (256 up
//! to 2048, growing with the visible range so per-block costs stay small), flash-decoding style: each block keeps its own max, sum and accumulators, and blocks are
//! combined in order afterwards. Block boundaries depend only on the visible range, so the
//! result is bit-identical whatever the number of threads.

use half::f16;
use rayon::prelude::*;
use tq_qjl::QjlSketch;
use tq_rotation::Rotation;

use super::fast_scan;
use super::simd::{self, CodedRun, Isa, KeyQueries, PlainKind, PlainRun};
use super::{AttentionShape, check_shapes};
use crate::error::CacheError;
use crate::heavy_hitters::{GatheredRow, ReceivedWeights};
use crate::kv_cache::KvCache;
use crate::record_order::RecordOrder;
use crate::stream::Stream;
use crate::token_codec::TokenCodec;
use crate::token_store::RunRecords;

/// Fewest visible tokens per work item.
pub const BLOCK_TOKENS: usize = 256;

/// Most visible tokens per work item.
pub const MAX_BLOCK_TOKENS: usize = 2048;

/// Most blocks one wave of a fused call holds partials for (see `attend_with`): about 1 MB of
/// partials at head dim 64 and GQA 3, and still hundreds of blocks to spread over threads.
const MAX_WAVE_TASKS: usize = 1024;

/// Most (query, KV head) items one wave prepares queries for: with QJL keys each item holds
/// sign tables of `ceil(m/8)·4 KiB` per tile of heads (32 KiB at m = 64), so 128 items are
/// about 4 MB, where a 256-token chunk's 768 items would be 24 MB; still 128 or more blocks
/// per wave to spread over threads.
const MAX_WAVE_ITEMS: usize = 128;

/// Tokens per block for a visible range of `len` tokens: about `len/16` (so each (query, KV
/// head) still splits into a dozen or more blocks to spread over threads), rounded to a power of
/// two within `[BLOCK_TOKENS, MAX_BLOCK_TOKENS]`. A pure function of the range, so block
/// boundaries, and with them the result, never depend on the thread count.
pub fn block_tokens(len: usize) -> usize {
    (len / 16)
        .next_power_of_two()
        .clamp(BLOCK_TOKENS, MAX_BLOCK_TOKENS)
}

/// How the vectors of one part are stored.
enum Body<'a> {
    Plain(PlainKind),
    Codes {
        bits: u8,
        centroids: &'a [f32],
        rotation: &'a Rotation,
        /// Words of codes at the start of the part (sign words follow for TQ_prod).
        code_words: usize,
        sketch: Option<&'a QjlSketch>,
        correction: f32,
    },
}

/// Most parts a record has: two tiers, or up to eight groups of a basis record (bits 8 to 1).
const MAX_PARTS: usize = 8;

/// One part of a record: the whole record, one tier of a two-tier record or one equal-bit group
/// of a basis record.
struct Part<'a> {
    body: Body<'a>,
    /// Dimension of the part's vectors.
    dim: usize,
    /// The head channels of the part's coordinates (`None`: all, in order).
    channels: Option<&'a [u16]>,
    /// Word index of the part within a record.
    word_offset: usize,
    /// Index of the part's first scale within a record's scales.
    scale_offset: usize,
    /// The fixed factor of the part's decoded vectors (a basis group's `a_G`, else 1): folded
    /// into the prepared query for keys, applied once per output for values.
    gain: f32,
}

impl Part<'_> {
    /// Sketch dimension `m` (0 without QJL signs).
    fn sketch_dim(&self) -> usize {
        match &self.body {
            Body::Codes {
                sketch: Some(s), ..
            } => s.rows(),
            _ => 0,
        }
    }

    /// A coded run of this part over `words` (whole records of `record_words`) reading its
    /// norms from the run's f32 `scales`; `None` for plain parts.
    fn coded_run<'b>(
        &'b self,
        words: &'b [u32],
        record_words: usize,
        scales: &'b Scales,
    ) -> Option<CodedRun<'b>> {
        match &self.body {
            Body::Codes {
                bits,
                centroids,
                code_words,
                ..
            } => Some(CodedRun {
                words,
                record_words,
                code_offset: self.word_offset,
                bits: *bits,
                dim: self.dim,
                centroids,
                sign_offset: self.word_offset + code_words,
                sketch_dim: self.sketch_dim(),
                scales: scales.of(self),
                scale_stride: scales.per_token,
            }),
            Body::Plain(_) => None,
        }
    }
}

fn body_of(codec: &TokenCodec) -> Result<Body<'_>, CacheError> {
    Ok(match codec {
        TokenCodec::F32 { .. } => Body::Plain(PlainKind::F32),
        TokenCodec::F16 { .. } => Body::Plain(PlainKind::F16),
        TokenCodec::Mse(c) => Body::Codes {
            bits: c.spec().bits,
            centroids: c.codebook().centroids_f32(),
            rotation: c.rotation(),
            code_words: c.words_per_vector(),
            sketch: None,
            correction: 1.0,
        },
        TokenCodec::DebiasedMse(d) => Body::Codes {
            bits: d.codec().spec().bits,
            centroids: d.codec().codebook().centroids_f32(),
            rotation: d.codec().rotation(),
            code_words: d.codec().words_per_vector(),
            sketch: None,
            correction: d.correction(),
        },
        TokenCodec::Prod(c) => Body::Codes {
            bits: c.mse().spec().bits,
            centroids: c.mse().codebook().centroids_f32(),
            rotation: c.mse().rotation(),
            code_words: c.mse().words_per_vector(),
            sketch: Some(c.sketch()),
            correction: 1.0,
        },
        TokenCodec::TwoTier(_) | TokenCodec::Basis(_) => {
            return Err(CacheError::InvalidConfig(
                "a two-tier or basis codec cannot be a part of another".into(),
            ));
        }
        TokenCodec::Q8(_) => {
            return Err(CacheError::InvalidConfig(
                "q8 stores window copies, not a stream's body".into(),
            ));
        }
    })
}

/// The parts of a record: one, two for a two-tier record, one per group of a basis record (a
/// fixed array, not a `Vec`: the decode loop builds these per call and must not allocate).
struct Parts<'a> {
    items: [Part<'a>; MAX_PARTS],
    len: usize,
    /// The basis a basis record's parts live in: queries are projected onto its rows before
    /// the parts gather them, and outputs are mapped back through them after scattering.
    basis: Option<&'a crate::basis::BasisCodec>,
}

impl<'a> std::ops::Deref for Parts<'a> {
    type Target = [Part<'a>];

    fn deref(&self) -> &[Part<'a>] {
        &self.items[..self.len]
    }
}

/// The unused second slot of a one-part record.
fn no_part<'a>() -> Part<'a> {
    Part {
        body: Body::Plain(PlainKind::F32),
        dim: 0,
        channels: None,
        word_offset: 0,
        scale_offset: 0,
        gain: 1.0,
    }
}

/// The parts of a stream codec's records.
fn parts_of(codec: &TokenCodec) -> Result<Parts<'_>, CacheError> {
    let mut items: [Part<'_>; MAX_PARTS] = std::array::from_fn(|_| no_part());
    match codec {
        TokenCodec::TwoTier(c) => {
            items[0] = Part {
                body: body_of(c.outlier())?,
                dim: c.outlier().dim(),
                channels: Some(c.channels()),
                word_offset: 0,
                scale_offset: 0,
                gain: 1.0,
            };
            items[1] = Part {
                body: body_of(c.rest())?,
                dim: c.rest().dim(),
                channels: Some(c.rest_channels()),
                word_offset: c.outlier().record_words(),
                scale_offset: c.outlier().scales_per_token(),
                gain: 1.0,
            };
            Ok(Parts {
                items,
                len: 2,
                basis: None,
            })
        }
        TokenCodec::Basis(c) => {
            let groups = c.groups();
            if groups.len() > MAX_PARTS {
                return Err(CacheError::InvalidConfig(format!(
                    "a basis of {} groups (at most {MAX_PARTS})",
                    groups.len()
                )));
            }
            for (item, group) in items.iter_mut().zip(groups) {
                *item = Part {
                    body: Body::Codes {
                        bits: group.bits,
                        centroids: group.codebook.centroids_f32(),
                        rotation: &group.rotation,
                        code_words: group.words(),
                        sketch: None,
                        correction: 1.0,
                    },
                    dim: group.len(),
                    channels: Some(&group.components),
                    word_offset: group.word_offset,
                    // Every group shares the record's one norm.
                    scale_offset: 0,
                    gain: group.scale,
                };
            }
            Ok(Parts {
                items,
                len: groups.len(),
                basis: Some(c),
            })
        }
        _ => {
            items[0] = Part {
                body: body_of(codec)?,
                dim: codec.dim(),
                channels: None,
                word_offset: 0,
                scale_offset: 0,
                gain: 1.0,
            };
            Ok(Parts {
                items,
                len: 1,
                basis: None,
            })
        }
    }
}

fn plain_kind(codec: &TokenCodec) -> PlainKind {
    match codec {
        TokenCodec::F32 { .. } => PlainKind::F32,
        _ => PlainKind::F16,
    }
}

/// The key and value parts of one KV head.
struct HeadPlan<'a> {
    keys: &'a Stream,
    values: &'a Stream,
    key_parts: Parts<'a>,
    value_parts: Parts<'a>,
}

/// The plan of KV head `g` (cheap: it only borrows the codecs, so it is rebuilt where needed
/// instead of being collected).
fn head_plan(cache: &KvCache, g: usize) -> Result<HeadPlan<'_>, CacheError> {
    let (keys, values) = (cache.keys(g), cache.values(g));
    let plan = HeadPlan {
        keys,
        values,
        key_parts: parts_of(keys.codec())?,
        value_parts: parts_of(values.codec())?,
    };
    // The fast-scan runs read coded parts one after another, in nibbles or as bit planes
    // (`stream::body_order` gives that order to no other body).
    for (stream, parts) in [(keys, &plan.key_parts), (values, &plan.value_parts)] {
        if stream.body().order() == RecordOrder::FastScan && !fast_scan_parts(parts) {
            return Err(CacheError::InvalidConfig(
                "a fast-scan body must hold codes of 1 to 8 bits, part after part".into(),
            ));
        }
    }
    Ok(plan)
}

/// Whether every part of a record is codes of 1 to 8 bits (TQ_prod's sign words after them,
/// read as 1-bit codes), each part's words following the previous part's: what the fast-scan
/// runs read, a part's nibble lanes (or bit planes,
/// [`record_order::plane_spans`](crate::record_order::plane_spans)) starting at 8 per word
/// before it. Parts may read different scales (two tiers: a norm each; TQ_prod's signs: `γ`);
/// the keys are then scored once per scale ([`PreparedGroup::table_scales`]).
fn fast_scan_parts(parts: &Parts<'_>) -> bool {
    let mut words = 0;
    !parts.is_empty()
        && parts.iter().all(|part| match part.body {
            Body::Codes {
                bits: 1..=8,
                sketch,
                code_words,
                ..
            } if part.word_offset == words => {
                // TQ_prod's signs follow its codes: 1-bit codes of their own scale (`γ`).
                words += code_words + sketch.map_or(0, QjlSketch::words);
                true
            }
            _ => false,
        })
}

/// The centroids of a QJL sign read as a 1-bit code: bit 1 is `+1`, bit 0 is `−1`.
const SIGN_CENTROIDS: [f32; 2] = [-1.0, 1.0];

/// Where part `part` of a record of `record_words` words lies in a fast-scan block.
fn run_part(part: &Part<'_>, record_words: usize) -> fast_scan::RunPart {
    let (code_words, bits) = match part.body {
        Body::Codes {
            code_words, bits, ..
        } => (code_words, bits),
        Body::Plain(_) => (0, 0),
    };
    fast_scan::RunPart {
        block_lanes: 8 * record_words,
        first_lane: 8 * part.word_offset,
        lanes: 8 * code_words,
        dim: part.dim,
        bits,
    }
}

/// The query heads of one GQA group prepared against one key part, `[group, ·]` row-major.
#[derive(Default)]
struct PreparedPart {
    /// `scale·q` on the part's channels (what a plain part scores against).
    gathered: Vec<f32>,
    /// For a coded part: `scale·correction·Π_K·q` and, for TQ_prod parts,
    /// `α·s·S·(scale·Π_K·q)`.
    keys: KeyQueries,
    coded: bool,
}

/// The query heads of one GQA group prepared against one key stream; kept between calls (see
/// [`Workspace`]).
#[derive(Default)]
struct PreparedGroup {
    /// `scale·q` over the whole head, for full-precision copies (`[group, d]`).
    plain: Vec<f32>,
    /// `U·(scale·q)` for a basis stream (`[group, r]`), what its parts gather from.
    projected: Vec<f32>,
    /// `Π_w·(scale·q)` for a stream with an 8-bit window (`[group, d]`, empty otherwise): the
    /// query in the coordinates of the window's codes
    /// ([`Q8Window::rotate`](crate::codec::Q8Window::rotate)).
    window: Vec<f32>,
    /// One per key part (only the first `parts.len()` of the current codec are meaningful).
    parts: Vec<PreparedPart>,
    /// For a key body in the fast-scan order, each head's byte table of the parts' rotated
    /// queries ([`fast_scan::ScoreTable`]), one set of heads per scale the parts read
    /// (`[table_scales.len(), heads]`); empty otherwise.
    tables: Vec<fast_scan::ScoreTable>,
    /// The scale (index within a record's scales) each set of `tables` is multiplied by: one
    /// set for parts that share a norm (a plain or basis record), one per tier for two tiers
    /// and one each for TQ_prod's codes (the norm) and signs (`γ`), each table scoring its
    /// scale's lanes and skipping the others'.
    table_scales: Vec<usize>,
    /// For keys with a RoPE-aware center (`center = "rope"`): per head, the coefficients of
    /// `q·c(t)` ([`rope_center::bias_coefficients`](crate::rope_center::bias_coefficients),
    /// `[group, d]`) and the table of block angles they are summed against; empty / `None`
    /// otherwise.
    center: Vec<f32>,
    center_angles: Option<std::sync::Arc<crate::rope_center::CenterAngles>>,
    /// The 8-entry chunks of `center` some head needs ([`simd::live_center_chunks`]).
    center_live: Vec<u32>,
}

/// [`PreparedGroup::center`] for the keys of one KV head (after [`prepare`]).
fn prepare_center(keys: &Stream, d: usize, out: &mut PreparedGroup) {
    out.center.clear();
    out.center_live.clear();
    out.center_angles = None;
    if let Some((m, pairs, angles)) = keys.rope_center() {
        out.center.resize(out.plain.len(), 0.0);
        for (q, c) in out
            .plain
            .chunks_exact(d)
            .zip(out.center.chunks_exact_mut(d))
        {
            crate::rope_center::bias_coefficients(q, m, pairs, c);
        }
        simd::live_center_chunks(&out.center, d, &mut out.center_live);
        out.center_angles = Some(angles);
    }
}

/// [`PreparedGroup::tables`] for the keys of one KV head: per query head, one table over
/// every part of the record (a basis record's groups one after another), each part against
/// its own prepared query (scales folded in) and codebook.
fn prepare_tables(
    keys: &Stream,
    parts: &Parts<'_>,
    out: &mut PreparedGroup,
) -> Result<(), CacheError> {
    if keys.body().order() != RecordOrder::FastScan {
        out.tables.clear();
        return Ok(());
    }
    let table_error = |e: fast_scan::FastScanError| {
        CacheError::InvalidConfig(format!("fast-scan query table: {e}"))
    };
    let record_lanes = 8 * keys.codec().record_words();
    let heads = out.plain.len() / keys.codec().dim().max(1);
    // The scales the parts read (a TQ_prod part's signs read the next one, `γ`), in their
    // order: one set of tables each.
    out.table_scales.clear();
    for part in parts.iter() {
        let signs = part.sketch_dim() > 0;
        for scale in [
            Some(part.scale_offset),
            signs.then_some(part.scale_offset + 1),
        ]
        .into_iter()
        .flatten()
        {
            if !out.table_scales.contains(&scale) {
                out.table_scales.push(scale);
            }
        }
    }
    // Kept between calls and rebuilt in place: a decode step allocates no table.
    let sets = out.table_scales.len();
    out.tables.truncate(sets * heads);
    let empty = fast_scan::TablePart {
        query: &[],
        centroids: &[],
        bits: 0,
        lanes: 0,
    };
    for (set, &scale) in out.table_scales.iter().enumerate() {
        for h in 0..heads {
            // `head_plan` admits only coded parts in this order; a TQ_prod part is two table
            // parts, its codes and its signs.
            let mut table_parts = [empty; 2 * MAX_PARTS];
            let mut count = 0;
            for (part, prepared) in parts.iter().zip(&out.parts) {
                let Body::Codes {
                    bits,
                    centroids,
                    code_words,
                    sketch,
                    ..
                } = part.body
                else {
                    return Err(CacheError::InvalidConfig(
                        "a fast-scan body must hold codes".into(),
                    ));
                };
                // A part of another scale: its lanes skipped (an empty query).
                let query = if part.scale_offset == scale {
                    &prepared.keys.queries()[h * part.dim..(h + 1) * part.dim]
                } else {
                    &[]
                };
                table_parts[count] = fast_scan::TablePart {
                    query,
                    centroids,
                    bits,
                    lanes: 8 * code_words,
                };
                count += 1;
                if let Some(sketch) = sketch {
                    let m = sketch.rows();
                    let query = if part.scale_offset + 1 == scale {
                        &prepared.keys.sketch()[h * m..(h + 1) * m]
                    } else {
                        &[]
                    };
                    table_parts[count] = fast_scan::TablePart {
                        query,
                        centroids: &SIGN_CENTROIDS,
                        bits: 1,
                        lanes: 8 * sketch.words(),
                    };
                    count += 1;
                }
            }
            let table_parts = &table_parts[..count];
            let at = set * heads + h;
            if at == out.tables.len() {
                out.tables.push(fast_scan::ScoreTable::default());
            }
            out.tables[at]
                .rebuild_parts(table_parts, record_lanes)
                .map_err(table_error)?;
        }
    }
    Ok(())
}

/// [`PreparedGroup::window`]: the scaled query rows in the coordinates of the keys' 8-bit
/// window codes (emptied when the keys' window is not 8-bit).
fn prepare_window(keys: &Stream, d: usize, out: &mut PreparedGroup) -> Result<(), CacheError> {
    out.window.clear();
    if let TokenCodec::Q8(codec) = keys.recent_codec() {
        out.window.resize(out.plain.len(), 0.0);
        for (rotated, q) in out
            .window
            .chunks_exact_mut(d)
            .zip(out.plain.chunks_exact(d))
        {
            codec.rotate(q, rotated)?;
        }
    }
    Ok(())
}

/// Buffers of [`combine`] for one item.
#[derive(Default)]
struct CombineScratch {
    full: Vec<f32>,
    weights: Vec<f32>,
    values: Vec<f32>,
    signs: Vec<f32>,
    back: Vec<f32>,
    original: Vec<f32>,
    /// A basis stream's output in the basis domain (`[r]`) before `Uᵀ`.
    components: Vec<f32>,
}

/// `buffer` as `len` zeros, reusing its capacity.
/// The first `len` values of `buffer`, grown (with zeros) if shorter but never cleared: for a
/// buffer whose every value a step reads it writes first, where zeroing it was a cost of its
/// own.
fn grown<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
    &mut buffer[..len]
}

fn zeroed(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.clear();
    buffer.resize(len, 0.0);
    buffer
}

fn prepare(
    isa: Isa,
    parts: &Parts<'_>,
    queries: &[f32],
    d: usize,
    scale: f32,
    out: &mut PreparedGroup,
) -> Result<(), CacheError> {
    out.plain.clear();
    out.plain.extend(queries.iter().map(|v| v * scale));
    let group = out.plain.len() / d;
    // A basis record's parts gather from the projected query, others from the query itself.
    let (source, width) = match parts.basis {
        Some(basis) => {
            let r = basis.rank();
            let projected = zeroed(&mut out.projected, group * r);
            for (p, q) in projected.chunks_exact_mut(r).zip(out.plain.chunks_exact(d)) {
                basis.project(q, p);
            }
            (&out.projected, r)
        }
        None => (&out.plain, d),
    };
    if out.parts.len() < parts.len() {
        out.parts.resize_with(parts.len(), PreparedPart::default);
    }
    for (part, prepared) in parts.iter().zip(out.parts.iter_mut()) {
        let dp = part.dim;
        let gathered = zeroed(&mut prepared.gathered, group * dp);
        for (row, q) in gathered
            .chunks_exact_mut(dp)
            .zip(source.chunks_exact(width))
        {
            match part.channels {
                Some(channels) => {
                    for (v, &c) in row.iter_mut().zip(channels) {
                        *v = q[usize::from(c)];
                    }
                }
                None => row.copy_from_slice(q),
            }
        }
        let Body::Codes {
            rotation,
            sketch,
            correction,
            ..
        } = &part.body
        else {
            prepared.coded = false;
            continue;
        };
        prepared.coded = true;
        // The part's fixed gain is folded into the query: one multiply per query, not per key.
        let correction = correction * part.gain;
        let m = part.sketch_dim();
        let gathered = &prepared.gathered;
        prepared
            .keys
            .rebuild(isa, dp, m, true, |rotated, sketch_rows| {
                rotated.resize(gathered.len(), 0.0);
                for (q, r) in gathered.chunks_exact(dp).zip(rotated.chunks_exact_mut(dp)) {
                    rotation
                        .apply(q, r)
                        .map_err(crate::codec::CodecError::from)?;
                }
                if let Some(sketch) = sketch {
                    let gain = sketch.gain() as f32;
                    sketch_rows.resize(m * group, 0.0);
                    for (r, p) in rotated
                        .chunks_exact(dp)
                        .zip(sketch_rows.chunks_exact_mut(m))
                    {
                        sketch
                            .project(r, p)
                            .map_err(crate::codec::CodecError::from)?;
                        p.iter_mut().for_each(|v| *v *= gain);
                    }
                }
                if correction != 1.0 {
                    rotated.iter_mut().for_each(|v| *v *= correction);
                }
                Ok::<(), CacheError>(())
            })?;
    }
    Ok(())
}

/// One part's accumulators in a block: `[group, dim]` (original domain for plain parts,
/// rotated domain for coded ones) and `[group, m]` in the sketch domain; empty when unused.
#[derive(Default)]
struct PartAccumulators {
    values: Vec<f32>,
    signs: Vec<f32>,
}

/// The partial result of one block for the heads of one GQA group (kept between calls, see
/// [`Workspace`]: `full` and the accumulators are emptied, not freed, when a block starts).
#[derive(Default)]
struct BlockPartial {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[group, d]` accumulator of the full-precision copies (empty when unused).
    full: Vec<f32>,
    /// One per value part (only the first `value_parts.len()` are meaningful).
    parts: Vec<PartAccumulators>,
    /// With heavy hitters: `e^(s − max)` of the block's tokens from `gathered_first` on,
    /// `[group, n]` (empty when the block gathers none).
    gathered: Vec<f32>,
    gathered_first: usize,
}

/// One thread's working buffers of [`run_block`]: scores and probabilities of a block, the
/// scales of a run and the scaled weights. Per thread rather than per block, because prefill
/// runs thousands of blocks at once and keeping a score buffer per block would hold megabytes
/// between calls; each buffer is reserved for the largest block ([`MAX_BLOCK_TOKENS`]) on a
/// thread's first use, so decoding never grows it.
#[derive(Default)]
struct BlockScratch {
    scores: Vec<f32>,
    probabilities: Vec<f32>,
    code_weights: Vec<f32>,
    sign_weights: Vec<f32>,
    scales: Scales,
    /// `[group, d]`: the weighted 8-bit window copies of a block, in their rotated
    /// coordinates (empty when the block has none; see [`walk`]).
    window_values: Vec<f32>,
    /// One head's row of `window_values` turned back.
    window_back: Vec<f32>,
    /// An 8-bit copy as f32 bit patterns, `s·c_j` (exact in f32).
    window_words: Vec<u32>,
    /// The value sums of fast-scan runs.
    fast: fast_scan::RunScratch,
    /// `[group, n]`: a fast-scan run's weights with its kept heavy hitters' zeroed.
    masked: Vec<f32>,
    /// The scores (`[group, n]`), then the token-major weights, of a run's `n` kept heavy
    /// hitters.
    kept_values: Vec<f32>,
    /// `[group, blocks]`: the RoPE-aware key center's corrections of the block's center blocks.
    center_biases: Vec<f32>,
}

/// Tokens `run` of the head-major `[group, len]` weights `scores` written token-major into
/// the same tokens of `out` (`[len, group]`), and returned.
fn token_major<'o>(
    scores: &[f32],
    len: usize,
    group: usize,
    run: std::ops::Range<usize>,
    out: &'o mut [f32],
) -> &'o [f32] {
    let out = &mut out[run.start * group..run.end * group];
    for (h, row) in scores.chunks_exact(len).enumerate() {
        for (p, &s) in out.iter_mut().skip(h).step_by(group).zip(&row[run.clone()]) {
            *p = s;
        }
    }
    out
}

/// The 8-bit copies `codes` (one step per record in `steps`) as an f32 plain run in the window
/// codec's rotated coordinates, `s·c_j` (exact in f32), written into `words`
/// ([`simd::q8_to_f32_bits`]: eight codes an instruction on AVX2). The buffer only grows: every
/// value the run holds is written, so it is not zeroed first (zeroing it was as costly as the
/// conversion).
fn q8_as_f32<'w>(
    isa: Isa,
    codes: &[u32],
    steps: &[f16],
    d: usize,
    words: &'w mut Vec<u32>,
) -> PlainRun<'w> {
    let words = grown(words, steps.len() * d);
    simd::q8_to_f32_bits(isa, codes, steps, d, words);
    PlainRun {
        words,
        record_words: d,
        offset: 0,
        kind: PlainKind::F32,
        dim: d,
    }
}

thread_local! {
    static BLOCK_SCRATCH: std::cell::RefCell<BlockScratch> =
        std::cell::RefCell::new(BlockScratch::default());
}

/// Reserves room for `len` values (at least), so later calls up to that size do not grow it.
fn reserve_for(buffer: &mut Vec<f32>, len: usize) {
    if buffer.capacity() < len {
        buffer.reserve_exact(len - buffer.len());
    }
}

/// The buffers of one fused attention call: one prepared group per (query, KV head) item, the
/// block tasks and their partials. Calls take one from [`WORKSPACES`] and put it back, so a
/// decode step reuses the buffers of the previous one instead of allocating its own.
#[derive(Default)]
struct Workspace {
    prepared: Vec<PreparedGroup>,
    combine: Vec<CombineScratch>,
    tasks: Vec<Task>,
    partials: Vec<BlockPartial>,
    first_task: Vec<usize>,
    task_count: Vec<usize>,
}

/// One block of work: (item in the wave, block range, key and value window starts, the first
/// token whose weight is gathered for heavy hitters).
type Task = (usize, std::ops::Range<usize>, [usize; 2], Option<usize>);

/// Idle workspaces (one per concurrent caller at most).
static WORKSPACES: std::sync::Mutex<Vec<Workspace>> = std::sync::Mutex::new(Vec::new());

/// What [`walk`] hands over: a run of body records, or one copy (plain, or 8-bit).
#[derive(Clone, Copy)]
enum Record<'a> {
    Body,
    /// Body records in the fast-scan order: the blocks covering the run, which starts at slot
    /// `lead` of the first (the visit's words are empty). `kept`: the run holds kept heavy
    /// hitters, whose copies are visited after it as [`Record::Kept`] — their codes must weigh
    /// nothing in the run's value sums.
    FastScan {
        codes: &'a [u8],
        lead: usize,
        kept: bool,
    },
    /// Kept heavy hitters inside the fast-scan run just visited (ascending, their copies
    /// together in the visit's words and scales, the visit's first token the first of them):
    /// each copy (`Q8` or `Plain`) replaces the score the run gave its token's codes.
    Kept {
        kind: CopyKind,
        tokens: &'a [u32],
    },
    Plain(PlainKind),
    /// An 8-bit window copy (words: its codes; scales: its step). The codes live in the
    /// window codec's rotated coordinates, so the copy is scored against the rotated query
    /// ([`PreparedGroup::window`]) and weighted into a rotated accumulator turned back once per
    /// block — never decoded per token.
    Q8,
}

/// The kind of a token's copy, where [`Record::Kept`] names it.
#[derive(Clone, Copy)]
enum CopyKind {
    Plain(PlainKind),
    Q8,
}

impl CopyKind {
    /// The record a copy of this kind is read as.
    fn record<'a>(self) -> Record<'a> {
        match self {
            CopyKind::Plain(kind) => Record::Plain(kind),
            CopyKind::Q8 => Record::Q8,
        }
    }
}

impl Record<'_> {
    /// The kind of copy a `Plain` or `Q8` record is (`None` for the others).
    fn copy(self) -> Option<CopyKind> {
        match self {
            Record::Plain(kind) => Some(CopyKind::Plain(kind)),
            Record::Q8 => Some(CopyKind::Q8),
            _ => None,
        }
    }
}

/// The `n` copies of kind `kind` in `words`/`halves`, f32 words of an 8-bit run converted into
/// `q8_words`: the run the plain kernels read.
fn copies_run<'w>(
    isa: Isa,
    kind: CopyKind,
    (words, halves, n): (&'w [u32], &[f16], usize),
    d: usize,
    q8_words: &'w mut Vec<u32>,
) -> PlainRun<'w> {
    match kind {
        CopyKind::Q8 => q8_as_f32(isa, words, halves, d, q8_words),
        CopyKind::Plain(kind) => PlainRun {
            words,
            record_words: words.len() / n,
            offset: 0,
            kind,
            dim: d,
        },
    }
}

/// Adds the scores of `n` copies to `out` (`[group, stride]`): an 8-bit copy, `(Πq)·(s·c)`, in
/// its rotated coordinates against the rotated queries ([`PreparedGroup::window`]); a plain
/// one against the plain queries.
fn score_copies(
    isa: Isa,
    kind: CopyKind,
    copies: (&[u32], &[f16], usize),
    (prepared, d): (&PreparedGroup, usize),
    q8_words: &mut Vec<u32>,
    out: &mut [f32],
    stride: usize,
) {
    let queries = match kind {
        CopyKind::Q8 => &prepared.window,
        CopyKind::Plain(_) => &prepared.plain,
    };
    let run = copies_run(isa, kind, copies, d, q8_words);
    simd::score_plain(isa, &run, queries, out, stride);
}

/// Adds `n` copies weighted by `weights` (token-major `[n, group]`): 8-bit copies to
/// `window_values` in their rotated coordinates (turned back once per block), plain ones to
/// `full`; each accumulator `[group, d]`, created on first use.
fn accumulate_copies(
    isa: Isa,
    kind: CopyKind,
    copies: (&[u32], &[f16], usize),
    (d, group): (usize, usize),
    weights: &[f32],
    q8_words: &mut Vec<u32>,
    (window_values, full): (&mut Vec<f32>, &mut Vec<f32>),
) {
    let acc = match kind {
        CopyKind::Q8 => window_values,
        CopyKind::Plain(_) => full,
    };
    let run = copies_run(isa, kind, copies, d, q8_words);
    simd::accumulate_plain(isa, &run, weights, ensure(acc, group * d));
}

/// Calls `visit(first_token, words, scales, tokens, record)` for consecutive runs of records
/// covering `range`: body records and the query's window copies (from `window_start` on:
/// [`Stream::window_start`]) in contiguous runs, sinks one at a time. A kept heavy hitter
/// ([`Stream::next_kept`]) is read from its copy, one token at a time: in rows a body run ends
/// there; in the fast-scan order the run goes on through it and the copy follows the run as
/// [`Record::Kept`] (a block cut at a kept token would be summed twice, each part through the
/// loops for partial blocks; at 8K tokens `rec4.25` keeps about 3% of a SmolLM2 stream's
/// tokens, enough to cut most blocks).
fn walk<'a>(
    stream: &'a Stream,
    range: std::ops::Range<usize>,
    window_start: usize,
    mut visit: impl FnMut(usize, &'a [u32], &'a [f16], usize, Record<'a>),
) {
    let body = stream.body();
    let sink_end = stream.sink_end();
    let copy_kind = match stream.recent_codec() {
        TokenCodec::Q8(_) => CopyKind::Q8,
        codec => CopyKind::Plain(plain_kind(codec)),
    };
    let fast_scan = body.order() == RecordOrder::FastScan;
    let mut t = range.start;
    while t < range.end {
        if t >= window_start && t >= sink_end {
            // A token with no copy is skipped, as a missing body record ends the walk below.
            match stream.recent_copies(t, range.end - t) {
                Some((TokenCodec::Q8(_), w, s, n)) => {
                    visit(t, w, s, n, Record::Q8);
                    t += n;
                }
                Some((codec, w, s, n)) => {
                    visit(t, w, s, n, Record::Plain(plain_kind(codec)));
                    t += n;
                }
                None => t += 1,
            }
        } else if t < sink_end {
            match stream.full_precision(t) {
                Some((TokenCodec::Q8(_), record, s)) => visit(t, record, s, 1, Record::Q8),
                Some((codec, record, s)) => {
                    visit(t, record, s, 1, Record::Plain(plain_kind(codec)))
                }
                None => {}
            }
            t += 1;
        } else {
            let mut limit = range.end.min(window_start) - t;
            let kept = stream.next_kept(t).filter(|&kept| kept < t + limit);
            if let (Some(kept), false) = (kept, fast_scan) {
                if kept == t {
                    if let Some((words, s)) = stream.kept_copy(t) {
                        visit(t, words, s, 1, copy_kind.record());
                    }
                    t += 1;
                    continue;
                }
                limit = kept - t;
            }
            let Some((records, s, n)) = body.records(stream.body_slot(t), limit) else {
                return;
            };
            match records {
                RunRecords::Rows(w) => visit(t, w, s, n, Record::Body),
                RunRecords::FastScan { codes, lead } => {
                    let kept = kept.is_some_and(|k| k < t + n);
                    visit(t, &[], s, n, Record::FastScan { codes, lead, kept });
                    let mut from = t;
                    while kept && let Some((tokens, w, s)) = stream.kept_copies_within(from..t + n)
                    {
                        let first = tokens[0] as usize;
                        let record = Record::Kept {
                            kind: copy_kind,
                            tokens,
                        };
                        visit(first, w, s, tokens.len(), record);
                        from = tokens[tokens.len() - 1] as usize + 1;
                    }
                }
            }
            t += n;
        }
    }
}

/// Grows `buffer` to `len` zeros if it is empty; returns it.
fn ensure(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.is_empty() {
        buffer.resize(len, 0.0);
    }
    buffer
}

/// Reusable per-block buffer for the f32 scales of a run: every scale of the run, `[n,
/// per_token]`, converted once; each part reads its own column(s) through a stride instead of
/// a copy of its own.
#[derive(Default)]
struct Scales {
    all: Vec<f32>,
    per_token: usize,
    /// One scale of every record, gathered (`contiguous`).
    column: Vec<f32>,
}

impl Scales {
    /// Converts the run's scales (`n` records' worth).
    fn load(&mut self, isa: Isa, halves: &[f16], n: usize) {
        self.per_token = halves.len() / n.max(1);
        reserve_for(&mut self.all, MAX_BLOCK_TOKENS.max(n) * self.per_token);
        self.all.resize(halves.len(), 0.0);
        simd::f16_to_f32(isa, halves, &mut self.all);
    }

    /// Scale `which` of each of the run's `n` records, contiguous, and stride 1: the slice of
    /// `all` where records have one scale, else a gathered copy (two tiers: the fast-scan
    /// kernels read a block's norms eight at a time from a contiguous slice; the same values).
    fn contiguous(&mut self, which: usize, n: usize) -> (&[f32], usize) {
        debug_assert!(which < self.per_token.max(1));
        if self.per_token == 1 {
            return (&self.all[..], 1);
        }
        self.column.clear();
        self.column
            .extend(self.all.iter().skip(which).step_by(self.per_token).take(n));
        (&self.column[..], 1)
    }

    /// The scales of `part`, from its first one: record `i`'s at `[i·per_token]`.
    fn of(&self, part: &Part<'_>) -> &[f32] {
        &self.all[part.scale_offset.min(self.all.len())..]
    }
}

/// `out[k·group + h] = weights[k·group + h]·scales[k·stride + which]`: the token-major
/// probabilities of a run times each token's norm (`which` = 0) or `γ` (1).
fn scale_rows(
    weights: &[f32],
    scales: &[f32],
    stride: usize,
    which: usize,
    group: usize,
    out: &mut Vec<f32>,
) {
    reserve_for(out, weights.len().max(MAX_BLOCK_TOKENS * group));
    out.clear();
    let scales = scales.get(which..).unwrap_or_default();
    match group {
        1 => scale_rows_of::<1>(weights, scales, stride, out),
        2 => scale_rows_of::<2>(weights, scales, stride, out),
        3 => scale_rows_of::<3>(weights, scales, stride, out),
        4 => scale_rows_of::<4>(weights, scales, stride, out),
        _ => {
            for (w, s) in weights
                .chunks_exact(group)
                .zip(scales.iter().step_by(stride.max(1)))
            {
                out.extend(w.iter().map(|w| w * s));
            }
        }
    }
}

/// [`scale_rows`] for a GQA group of `G` heads (the common 1 to 4): fixed-size rows let the
/// compiler unroll what the generic loop runs as nested iterators. The same products, so the
/// same bits.
fn scale_rows_of<const G: usize>(
    weights: &[f32],
    scales: &[f32],
    stride: usize,
    out: &mut Vec<f32>,
) {
    let (rows, _) = weights.as_chunks::<G>();
    out.extend(
        rows.iter()
            .zip(scales.iter().step_by(stride.max(1)))
            .flat_map(|(w, &s)| w.map(|w| w * s)),
    );
}

/// Scores, softmax statistics and value accumulators of the tokens `range` of one item into
/// `partial`, with this thread's [`BlockScratch`]; `windows` = where the item's full-precision
/// window starts in the key and the value stream.
fn run_block(
    isa: Isa,
    plan: &HeadPlan<'_>,
    prepared: &PreparedGroup,
    block: (std::ops::Range<usize>, [usize; 2], Option<usize>),
    d: usize,
    partial: &mut BlockPartial,
) {
    BLOCK_SCRATCH.with_borrow_mut(|scratch| {
        run_block_with(isa, plan, prepared, block, d, partial, scratch);
    });
}

/// Prefetches the body norms of `tokens` of `stream` (the first page's, a hint).
fn prefetch_scales(stream: &Stream, tokens: std::ops::Range<usize>) {
    let (start, end) = (
        tokens.start.max(stream.first_stored()),
        tokens.end.min(stream.len()),
    );
    if start >= end {
        return;
    }
    if let Some((_, scales, _)) = stream.body().records(stream.body_slot(start), end - start) {
        simd::prefetch(scales);
    }
}

fn run_block_with(
    isa: Isa,
    plan: &HeadPlan<'_>,
    prepared: &PreparedGroup,
    (range, [key_window, value_window], gather): (
        std::ops::Range<usize>,
        [usize; 2],
        Option<usize>,
    ),
    d: usize,
    partial: &mut BlockPartial,
    scratch: &mut BlockScratch,
) {
    let group = prepared.plain.len() / d;
    let len = range.len();
    let start = range.start;
    let BlockScratch {
        scores,
        probabilities,
        code_weights,
        sign_weights,
        scales,
        window_values,
        window_back,
        window_words,
        fast,
        masked,
        kept_values,
        center_biases,
    } = scratch;
    // Norms are converted in a short pass before their records are read, which would wait on
    // their first miss: this block's value norms are asked for now (they arrive while the keys
    // are scored), and the next block's key norms (its keys are scored right after this
    // block's values when one thread takes both).
    prefetch_scales(plan.values, range.clone());
    prefetch_scales(plan.keys, range.end..range.end + len);
    reserve_for(scores, group * len.max(MAX_BLOCK_TOKENS));
    let scores = zeroed(scores, group * len);
    walk(
        plan.keys,
        range.clone(),
        key_window,
        |t, words, halves, n, record| {
            let record_words = words.len() / n;
            if let Record::Kept { kind, tokens } = record {
                // The fast-scan run just visited scored these tokens' codes: their copies'
                // scores replace them.
                let out = zeroed(kept_values, group * n);
                let copies = (words, halves, n);
                score_copies(isa, kind, copies, (prepared, d), window_words, out, n);
                for (h, kept) in out.chunks_exact(n).enumerate() {
                    for (&k, &score) in tokens.iter().zip(kept) {
                        scores[h * len + k as usize - start] = score;
                    }
                }
                return;
            }
            let out = &mut scores[t - start..];
            if let Record::FastScan { codes, lead, .. } = record {
                scales.load(isa, halves, n);
                // One set of tables per scale (two tiers: the second set adds its tier).
                let sets = prepared.table_scales.len();
                let heads = prepared.tables.len() / sets.max(1);
                for (set, &scale) in prepared.table_scales.iter().enumerate() {
                    let tables = &prepared.tables[set * heads..(set + 1) * heads];
                    let norms = scales.contiguous(scale, n);
                    fast_scan::score_run(isa, tables, codes, lead, n, norms, out, len, set > 0);
                }
                return;
            }
            if let Some(kind) = record.copy() {
                let copies = (words, halves, n);
                score_copies(isa, kind, copies, (prepared, d), window_words, out, len);
                return;
            }
            scales.load(isa, halves, n);
            // The coded parts (of a plain, two-tier or basis record) are scored together, after
            // any plain part, in one call: vector paths take them in one pass over the tokens.
            let mut coded: [Option<(CodedRun<'_>, &KeyQueries)>; MAX_PARTS] = [None; MAX_PARTS];
            let mut count = 0;
            for (part, pp) in plan.key_parts.iter().zip(&prepared.parts) {
                match &part.body {
                    Body::Plain(kind) => {
                        let run = PlainRun {
                            words,
                            record_words,
                            offset: part.word_offset,
                            kind: *kind,
                            dim: part.dim,
                        };
                        simd::score_plain(isa, &run, &pp.gathered, out, len);
                    }
                    Body::Codes { .. } => {
                        if let Some(run) = part.coded_run(words, record_words, scales) {
                            coded[count] = Some((run, &pp.keys));
                            count += 1;
                        }
                    }
                }
            }
            if let Some((first, first_keys)) = coded[0] {
                let runs: [CodedRun<'_>; MAX_PARTS] =
                    std::array::from_fn(|k| coded[k].map_or(first, |(run, _)| run));
                let keys: [&KeyQueries; MAX_PARTS] =
                    std::array::from_fn(|k| coded[k].map_or(first_keys, |(_, keys)| keys));
                simd::score_coded_parts(isa, &runs[..count], &keys[..count], out, len);
            }
        },
    );
    // A RoPE-aware key center: each block of `CENTER_BLOCK` tokens gets its `q·c` back (one
    // sum per block and head, the same f32 whichever block of the kernel a token falls in).
    if let Some(angles) = &prepared.center_angles
        && len > 0
    {
        use crate::rope_center::CENTER_BLOCK;
        let blocks = start / CENTER_BLOCK..(range.end - 1) / CENTER_BLOCK + 1;
        let n = blocks.len();
        center_biases.clear();
        center_biases.resize(group * n, 0.0);
        simd::center_biases(
            isa,
            &prepared.center,
            d,
            &prepared.center_live,
            angles,
            blocks.clone(),
            center_biases,
        );
        // The tokens up to the first block boundary, then whole blocks as fixed-size chunks
        // (unrolled into vector adds: a loop over each block's slice cost more instructions
        // than the corrections' sums, callgrind), then the last block's tokens.
        let head = ((blocks.start + 1) * CENTER_BLOCK).min(range.end) - start;
        for (h, biases) in center_biases.chunks_exact(n).enumerate() {
            let (first, rest) = scores[h * len..(h + 1) * len].split_at_mut(head);
            first.iter_mut().for_each(|s| *s += biases[0]);
            let mut whole = rest.chunks_exact_mut(CENTER_BLOCK);
            for (tokens, &bias) in (&mut whole).zip(&biases[1..]) {
                tokens.iter_mut().for_each(|s| *s += bias);
            }
            let last = whole.into_remainder();
            last.iter_mut().for_each(|s| *s += biases[n - 1]);
        }
    }
    let BlockPartial {
        max,
        sum,
        full,
        parts,
        gathered,
        gathered_first,
    } = partial;
    max.clear();
    max.resize(group, f32::NEG_INFINITY);
    sum.clear();
    sum.resize(group, 0.0);
    for h in 0..group {
        let row = &mut scores[h * len..(h + 1) * len];
        max[h] = simd::max(isa, row);
        sum[h] = simd::exp_shifted_sum(isa, row, max[h]);
    }
    // The window tokens' `e^(s − max)`, normalized once the blocks are combined.
    gathered.clear();
    if let Some(first) = gather {
        let from = first.clamp(start, range.end);
        *gathered_first = from;
        for h in 0..group {
            gathered.extend_from_slice(&scores[h * len + (from - start)..(h + 1) * len]);
        }
    }
    // Emptied, not freed: `ensure` marks a used accumulator by its length.
    full.clear();
    if parts.len() < plan.value_parts.len() {
        parts.resize_with(plan.value_parts.len(), PartAccumulators::default);
    }
    for acc in parts.iter_mut() {
        acc.values.clear();
        acc.signs.clear();
    }
    // Token-major probabilities `[len, group]`, the weight layout of the value kernels of plain
    // runs and copies, and of coded rows where the instruction set has no head-major kernel
    // (`simd::accumulate_coded_parts`: AVX-512 and AVX2 read the head-major rows): written run
    // by run for the runs that read them (`token_major`), since a strided copy (and a zeroing)
    // of the whole block cost a fast-scan step about a tenth of its instructions.
    reserve_for(probabilities, group * len.max(MAX_BLOCK_TOKENS));
    // Not zeroed: each run writes its tokens before reading them.
    let probabilities = grown(probabilities, len * group);
    code_weights.clear();
    sign_weights.clear();
    window_values.clear();
    // Head-major `e^(s − max)`, what fast-scan value runs read (a head's weights contiguous).
    let exp_scores: &[f32] = scores;
    walk(
        plan.values,
        range,
        value_window,
        |t, words, halves, n, record| {
            let i = t - start;
            let record_words = words.len() / n;
            if let Record::Kept { kind, tokens } = record {
                // Token-major weights of the kept tokens, the run's slots they were masked in.
                let weights = grown(kept_values, n * group);
                for (h, row) in exp_scores.chunks_exact(len).enumerate() {
                    for (j, &k) in tokens.iter().enumerate() {
                        weights[j * group + h] = row[k as usize - start];
                    }
                }
                let copies = (words, halves, n);
                let accumulators = (&mut *window_values, &mut *full);
                accumulate_copies(
                    isa,
                    kind,
                    copies,
                    (d, group),
                    weights,
                    window_words,
                    accumulators,
                );
                return;
            }
            if let Record::FastScan { codes, lead, kept } = record {
                // Coded parts only (`head_plan` refuses any other fast-scan body), each
                // weighted by its own scale (two tiers: a norm each).
                scales.load(isa, halves, n);
                // The run's weights, those of its kept tokens zeroed (their copies follow).
                let weights = if kept {
                    masked.clear();
                    for h in 0..group {
                        masked.extend_from_slice(&exp_scores[h * len + i..h * len + i + n]);
                    }
                    for &k in plan.values.kept_within(t..t + n) {
                        for h in 0..group {
                            masked[h * n + k as usize - t] = 0.0;
                        }
                    }
                    (&masked[..], n, group)
                } else {
                    (&exp_scores[i..], len, group)
                };
                let record_words = plan.values.codec().record_words();
                for (part, acc) in plan.value_parts.iter().zip(parts.iter_mut()) {
                    let norms = scales.contiguous(part.scale_offset, n);
                    let Body::Codes {
                        centroids,
                        bits,
                        sketch,
                        code_words,
                        ..
                    } = &part.body
                    else {
                        continue;
                    };
                    let values = ensure(&mut acc.values, group * part.dim);
                    let tables = fast_scan::ValueTables::new(centroids, *bits);
                    fast_scan::accumulate_run(
                        isa,
                        codes,
                        lead,
                        n,
                        run_part(part, record_words),
                        &tables,
                        weights,
                        norms,
                        fast,
                        values,
                    );
                    // TQ_prod: `Σ_t p_t·γ_t·z_t` in the sketch's coordinates, the signs
                    // weighted by `γ` (the next scale), as the rows kernel sums them.
                    if let Some(sketch) = sketch {
                        let m = sketch.rows();
                        let signs = ensure(&mut acc.signs, group * m);
                        let gammas = scales.contiguous(part.scale_offset + 1, n);
                        let sign_part = fast_scan::RunPart {
                            block_lanes: 8 * record_words,
                            first_lane: 8 * (part.word_offset + code_words),
                            lanes: 8 * sketch.words(),
                            dim: m,
                            bits: 1,
                        };
                        fast_scan::accumulate_run(
                            isa,
                            codes,
                            lead,
                            n,
                            sign_part,
                            &fast_scan::ValueTables::new(&SIGN_CENTROIDS, 1),
                            weights,
                            gammas,
                            fast,
                            signs,
                        );
                    }
                }
                return;
            }
            let mut loaded = false;
            if matches!(record, Record::Body)
                && plan
                    .value_parts
                    .iter()
                    .all(|part| matches!(part.body, Body::Codes { .. }))
            {
                // Coded parts only: weighted straight from the head-major probabilities where
                // the instruction set has the kernel (no transposed copy, no `p·norm` rows).
                scales.load(isa, halves, n);
                loaded = true;
                let runs: [Option<CodedRun<'_>>; MAX_PARTS] = std::array::from_fn(|k| {
                    plan.value_parts
                        .get(k)
                        .and_then(|part| part.coded_run(words, record_words, scales))
                });
                let Some(first) = runs[0] else {
                    return;
                };
                let count = plan.value_parts.len();
                let runs: [CodedRun<'_>; MAX_PARTS] =
                    std::array::from_fn(|k| runs[k].unwrap_or(first));
                let mut accs: [&mut [f32]; MAX_PARTS] = Default::default();
                for ((slot, part), acc) in accs
                    .iter_mut()
                    .zip(plan.value_parts.iter())
                    .zip(parts.iter_mut())
                {
                    *slot = ensure(&mut acc.values, group * part.dim);
                }
                let weights = &exp_scores[i..];
                if simd::accumulate_coded_parts(
                    isa,
                    &runs[..count],
                    weights,
                    len,
                    &mut accs[..count],
                ) {
                    return;
                }
            }
            let weights = token_major(exp_scores, len, group, i..i + n, probabilities);
            if let Some(kind) = record.copy() {
                let copies = (words, halves, n);
                let accumulators = (&mut *window_values, &mut *full);
                accumulate_copies(
                    isa,
                    kind,
                    copies,
                    (d, group),
                    weights,
                    window_words,
                    accumulators,
                );
                return;
            }
            if !loaded {
                scales.load(isa, halves, n);
            }
            for (part, acc) in plan.value_parts.iter().zip(parts.iter_mut()) {
                match &part.body {
                    Body::Plain(kind) => {
                        let run = PlainRun {
                            words,
                            record_words,
                            offset: part.word_offset,
                            kind: *kind,
                            dim: part.dim,
                        };
                        let values = ensure(&mut acc.values, group * part.dim);
                        simd::accumulate_plain(isa, &run, weights, values);
                    }
                    Body::Codes { .. } => {
                        let Some(run) = part.coded_run(words, record_words, scales) else {
                            continue;
                        };
                        let m = run.sketch_dim;
                        let stride = run.scale_stride;
                        scale_rows(weights, run.scales, stride, 0, group, code_weights);
                        if m > 0 {
                            scale_rows(weights, run.scales, stride, 1, group, sign_weights);
                            ensure(&mut acc.signs, group * m);
                        }
                        let values = ensure(&mut acc.values, group * part.dim);
                        simd::accumulate_coded(
                            isa,
                            &run,
                            code_weights,
                            sign_weights,
                            values,
                            &mut acc.signs,
                        );
                    }
                }
            }
        },
    );
    // The block's 8-bit window copies, weighted in their rotated coordinates: one transform
    // back per head.
    if let (false, TokenCodec::Q8(codec)) = (window_values.is_empty(), plan.values.recent_codec()) {
        window_back.resize(d, 0.0);
        let full = ensure(full, group * d);
        for (row, out) in window_values.chunks_exact(d).zip(full.chunks_exact_mut(d)) {
            codec
                .rotate_back(row, window_back)
                .expect("window rows have the codec's dimension");
            for (o, b) in out.iter_mut().zip(window_back.iter()) {
                *o += b;
            }
        }
    }
}

/// Fused attention (see the module docs) on a given (available) instruction set, in the stored
/// domain: the value means of centered streams are added by [`attend`](super::attend), through
/// which the public [`fused_attention`](super::fused_attention) runs.
///
/// `in_step`: the queries are those of the batch just appended, each reading its own
/// full-precision window ([`Stream::window_start`]). `received`: where to hand back the share
/// of attention each query gave the tokens of its windows (sinks aside), for the
/// heavy-hitter counts ([`heavy_hitters`](crate::heavy_hitters)).
#[allow(clippy::too_many_arguments)]
pub(super) fn fused_attention_on(
    isa: Isa,
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    in_step: bool,
    out: &mut [f32],
    received: Option<&mut ReceivedWeights>,
) -> Result<(), CacheError> {
    let (n, group) = check_shapes(cache, queries, query_positions, shape, out)?;
    let idle =
        |pool: std::sync::LockResult<_>| pool.unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut workspace: Workspace = idle(WORKSPACES.lock()).pop().unwrap_or_default();
    let result = attend_with(
        isa,
        cache,
        (queries, query_positions),
        shape,
        in_step,
        (out, received),
        (n, group),
        &mut workspace,
    );
    idle(WORKSPACES.lock()).push(workspace);
    result
}

#[allow(clippy::too_many_arguments)]
fn attend_with(
    isa: Isa,
    cache: &KvCache,
    (queries, query_positions): (&[f32], &[u32]),
    shape: AttentionShape,
    in_step: bool,
    (out, mut received): (&mut [f32], Option<&mut ReceivedWeights>),
    (n, group): (usize, usize),
    workspace: &mut Workspace,
) -> Result<(), CacheError> {
    let d = cache.layout().head_dim;
    let kv_heads = cache.layout().kv_heads;
    for g in 0..kv_heads {
        head_plan(cache, g)?;
    }
    if let Some(received) = received.as_deref_mut() {
        received
            .reset((0..n * kv_heads).map(|k| GatheredRow::of(cache, query_positions, k, in_step)));
    }
    let Workspace {
        prepared,
        combine: combine_scratch,
        tasks,
        partials,
        first_task,
        task_count,
    } = workspace;
    // One item per (query token, KV head), item `k` = token `k / kv_heads`, head
    // `k % kv_heads`; its query rows, and its output rows, are the `k`-th `group·d` chunk.
    // Items run in waves of at most `MAX_WAVE_TASKS` blocks and `MAX_WAVE_ITEMS` items (at
    // least one item), so the prepared queries and block partials held at once are bounded
    // whatever the chunk and context (a 512-token prefill chunk at 8K context is 24 576 blocks: about 24 MB of
    // partials if held together). Each item's blocks and their combination are the same in
    // any wave, so the result does not depend on the wave split either.
    let items = n * kv_heads;
    let width = group * d;
    let mut wave_start = 0;
    while wave_start < items {
        tasks.clear();
        first_task.clear();
        task_count.clear();
        let mut wave_end = wave_start;
        while wave_end < items {
            let range = cache.visible(query_positions[wave_end / kv_heads]);
            let block = block_tokens(range.len());
            let blocks = range.len().div_ceil(block);
            let full =
                tasks.len() + blocks > MAX_WAVE_TASKS || wave_end - wave_start >= MAX_WAVE_ITEMS;
            if wave_end > wave_start && full {
                break;
            }
            first_task.push(tasks.len());
            let g = wave_end % kv_heads;
            let windows = [cache.keys(g), cache.values(g)]
                .map(|stream| stream.window_start(range.end, in_step));
            let gather = received.as_ref().map(|r| r.items[wave_end].first);
            let mut start = range.start;
            while start < range.end {
                let end = (start + block).min(range.end);
                tasks.push((wave_end - wave_start, start..end, windows, gather));
                start = end;
            }
            task_count.push(blocks);
            wave_end += 1;
        }
        let wave = wave_end - wave_start;
        if prepared.len() < wave {
            prepared.resize_with(wave, PreparedGroup::default);
            combine_scratch.resize_with(wave, CombineScratch::default);
        }
        if partials.len() < tasks.len() {
            partials.resize_with(tasks.len(), BlockPartial::default);
        }
        prepared[..wave]
            .par_iter_mut()
            .zip(queries[wave_start * width..wave_end * width].par_chunks(width))
            .enumerate()
            .try_for_each(|(i, (p, q))| {
                let plan = head_plan(cache, (wave_start + i) % kv_heads)?;
                prepare(isa, &plan.key_parts, q, d, shape.scale, p)?;
                prepare_tables(plan.keys, &plan.key_parts, p)?;
                prepare_center(plan.keys, d, p);
                prepare_window(plan.keys, d, p)
            })?;
        let wave_prepared = &prepared[..wave];
        partials[..tasks.len()]
            .par_iter_mut()
            .zip(tasks.par_iter())
            .try_for_each(|(partial, (i, range, windows, gather))| {
                let plan = head_plan(cache, (wave_start + i) % kv_heads)?;
                let block = (range.clone(), *windows, *gather);
                run_block(isa, &plan, &wave_prepared[*i], block, d, partial);
                Ok::<(), CacheError>(())
            })?;
        // Combine the blocks of each item in order; items are independent.
        let wave_partials = &partials[..tasks.len()];
        out[wave_start * width..wave_end * width]
            .par_chunks_mut(width)
            .zip(combine_scratch[..wave].par_iter_mut())
            .enumerate()
            .try_for_each(|(i, (row, scratch))| {
                let plan = head_plan(cache, (wave_start + i) % kv_heads)?;
                let blocks = &wave_partials[first_task[i]..first_task[i] + task_count[i]];
                combine(isa, &plan.value_parts, blocks, group, d, row, scratch)
            })?;
        if let Some(received) = received.as_deref_mut() {
            let stride = received.stride;
            let rows = &received.items[wave_start..wave_end];
            received.weights[wave_start * stride..wave_end * stride]
                .par_chunks_mut(stride.max(1))
                .zip(rows.par_iter())
                .enumerate()
                .for_each(|(i, (weights, row))| {
                    let blocks = &wave_partials[first_task[i]..first_task[i] + task_count[i]];
                    gather_weights(blocks, group, row.first, weights);
                });
        }
        wave_start = wave_end;
    }
    Ok(())
}

/// Writes one item's gathered weights: each block's `e^(s − max_b)` times `e^(max_b − max)`
/// over the softmax total, the mean over the group's heads (heads, then blocks, in order, so
/// the sum is the same whatever the thread count).
fn gather_weights(blocks: &[BlockPartial], group: usize, first: usize, out: &mut [f32]) {
    out.fill(0.0);
    for h in 0..group {
        let max = blocks
            .iter()
            .map(|b| b.max[h])
            .fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = blocks
            .iter()
            .map(|b| (b.max[h] - max).exp() * b.sum[h])
            .sum();
        if total <= 0.0 || !total.is_finite() {
            continue;
        }
        for b in blocks {
            if b.gathered.is_empty() {
                continue;
            }
            let n = b.gathered.len() / group;
            let scale = (b.max[h] - max).exp() / total / group as f32;
            let at = b.gathered_first - first;
            for (o, &e) in out[at..at + n]
                .iter_mut()
                .zip(&b.gathered[h * n..(h + 1) * n])
            {
                *o += e * scale;
            }
        }
    }
}

/// Merges block partials (fixed order) and maps each part's accumulators back to the original
/// domain: one `Sᵀ` (TQ_prod values) and one `Π_Vᵀ` per output row and coded part, then
/// scatters the part to its channels. Writes the item's `[group, d]` rows into `out`.
fn combine(
    isa: Isa,
    parts: &Parts<'_>,
    blocks: &[BlockPartial],
    group: usize,
    d: usize,
    out: &mut [f32],
    scratch: &mut CombineScratch,
) -> Result<(), CacheError> {
    out.fill(0.0);
    if blocks.is_empty() {
        return Ok(());
    }
    let CombineScratch {
        full,
        weights,
        values,
        signs,
        back,
        original,
        components,
    } = scratch;
    let full = zeroed(full, d);
    for h in 0..group {
        let max = blocks
            .iter()
            .map(|b| b.max[h])
            .fold(f32::NEG_INFINITY, f32::max);
        weights.clear();
        weights.extend(blocks.iter().map(|b| (b.max[h] - max).exp()));
        let mut total = 0.0f32;
        full.fill(0.0);
        for (b, &w) in blocks.iter().zip(weights.iter()) {
            total += w * b.sum[h];
            if !b.full.is_empty() {
                simd::axpy(isa, w, &b.full[h * d..(h + 1) * d], full);
            }
        }
        let row = &mut out[h * d..(h + 1) * d];
        let components = zeroed(components, parts.basis.map_or(0, |b| b.rank()));
        for (p, part) in parts.iter().enumerate() {
            let (dp, m) = (part.dim, part.sketch_dim());
            let values = zeroed(values, dp);
            let signs = zeroed(signs, m);
            for (b, &w) in blocks.iter().zip(weights.iter()) {
                let acc = &b.parts[p];
                if !acc.values.is_empty() {
                    simd::axpy(isa, w, &acc.values[h * dp..(h + 1) * dp], values);
                }
                if !acc.signs.is_empty() {
                    simd::axpy(isa, w, &acc.signs[h * m..(h + 1) * m], signs);
                }
            }
            let mapped: &[f32] = match &part.body {
                Body::Plain(_) => values,
                Body::Codes {
                    rotation, sketch, ..
                } => {
                    if let Some(sketch) = sketch {
                        let back = zeroed(back, dp);
                        sketch
                            .project_transpose(signs, back)
                            .map_err(crate::codec::CodecError::from)?;
                        simd::axpy(isa, sketch.gain() as f32, back, values);
                    }
                    let original = zeroed(original, dp);
                    rotation
                        .apply_inverse(values, original)
                        .map_err(crate::codec::CodecError::from)?;
                    original
                }
            };
            // A basis group scatters (times its gain) to its components, mapped back below.
            let target: &mut [f32] = if parts.basis.is_some() {
                components
            } else {
                row
            };
            match part.channels {
                Some(channels) if part.gain != 1.0 => {
                    for (&v, &c) in mapped.iter().zip(channels) {
                        target[usize::from(c)] += part.gain * v;
                    }
                }
                Some(channels) => {
                    for (&v, &c) in mapped.iter().zip(channels) {
                        target[usize::from(c)] += v;
                    }
                }
                None => {
                    for (o, v) in target.iter_mut().zip(mapped) {
                        *o += v;
                    }
                }
            }
        }
        if let Some(basis) = parts.basis {
            basis.add_back(components, row);
        }
        let inv = 1.0 / total;
        for (o, p) in row.iter_mut().zip(full.iter()) {
            *o = (*o + p) * inv;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Q8Window;

    /// The vectorizable conversion gives `s·c_j` for every code of every record, whole words
    /// and a last partial word alike, records padded past their codes or not.
    #[test]
    fn q8_copies_convert_code_by_code() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for d in [1usize, 2, 3, 4, 5, 7, 63, 64, 70, 128] {
            let words_per = d.div_ceil(4) + d % 2;
            let records = 5;
            let codes: Vec<u32> = (0..records * words_per).map(|_| next() as u32).collect();
            let steps: Vec<f16> = (0..records)
                .map(|r| f16::from_f32(0.001 + r as f32 * 0.37))
                .collect();
            for isa in Isa::available() {
                // A reused buffer holds stale values: each must be overwritten.
                let mut words = vec![0xDEAD_BEEF; 3 * records * d + 5];
                let run = q8_as_f32(isa, &codes, &steps, d, &mut words);
                assert_eq!(run.words.len(), records * d);
                for r in 0..records {
                    let record = &codes[r * words_per..(r + 1) * words_per];
                    for j in 0..d {
                        let want = f32::from(Q8Window::code(record, j)) * steps[r].to_f32();
                        assert_eq!(
                            run.words[r * d + j],
                            want.to_bits(),
                            "{isa:?}: d {d}, record {r}, code {j}"
                        );
                    }
                }
            }
        }
    }
}
