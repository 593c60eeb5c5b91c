//! The codec parameters of a layer as the kernels read them: one [`StreamDesc`] per stream
//! (keys, values) and one f32 table buffer holding, per KV head, Π and S (column-major), the
//! Hadamard factors where the encode kernel runs the fast transform, and the shared codebook.
//!
//! Everything is read from the CPU codecs (`TokenCodec`), so the GPU uses exactly the
//! matrices, codebooks, gains and corrections the CPU cache encodes and scores with.

use tq_cache::TokenCodec;
use tq_cache::record_order::{BitPlanes, RecordOrder};
use tq_cache::two_tier::TwoTierCodec;
use tq_qjl::{QjlSketch, SketchKind};
use tq_rotation::{Rotation, RotationKind};

use crate::error::GpuError;
use crate::kernels::{
    KIND_F16, KIND_F32, KIND_MSE, KIND_PROD, MAX_DIM, MODE_DENSE, MODE_DENSE_LANES, MODE_FWHT,
    ORDER_FAST_SCAN, ORDER_PLANES, ORDER_ROWS, StreamDesc,
};

/// Which stream of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// The keys.
    Keys,
    /// The values.
    Values,
}

/// The parts of one head's codec the kernels need.
struct HeadCodec<'a> {
    kind: u32,
    dim: usize,
    bits: u8,
    record_words: usize,
    scales: usize,
    norm_correction: bool,
    rotation: Option<&'a Rotation>,
    sketch: Option<&'a QjlSketch>,
    centroids: &'a [f32],
    thresholds: &'a [f32],
    correction: f32,
}

fn head_codec(codec: &TokenCodec) -> Result<HeadCodec<'_>, GpuError> {
    let plain = |kind| HeadCodec {
        kind,
        dim: codec.dim(),
        bits: 0,
        record_words: codec.record_words(),
        scales: codec.scales_per_token(),
        norm_correction: false,
        rotation: None,
        sketch: None,
        centroids: &[],
        thresholds: &[],
        correction: 1.0,
    };
    fn coded<'a>(
        codec: &TokenCodec,
        kind: u32,
        mse: &'a tq_cache::codec::TqMse,
        sketch: Option<&'a QjlSketch>,
        correction: f32,
    ) -> HeadCodec<'a> {
        HeadCodec {
            kind,
            dim: codec.dim(),
            bits: mse.spec().bits,
            record_words: codec.record_words(),
            scales: codec.scales_per_token(),
            norm_correction: mse.spec().norm_correction,
            rotation: Some(mse.rotation()),
            sketch,
            centroids: mse.codebook().centroids_f32(),
            thresholds: mse.codebook().thresholds_f32(),
            correction,
        }
    }
    Ok(match codec {
        TokenCodec::F32 { .. } => plain(KIND_F32),
        TokenCodec::F16 { .. } => plain(KIND_F16),
        TokenCodec::Mse(c) => coded(codec, KIND_MSE, c, None, 1.0),
        TokenCodec::DebiasedMse(c) => coded(codec, KIND_MSE, c.codec(), None, c.correction()),
        TokenCodec::Prod(c) => coded(codec, KIND_PROD, c.mse(), Some(c.sketch()), 1.0),
        TokenCodec::TwoTier(_) => {
            return Err(GpuError::Unsupported(
                "KV heads of one stream with different codecs (two-tier and one-tier)".into(),
            ));
        }
        TokenCodec::Basis(_) => {
            return Err(GpuError::Unsupported(
                "KV heads of one stream with different codecs (a basis and another)".into(),
            ));
        }
        TokenCodec::Q8(_) => {
            return Err(GpuError::Unsupported(
                "q8 stores window copies, not a stream's body".into(),
            ));
        }
    })
}

/// Π (d×d, row-major f64) as f32 column-major: entry (i, j) at `j·d + i`.
pub(crate) fn column_major(dense: &[f64], d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; d * d];
    for i in 0..d {
        for j in 0..d {
            out[j * d + i] = dense[i * d + j] as f32;
        }
    }
    out
}

