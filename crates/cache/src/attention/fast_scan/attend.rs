//! Decode attention on the fast-scan layout: scores from the byte tables, a softmax, and the
//! weighted sum of the values accumulated from the same layout in the rotated domain, with one
//! inverse rotation per output.
//!
//! Every step is the same arithmetic on every instruction set, so the output is the same bits
//! on all of them and whatever the thread count (tested): the scores are integer sums then the
//! same scalar float operations; the exponential is a branch-free polynomial of plain
//! multiplications and additions (no fused multiply-add, whose rounding differs); the value
//! sums keep 16 partial sums per coordinate, token `t` in lane `t mod 16` (tokens `i` then
//! `i + 16` of each block), multiply then add, in token order, and reduce the lanes in one
//! fixed tree. The AVX-512 and AVX2 paths compute those lanes in registers (sixteen lanes in one
//! register or two); every other path runs the scalar loop, which performs the identical
//! operations.

use crate::codec::TqMse;

use super::layout::LANE_BYTES;
use super::values_int::ValueTables;
use super::weights::LANES;
use super::{BLOCK, FastScanBlocks, FastScanError, ScoreTable, scores_heads, values_int, weights};
use crate::attention::simd::Isa;

/// Reusable buffers of [`attend`], so a decode step allocates nothing once they have grown.
#[derive(Clone, Debug, Default)]
pub struct AttendScratch {
    rotated: Vec<f32>,
    tables: Vec<ScoreTable>,
    scores: Vec<f32>,
    weights: Vec<f32>,
    lanes: Vec<f32>,
    reduced: Vec<f32>,
    weight_bytes: Vec<[u8; BLOCK]>,
    block_scales: Vec<f32>,
}

/// How [`attend_with`] sums the values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ValueSums {
    /// In f32: each token's weight times its centroid, added to one of 16 lanes (what
    /// [`attend`] does).
    #[default]
    Float,
    /// In integers: per head and block, 7-bit weights times 8-bit centroids summed exactly,
    /// then scaled (the module `values_int`: its error bound and why no sum saturates).
    Int8,
}

/// One stream (keys or values) in the fast-scan layout with the codec that encoded it (its
/// rotation and codebook).
#[derive(Clone, Copy, Debug)]
pub struct FastScanStream<'a> {
    /// The codes and norms.
    pub blocks: &'a FastScanBlocks,
    /// The TurboQuant_mse codec of the same dimension and width.
    pub codec: &'a TqMse,
}

/// One query token's attention for `H = queries.len() / d` query heads sharing one KV head:
/// `out_h = Σ_t softmax_t(scale · ⟨q_h, k_t⟩) · v_t`, keys and values TurboQuant_mse codes in
/// the fast-scan layout ([`attend_with`] in [`ValueSums::Float`]).
pub fn attend(
    isa: Isa,
    keys: FastScanStream<'_>,
    values: FastScanStream<'_>,
    queries: &[f32],
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttendScratch,
) -> Result<(), FastScanError> {
    attend_with(
        isa,
        keys,
        values,
        queries,
        scale,
        out,
        scratch,
        ValueSums::Float,
    )
}