/// The entry signs and exit factors of a power-of-two randomized Hadamard matrix
/// `Π = diag(s₂/√d)·H·diag(s₁)`, recovered from its dense form and checked entry by entry.
///
/// `(s₁, s₂)` and `(−s₁, −s₂)` give the same Π and, because negation is exact in IEEE
/// arithmetic, the same f32 results up to the sign of an exact zero, so fixing `s₁[0] = +1`
/// loses nothing the encoder can see (codes and QJL signs treat −0 as +0). A public accessor
/// for the signs in `tq-rotation` would remove this recovery.
/// The exit factors are computed as `tq-rotation` computes them: `(s₂ᵢ·(1/√d)) as f32`.
pub(crate) fn hadamard_factors(dense: &[f64], d: usize) -> Option<(Vec<f32>, Vec<f32>)> {
    if !d.is_power_of_two() || dense.len() != d * d {
        return None;
    }
    let scale = 1.0 / (d as f64).sqrt();
    let sign = |v: f64| if v < 0.0 { -1.0f64 } else { 1.0 };
    let exit_signs: Vec<f64> = (0..d).map(|i| sign(dense[i * d])).collect();
    let entry_signs: Vec<f64> = (0..d).map(|j| sign(dense[j]) * exit_signs[0]).collect();
    for i in 0..d {
        for j in 0..d {
            let h = if (i & j).count_ones() % 2 == 0 {
                1.0
            } else {
                -1.0
            };
            let expected = exit_signs[i] * scale * h * entry_signs[j];
            if (dense[i * d + j] - expected).abs() > 1e-12 {
                return None;
            }
        }
    }
    let entry = entry_signs.iter().map(|&s| s as f32).collect();
    let exit = exit_signs.iter().map(|&s| (s * scale) as f32).collect();
    Some((entry, exit))
}

/// One stream's descriptor plus the host facts the dispatch code needs.
#[derive(Clone, Debug)]
pub(crate) struct StreamLayoutGpu {
    pub desc: StreamDesc,
    pub dim: usize,
    pub record_words: usize,
    pub scales: usize,
    /// Sketch dimension of TQ_prod (0 otherwise): accumulators beyond the value dimension.
    pub sketch_dim: usize,
    /// Per KV head, the bit planes of a fast-scan stream's records (`None`: its records are
    /// their own nibbles); empty for a stream in rows.
    pub planes: Vec<Option<BitPlanes>>,
}

impl StreamLayoutGpu {
    /// Whether the pages hold this stream's records in the fast-scan order.
    pub fn fast_scan(&self) -> bool {
        self.desc.order != ORDER_ROWS
    }
}

/// Appends one stream's tables (all heads) to `data`, its records in the order the CPU body
/// takes when asked for `asked` ([`tq_cache::stream::body_order`]: the fast-scan order for a
/// TQ_mse codec of whole words, a fitted basis, two tiers of TQ_mse or TQ_prod, rows
/// otherwise; rows for every head where the heads' bodies differ); returns its layout.
pub(crate) fn build_stream(
    codecs: &[&TokenCodec],
    asked: RecordOrder,
    data: &mut Vec<f32>,
) -> Result<StreamLayoutGpu, GpuError> {
    let mut layout = build_codec_stream(codecs, data)?;
    if asked != RecordOrder::FastScan {
        return Ok(layout);
    }
    let planes: Vec<Option<Option<BitPlanes>>> = codecs
        .iter()
        .map(|c| tq_cache::stream::body_planes(c))
        .collect();
    if planes.iter().all(Option::is_none) {
        return Ok(layout);
    }
    if planes.iter().any(Option::is_none) {
        // A head whose fitted groups do not fit the fast-scan order keeps rows on the CPU while
        // the others take blocks. The kernels read one order per stream, so the whole stream
        // stays in rows here: uploads write such a head's blocks record by record.
        return Ok(layout);
    }
    let planes: Vec<Option<BitPlanes>> = planes.into_iter().flatten().collect();
    layout.desc.order = ORDER_FAST_SCAN;
    if planes.iter().any(Option::is_some) {
        // Per head, the source bit of each bit of a permuted record (the scatter kernel's
        // permutation; NO_SOURCE for a padding bit), identity for a head without planes.
        layout.desc.order = ORDER_PLANES;
        layout.desc.planes_offset = data.len() as u32;
        let bits = 32 * layout.record_words;
        for head in &planes {
            data.extend((0..bits).map(|k| match head {
                Some(p) => p.source_bit(k).map_or(NO_SOURCE, |s| s as f32),
                None => k as f32,
            }));
        }
    }
    layout.planes = planes;
    Ok(layout)
}

/// `StreamDesc.planes_offset` entry of a padding bit (exact in f32).
const NO_SOURCE: f32 = 65535.0;

/// Appends one stream's tables (all heads) to `data`; returns its layout (in rows).
fn build_codec_stream(
    codecs: &[&TokenCodec],
    data: &mut Vec<f32>,
) -> Result<StreamLayoutGpu, GpuError> {
    if codecs
        .iter()
        .any(|c| matches!(c, TokenCodec::TwoTier(_) | TokenCodec::Basis(_)))
    {
        return build_grouped_stream(codecs, data);
    }
    let heads: Vec<HeadCodec<'_>> = codecs
        .iter()
        .map(|c| head_codec(c))
        .collect::<Result<_, _>>()?;
    let first = heads
        .first()
        .ok_or_else(|| GpuError::Unsupported("a layer without KV heads".into()))?;
    let d = first.dim;
    if d == 0 || d > MAX_DIM {
        return Err(GpuError::Unsupported(format!(
            "head dimension {d} (the kernels take 1..={MAX_DIM})"
        )));
    }
    let rotation_kind = |h: &HeadCodec<'_>| h.rotation.map(Rotation::kind);
    let sketch_kind = |h: &HeadCodec<'_>| h.sketch.map(|s| s.spec().kind);
    for h in &heads[1..] {
        if h.kind != first.kind
            || h.dim != d
            || h.bits != first.bits
            || h.norm_correction != first.norm_correction
            || rotation_kind(h) != rotation_kind(first)
            || sketch_kind(h) != sketch_kind(first)
            || h.centroids != first.centroids
        {
            return Err(GpuError::Unsupported(
                "KV heads of one stream with different codecs (the kernels take one codec per \
                 stream; rotation and sketch seeds may differ)"
                    .into(),
            ));
        }
    }
    let n_heads = heads.len();
    let mut desc = StreamDesc {
        kind: first.kind,
        dim: d as u32,
        bits: u32::from(first.bits),
        record_words: first.record_words as u32,
        scales: first.scales as u32,
        levels: first.centroids.len() as u32,
        norm_correction: u32::from(first.norm_correction),
        ..StreamDesc::default()
    };
    let mut sketch_dim = 0;
    if matches!(first.kind, KIND_MSE | KIND_PROD) {
        desc.code_words = tq_cache::codec::packing::words_for(d, first.bits) as u32;
        let offset = |data: &Vec<f32>| data.len() as u32;
        let dense_pi: Vec<Vec<f64>> = heads
            .iter()
            .map(|h| h.rotation.map_or_else(Vec::new, Rotation::to_dense_f64))
            .collect();
        desc.pi_offset = offset(data);
        for dense in &dense_pi {
            data.extend(column_major(dense, d));
        }
        let dense_s: Vec<Vec<f64>> = heads
            .iter()
            .map(|h| h.sketch.map_or_else(Vec::new, QjlSketch::to_dense_f64))
            .collect();
        if first.kind == KIND_PROD {
            if first.sketch.is_some_and(|s| s.rows() != d) {
                return Err(GpuError::Unsupported("a non-square QJL sketch".into()));
            }
            sketch_dim = d;
            desc.s_offset = offset(data);
            for dense in &dense_s {
                data.extend(column_major(dense, d));
            }
        }
        // The encode kernel runs the fast transform where the CPU does (power-of-two d).
        let factors = |dense: &[Vec<f64>]| -> Option<Vec<f32>> {
            let mut all = Vec::with_capacity(dense.len() * 2 * d);
            for m in dense {
                let (entry, exit) = hadamard_factors(m, d)?;
                all.extend(entry);
                all.extend(exit);
            }
            Some(all)
        };
        desc.pi_mode = MODE_DENSE;
        if rotation_kind(first) == Some(RotationKind::Hadamard)
            && let Some(all) = factors(&dense_pi)
        {
            desc.pi_mode = MODE_FWHT;
            desc.fwht_pi_offset = offset(data);
            data.extend(all);
        }
        desc.s_mode = match sketch_kind(first) {
            Some(SketchKind::Gaussian) => MODE_DENSE_LANES,
            _ => MODE_DENSE,
        };
        if sketch_kind(first) == Some(SketchKind::Hadamard)
            && let Some(all) = factors(&dense_s)
        {
            desc.s_mode = MODE_FWHT;
            desc.fwht_s_offset = offset(data);
            data.extend(all);
        }
        desc.centroid_offset = offset(data);
        data.extend_from_slice(first.centroids);
        desc.threshold_offset = offset(data);
        data.extend_from_slice(first.thresholds);
        desc.gain_offset = offset(data);
        data.extend(
            heads
                .iter()
                .map(|h| h.sketch.map_or(0.0, |s| s.gain() as f32)),
        );
        desc.correction_offset = offset(data);
        data.extend(heads.iter().map(|h| h.correction));
    }
    debug_assert!(n_heads > 0);
    Ok(StreamLayoutGpu {
        desc,
        dim: d,
        record_words: first.record_words,
        scales: first.scales,
        sketch_dim,
        planes: Vec::new(),
    })
}