/// [`attend`] with the values summed as `sums` says. Either way the output is the same bits
/// on every instruction set.
#[allow(clippy::too_many_arguments)]
pub fn attend_with(
    isa: Isa,
    keys: FastScanStream<'_>,
    values: FastScanStream<'_>,
    queries: &[f32],
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttendScratch,
    sums: ValueSums,
) -> Result<(), FastScanError> {
    let (key_codec, value_codec) = (keys.codec, values.codec);
    let (keys, values) = (keys.blocks, values.blocks);
    let d = keys.dim();
    for (blocks, codec, what) in [
        (keys, key_codec, "key codec"),
        (values, value_codec, "value codec"),
    ] {
        if codec.dim() != blocks.dim() || codec.spec().bits != blocks.bits() {
            return Err(FastScanError::CodecMismatch { what });
        }
    }
    if values.dim() != d {
        return Err(FastScanError::LengthMismatch {
            what: "value dimension",
            expected: d,
            actual: values.dim(),
        });
    }
    if keys.len() != values.len() || keys.is_empty() {
        return Err(FastScanError::LengthMismatch {
            what: "values (one per key, at least one)",
            expected: keys.len().max(1),
            actual: values.len(),
        });
    }
    if queries.is_empty() || !queries.len().is_multiple_of(d) || out.len() != queries.len() {
        return Err(FastScanError::LengthMismatch {
            what: "queries and outputs (whole heads)",
            expected: queries.len().max(d),
            actual: out.len(),
        });
    }
    if !scale.is_finite() {
        return Err(FastScanError::NotFinite { what: "scale" });
    }
    let heads = queries.len() / d;
    let n = keys.len();
    let padded = keys.blocks() * BLOCK;
    let s = scratch;
    s.rotated.resize(d, 0.0);
    s.tables.clear();
    let key_centroids = key_codec.codebook().centroids_f32();
    for q in queries.chunks_exact(d) {
        key_codec
            .rotate_query(q, &mut s.rotated)
            .map_err(|e| FastScanError::Codec(e.to_string()))?;
        for v in s.rotated.iter_mut() {
            *v *= scale;
        }
        s.tables
            .push(ScoreTable::new(&s.rotated, key_centroids, keys.bits())?);
    }
    s.scores.resize(heads * n, 0.0);
    scores_heads(isa, &s.tables, keys, &mut s.scores)?;
    let value_centroids = value_codec.codebook().centroids_f32();
    if sums == ValueSums::Int8 {
        let tables = ValueTables::new(value_centroids, values.bits());
        let rows = values.lanes() * tables.per;
        s.lanes.clear();
        s.lanes.resize(heads * rows, 0.0);
        s.weight_bytes.resize(values.blocks() * heads, [0; BLOCK]);
        s.block_scales.resize(values.blocks() * heads, 0.0);
        weights::softmax_weight_bytes(
            isa,
            &mut s.scores,
            values.norms(),
            &mut s.weight_bytes,
            &mut s.block_scales,
        );
        for block in 0..values.blocks() {
            let block_heads = block * heads..(block + 1) * heads;
            accumulate_int(
                isa,
                values.block_codes(block),
                rows,
                &tables,
                &s.weight_bytes[block_heads.clone()],
                &s.block_scales[block_heads],
                &mut s.lanes,
            );
        }
        return rotate_back(value_codec, &s.lanes, rows, 1, &mut s.reduced, out, |sum| {
            values_int::reduce(sum[0], tables.gamma)
        });
    }
    // Weights p_t · ‖v_t‖ / Σ p, zero on the padding of the last block.
    s.weights.clear();
    s.weights.resize(heads * padded, 0.0);
    weights::softmax_weights(isa, &mut s.scores, values.norms(), &mut s.weights, padded);
    s.lanes.clear();
    s.lanes.resize(heads * d * LANES, 0.0);
    let tables = FloatTables::new(value_centroids, values.bits());
    accumulate(
        isa,
        values,
        &tables,
        &s.weights,
        padded,
        heads,
        &mut s.lanes,
    );
    rotate_back(
        value_codec,
        &s.lanes,
        d,
        LANES,
        &mut s.reduced,
        out,
        weights::reduce_lanes,
    )
}

/// Each head's output from its value sums in the rotated domain: coordinate `j < d` of head
/// `h` is `reduce` of its `width` partial sums at `lanes[(h·row + j)·width ..]` (`row`
/// coordinates per head), then the value codec's inverse rotation, one per head.
fn rotate_back(
    codec: &TqMse,
    lanes: &[f32],
    row: usize,
    width: usize,
    reduced: &mut Vec<f32>,
    out: &mut [f32],
    reduce: impl Fn(&[f32]) -> f32,
) -> Result<(), FastScanError> {
    let d = codec.dim();
    reduced.resize(d, 0.0);
    for (h, out) in out.chunks_exact_mut(d).enumerate() {
        for (j, r) in reduced.iter_mut().enumerate() {
            let at = (h * row + j) * width;
            *r = reduce(&lanes[at..at + width]);
        }
        codec
            .rotation()
            .apply_inverse(reduced, out)
            .map_err(|e| FastScanError::Codec(e.to_string()))?;
    }
    Ok(())
}