/// One tier of a two-tier codec: TQ_mse only (a QJL or debiased tier has no descriptor
/// fields here).
fn mse_tier(codec: &TokenCodec) -> Result<&tq_cache::codec::TqMse, GpuError> {
    match codec {
        TokenCodec::Mse(mse) => Ok(mse),
        _ => Err(GpuError::Unsupported(
            "a two-tier codec whose tiers are not both TQ_mse".into(),
        )),
    }
}

/// Most code groups one head of a grouped stream may have (`MAX_GROUPS` in `common.wgsl`).
pub(crate) const MAX_GROUPS: usize = 8;
/// f32 per head in a grouped stream's group table: the count, then six per group.
pub(crate) const GROUP_STRIDE: usize = 1 + 6 * MAX_GROUPS;

/// One group of codes of a grouped record: rotated coordinates `start..start + len`, `bits`
/// each from word `word`, looked up in `codebook`, scaled by the token's scale `scale`.
struct CodeGroup<'a> {
    start: usize,
    len: usize,
    bits: u8,
    word: usize,
    codebook: &'a [f32],
    scale: usize,
}

/// A head whose record is several code groups (two tiers, a basis' equal-bit groups): `m`, the
/// d×d row-major map from a vector to its rotated coordinates (rows past the coded ones zero),
/// so that a score is `Σ_G norm_G·⟨(m·q)_G, c_G⟩` and a value is `mᵀ·(norm·c)`.
struct GroupedHead<'a> {
    m: Vec<f64>,
    groups: Vec<CodeGroup<'a>>,
}

/// Π of a two-tier head as one d×d row-major matrix: rows `0..k` are the outlier tier's
/// rotation on its channels, rows `k..d` the rest tier's on the others (zeros elsewhere), so
/// the kernels rotate and rotate back both tiers as one.
fn two_tier_head(codec: &TwoTierCodec) -> Result<GroupedHead<'_>, GpuError> {
    let d = codec.head_dim();
    let mut m = vec![0.0f64; d * d];
    let mut groups = Vec::new();
    let (mut first_row, mut word, mut scale) = (0, 0, 0);
    for (tier, channels) in [
        (codec.outlier(), codec.channels()),
        (codec.rest(), codec.rest_channels()),
    ] {
        let mse = mse_tier(tier)?;
        let pi = mse.rotation().to_dense_f64();
        let k = channels.len();
        for r in 0..k {
            for (i, &c) in channels.iter().enumerate() {
                m[(first_row + r) * d + usize::from(c)] = pi[r * k + i];
            }
        }
        groups.push(CodeGroup {
            start: first_row,
            len: k,
            bits: mse.spec().bits,
            word,
            codebook: mse.codebook().centroids_f32(),
            scale,
        });
        first_row += k;
        word += tier.record_words();
        scale += tier.scales_per_token();
    }
    Ok(GroupedHead { m, groups })
}

/// A basis head: `m = diag(a_G)·blockdiag(Π_G)·U` (rows past the rank zero), so `m·q` is the
/// query the CPU kernel scores each group's codes against (the scales folded in) and
/// `mᵀ·(norm·c)` the decoded vector (`BasisCodec::decode_into`).
fn basis_head(codec: &tq_cache::basis::BasisCodec) -> GroupedHead<'_> {
    let d = codec.dim();
    let rows = codec.rows();
    let mut m = vec![0.0f64; d * d];
    let mut groups = Vec::new();
    for group in codec.groups() {
        let len = group.len();
        let pi = group.rotation.to_dense_f64();
        let a = f64::from(group.scale);
        for r in 0..len {
            for i in 0..len {
                let p = pi[r * len + i] * a;
                if p == 0.0 {
                    continue;
                }
                let u = &rows[(group.start + i) * d..(group.start + i + 1) * d];
                for (out, &x) in m[(group.start + r) * d..(group.start + r + 1) * d]
                    .iter_mut()
                    .zip(u)
                {
                    *out += p * f64::from(x);
                }
            }
        }
        groups.push(CodeGroup {
            start: group.start,
            len,
            bits: group.bits,
            word: group.word_offset,
            codebook: group.codebook.centroids_f32(),
            scale: 0,
        });
    }
    GroupedHead { m, groups }
}

/// [`build_codec_stream`] for streams whose records are several code groups — two-tier codecs (TQ_mse
/// tiers) and data-aware bases: one matrix per head (see [`GroupedHead`]) in the Π slot, so
/// prepare and finish need nothing new, and a group table per head (count, then start, length,
/// bits, first word, first centroid, scale index per group; small integers held exactly as f32)
/// that the score and value reads walk. The distinct codebooks of every head are concatenated.
/// The encode kernel does not implement these streams: the cache encodes them on the host
/// (`HostEncoder`), so no thresholds or Hadamard factors are stored.
fn build_grouped_stream(
    codecs: &[&TokenCodec],
    data: &mut Vec<f32>,
) -> Result<StreamLayoutGpu, GpuError> {
    let heads: Vec<GroupedHead<'_>> = codecs
        .iter()
        .map(|c| match c {
            TokenCodec::TwoTier(t) => two_tier_head(t),
            TokenCodec::Basis(b) => Ok(basis_head(b)),
            // A head still on the plain codec (a basis not fitted yet, or fitted to the
            // identity) is one group.
            TokenCodec::Mse(mse) => Ok(GroupedHead {
                m: mse.rotation().to_dense_f64(),
                groups: vec![CodeGroup {
                    start: 0,
                    len: mse.spec().dim,
                    bits: mse.spec().bits,
                    word: 0,
                    codebook: mse.codebook().centroids_f32(),
                    scale: 0,
                }],
            }),
            _ => Err(GpuError::Unsupported(
                "KV heads of one stream with different codecs (grouped and plain)".into(),
            )),
        })
        .collect::<Result<_, _>>()?;
    let first = codecs[0];
    let d = first.dim();
    if d == 0 || d > MAX_DIM {
        return Err(GpuError::Unsupported(format!(
            "head dimension {d} (the kernels take 1..={MAX_DIM})"
        )));
    }
    if codecs.iter().any(|c| {
        c.dim() != d
            || c.record_words() != first.record_words()
            || c.scales_per_token() != first.scales_per_token()
    }) {
        return Err(GpuError::Unsupported(
            "KV heads of one stream with different record sizes".into(),
        ));
    }
    if let Some(h) = heads.iter().find(|h| h.groups.len() > MAX_GROUPS) {
        return Err(GpuError::Unsupported(format!(
            "{} code groups in one record (the kernels take {MAX_GROUPS})",
            h.groups.len()
        )));
    }
    // The distinct codebooks, concatenated.
    let mut books: Vec<&[f32]> = Vec::new();
    for g in heads.iter().flat_map(|h| &h.groups) {
        if !books.contains(&g.codebook) {
            books.push(g.codebook);
        }
    }
    // Past the first MAX_LEVELS (held in workgroup memory) the kernels read centroids from
    // the table itself.
    let levels: usize = books.iter().map(|b| b.len()).sum();
    let book_start = |book: &[f32]| -> usize {
        let i = books.iter().position(|b| *b == book).unwrap_or(0);
        books[..i].iter().map(|b| b.len()).sum()
    };
    let offset = |data: &Vec<f32>| data.len() as u32;
    let mut desc = StreamDesc {
        kind: KIND_MSE,
        dim: d as u32,
        bits: heads[0].groups[0].bits.into(),
        record_words: first.record_words() as u32,
        code_words: first.record_words() as u32,
        scales: first.scales_per_token() as u32,
        levels: levels as u32,
        pi_mode: MODE_DENSE,
        s_mode: MODE_DENSE,
        groups: 1,
        ..StreamDesc::default()
    };
    desc.pi_offset = offset(data);
    for head in &heads {
        data.extend(column_major(&head.m, d));
    }
    desc.centroid_offset = offset(data);
    for book in &books {
        data.extend_from_slice(book);
    }
    desc.group_offset = offset(data);
    for head in &heads {
        let mut table = [0.0f32; GROUP_STRIDE];
        table[0] = head.groups.len() as f32;
        for (g, group) in head.groups.iter().enumerate() {
            let fields = [
                group.start,
                group.len,
                usize::from(group.bits),
                group.word,
                book_start(group.codebook),
                group.scale,
            ];
            for (slot, v) in table[1 + 6 * g..7 + 6 * g].iter_mut().zip(fields) {
                *slot = v as f32;
            }
        }
        data.extend_from_slice(&table);
    }
    desc.threshold_offset = offset(data);
    desc.gain_offset = offset(data);
    data.extend(heads.iter().map(|_| 0.0f32));
    desc.correction_offset = offset(data);
    data.extend(heads.iter().map(|_| 1.0f32));
    Ok(StreamLayoutGpu {
        desc,
        dim: d,
        record_words: first.record_words(),
        scales: first.scales_per_token(),
        sketch_dim: 0,
        planes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recovered factors rebuild Π exactly, for every power-of-two size the kernels use.
    #[test]
    fn hadamard_factors_rebuild_the_matrix() {
        for d in [1usize, 2, 8, 64, 128] {
            for seed in [0u64, 7, 12345] {
                let rotation = Rotation::new(RotationKind::Hadamard, d, seed).unwrap();
                let dense = rotation.to_dense_f64();
                let (entry, exit) = hadamard_factors(&dense, d).expect("power of two");
                // Apply the factors in f32 like the kernel and compare with the CPU rotation.
                let x: Vec<f32> = (0..d).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
                let mut y: Vec<f32> = x.iter().zip(&entry).map(|(a, s)| a * s).collect();
                let mut h = 1;
                while h < d {
                    for p in 0..d / 2 {
                        let i = (p / h) * 2 * h + p % h;
                        let (a, b) = (y[i], y[i + h]);
                        y[i] = a + b;
                        y[i + h] = a - b;
                    }
                    h *= 2;
                }
                for (v, e) in y.iter_mut().zip(&exit) {
                    *v *= e;
                }
                let mut expected = vec![0.0f32; d];
                rotation.apply(&x, &mut expected).unwrap();
                // Bit-identical except the sign of an exact zero, which the recovered global
                // sign decides; codes and QJL signs cannot see it (−0 and +0 compare equal,
                // and both count as non-negative).
                for (a, b) in y.iter().zip(&expected) {
                    assert!(
                        a == b && (*a != 0.0 || *b == 0.0),
                        "d {d} seed {seed}: {a} vs {b}"
                    );
                    if *a != 0.0 {
                        assert_eq!(a.to_bits(), b.to_bits(), "d {d} seed {seed}");
                    }
                }
            }
        }
    }

    /// A plane basis of 64 coordinates with these groups (length, bits).
    fn plane_basis(groups: &[(usize, u8)]) -> TokenCodec {
        use tq_cache::basis::{BasisCodec, BasisGroup, FittedBasis};
        let rank: usize = groups.iter().map(|g| g.0).sum();
        let fit = FittedBasis {
            rows: Vec::new(),
            groups: groups
                .iter()
                .map(|&(len, bits)| BasisGroup { len, bits })
                .collect(),
            scales: vec![1.0f32.to_bits(); groups.len()],
            components: (0..rank as u16).collect(),
        };
        let spec = tq_cache::codec::MseSpec::new(64, 4, 3);
        TokenCodec::Basis(Box::new(BasisCodec::new(spec, fit).unwrap()))
    }

    /// KV heads whose fitted groups put their CPU bodies in different orders (a last group of 9
    /// coordinates at 7 bits needs 17 nibble lanes of planes in its 2 words' 16: that head
    /// keeps rows)
    /// make a stream the GPU keeps in rows, every head; heads that agree keep their order.
    #[test]
    fn heads_in_different_orders_keep_rows() {
        let blocks = plane_basis(&[(64, 4)]);
        let rows = plane_basis(&[(48, 4), (9, 7)]);
        assert!(tq_cache::stream::body_planes(&blocks).is_some());
        assert!(tq_cache::stream::body_planes(&rows).is_none());
        let mut data = Vec::new();
        let mixed = build_stream(&[&blocks, &rows], RecordOrder::FastScan, &mut data).unwrap();
        assert_eq!(mixed.desc.order, ORDER_ROWS);
        assert!(mixed.planes.is_empty());
        let same = build_stream(&[&blocks, &blocks], RecordOrder::FastScan, &mut data).unwrap();
        assert_eq!(same.desc.order, ORDER_FAST_SCAN);
    }

    /// A non-power-of-two Hadamard rotation (three overlapping passes) has no such factors.
    #[test]
    fn overlapping_hadamard_is_not_factored() {
        let rotation = Rotation::new(RotationKind::Hadamard, 96, 3).unwrap();
        assert!(hadamard_factors(&rotation.to_dense_f64(), 96).is_none());
    }
}