/// One block's integer value sums into `lanes` (`values_int::accumulate_block`), in AVX-512
/// or AVX2 registers where the CPU has them, in NEON registers on aarch64, else the reference
/// loop: the same integers and float steps.
pub(super) fn accumulate_int(
    isa: Isa,
    codes: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        // SAFETY: AVX-512 F, BW and AVX2 were detected at run time (`is_available`), VNNI
        // where `vnni()` says so; `rows` is the block's lanes (a multiple of 4) times the
        // codes per lane, `codes` a whole block, one weight row and scale per head, `lanes`
        // `heads · rows` (asserted there).
        unsafe {
            super::values_avx512::accumulate_block_int_avx512(
                super::values_avx512::vnni(),
                codes,
                rows,
                tables,
                weights,
                scales,
                lanes,
            )
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected just above; `rows` is the block's lanes (a multiple of 4)
        // times the codes per lane, `codes` a whole block, one weight row and scale per head,
        // `lanes` `heads · rows`.
        unsafe {
            super::x86::accumulate_block_int_avx2(codes, rows, tables, weights, scales, lanes)
        };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        super::neon::accumulate_block_int(codes, rows, tables, weights, scales, lanes);
        return;
    }
    let _ = isa;
    values_int::accumulate_block(codes, rows, tables, weights, scales, lanes);
}

/// A value codebook as the f32 sums read it: per position `i` of a nibble lane (`m` codes per
/// nibble), the 16 centroids `c[(n >> b·i) mod 2^b]` that nibble `n` decodes to (with one code
/// per nibble the codebook itself, zero-padded). Coordinate `j` reads lane `j / m` through
/// table `j mod m`.
#[derive(Clone, Copy, Debug)]
pub(super) struct FloatTables {
    pub(super) tables: [[f32; 16]; 4],
    pub(super) per: usize,
}

impl FloatTables {
    fn new(centroids: &[f32], bits: u8) -> Self {
        let (tables, per) = super::layout::lane_tables(centroids, bits);
        Self { tables, per }
    }
}

/// `lanes[(h·d + j)·16 + i] += w_h(32b + i)·c[code(32b + i, j)]`, then the same for token
/// `32b + 16 + i`, over every block `b` in order.
fn accumulate(
    isa: Isa,
    values: &FastScanBlocks,
    centroids: &FloatTables,
    weights: &[f32],
    padded: usize,
    heads: usize,
    lanes: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        for block in 0..values.blocks() {
            // SAFETY: AVX-512 F/BW was detected just above; `weights` holds `heads · padded`
            // values and `lanes` `heads · d · 16`, the block's codes `lanes · 16` bytes (the
            // kernel reads the `⌈d / m⌉` lanes that hold coordinates).
            unsafe {
                super::x86::accumulate_block_avx512(
                    values.block_codes(block),
                    values.dim(),
                    centroids,
                    weights,
                    padded,
                    block * BLOCK,
                    heads,
                    lanes,
                )
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && isa.is_available() {
        for block in 0..values.blocks() {
            // SAFETY: AVX2 was detected just above; the lengths are those of the AVX-512 call.
            unsafe {
                super::x86::accumulate_block_avx2(
                    values.block_codes(block),
                    values.dim(),
                    centroids,
                    weights,
                    padded,
                    block * BLOCK,
                    heads,
                    lanes,
                )
            }
        }
        return;
    }
    let _ = isa;
    let d = values.dim();
    let per = centroids.per;
    for block in 0..values.blocks() {
        let codes = values.block_codes(block);
        for j in 0..d {
            let lane = &codes[(j / per) * LANE_BYTES..(j / per + 1) * LANE_BYTES];
            let centroids = &centroids.tables[j % per];
            for h in 0..heads {
                let w = &weights[h * padded + block * BLOCK..h * padded + (block + 1) * BLOCK];
                let acc = &mut lanes[(h * d + j) * LANES..(h * d + j + 1) * LANES];
                for (i, (a, &byte)) in acc.iter_mut().zip(lane).enumerate() {
                    *a += w[i] * centroids[usize::from(byte & 0x0F)];
                    *a += w[i + LANE_BYTES] * centroids[usize::from(byte >> 4)];
                }
            }
        }
    }
}
