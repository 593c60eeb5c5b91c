//! Block kernels composed per token from vector primitives: the scalar reference (with the
//! plain-Rust primitives) and the NEON path (with NEON primitives).

use super::super::primitives;
use super::{CodedRun, PlainKind, PlainRun};

/// Head dimensions up to this decode into a stack buffer (a decode step must not allocate);
/// larger ones use a `Vec`.
const STACK_DIM: usize = 512;

/// A `d`-float work vector: in `stack` when it fits, else in `heap`.
fn work_vector<'a>(
    d: usize,
    stack: &'a mut [f32; STACK_DIM],
    heap: &'a mut Vec<f32>,
) -> &'a mut [f32] {
    if d <= STACK_DIM {
        &mut stack[..d]
    } else {
        heap.resize(d, 0.0);
        heap
    }
}

/// The per-token primitives a composed kernel needs.
pub(crate) trait Prims {
    fn dot(a: &[f32], b: &[f32]) -> f32;
    /// [`primitives::lane8_dot`], bit for bit.
    fn lane8_dot(a: &[f32], b: &[f32]) -> f32;
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]);
    fn dequantize(words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]);
    fn decode_f16_pairs(words: &[u32], out: &mut [f32]);
    fn signed_dot(w: &[f32], signs: &[u32]) -> f32;
    fn accumulate_signs(alpha: f32, signs: &[u32], acc: &mut [f32]);
}

/// The plain-Rust primitives.
pub(crate) struct Scalar;

impl Prims for Scalar {
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        primitives::dot(a, b)
    }
    fn lane8_dot(a: &[f32], b: &[f32]) -> f32 {
        primitives::lane8_dot(a, b)
    }
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        primitives::axpy(alpha, x, y)
    }
    fn dequantize(words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]) {
        primitives::dequantize_codes(words, bits, centroids, out)
    }
    fn decode_f16_pairs(words: &[u32], out: &mut [f32]) {
        primitives::decode_f16_pairs(words, out)
    }
    fn signed_dot(w: &[f32], signs: &[u32]) -> f32 {
        primitives::signed_dot(w, signs)
    }
    fn accumulate_signs(alpha: f32, signs: &[u32], acc: &mut [f32]) {
        primitives::accumulate_signs(alpha, signs, acc)
    }
}

fn decode_plain<P: Prims>(kind: PlainKind, record: &[u32], out: &mut [f32]) {
    match kind {
        PlainKind::F32 => primitives::decode_f32_words(record, out),
        PlainKind::F16 => P::decode_f16_pairs(record, out),
    }
}

pub(crate) fn score_coded<P: Prims>(
    run: &CodedRun<'_>,
    queries: &[f32],
    sketch_queries: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let d = run.dim;
    let m = run.sketch_dim;
    let scale_stride = run.scale_stride;
    let mut stack = [0.0f32; STACK_DIM];
    let mut heap = Vec::new();
    let vector = work_vector(d, &mut stack, &mut heap);
    for (i, record) in run.words.chunks_exact(run.record_words).enumerate() {
        P::dequantize(&record[run.code_offset..], run.bits, run.centroids, vector);
        let norm = run.scales[i * scale_stride];
        for (h, q) in queries.chunks_exact(d).enumerate() {
            let mut s = norm * P::dot(q, vector);
            if m > 0 {
                let w = &sketch_queries[h * m..(h + 1) * m];
                s +=
                    run.scales[i * scale_stride + 1] * P::signed_dot(w, &record[run.sign_offset..]);
            }
            out[h * stride + i] += s;
        }
    }
}

pub(crate) fn score_plain<P: Prims>(
    run: &PlainRun<'_>,
    queries: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let d = run.dim;
    let mut stack = [0.0f32; STACK_DIM];
    let mut heap = Vec::new();
    let vector = work_vector(d, &mut stack, &mut heap);
    for (i, record) in run.words.chunks_exact(run.record_words).enumerate() {
        decode_plain::<P>(run.kind, &record[run.offset..], vector);
        for (h, q) in queries.chunks_exact(d).enumerate() {
            out[h * stride + i] += P::lane8_dot(q, vector);
        }
    }
}

pub(crate) fn accumulate_coded<P: Prims>(
    run: &CodedRun<'_>,
    code_weights: &[f32],
    sign_weights: &[f32],
    acc: &mut [f32],
    sign_acc: &mut [f32],
) {
    let d = run.dim;
    let m = run.sketch_dim;
    let heads = acc.len() / d;
    let mut stack = [0.0f32; STACK_DIM];
    let mut heap = Vec::new();
    let vector = work_vector(d, &mut stack, &mut heap);
    for (i, record) in run.words.chunks_exact(run.record_words).enumerate() {
        P::dequantize(&record[run.code_offset..], run.bits, run.centroids, vector);
        for (h, a) in acc.chunks_exact_mut(d).enumerate() {
            P::axpy(code_weights[i * heads + h], vector, a);
        }
        if m > 0 {
            for (h, a) in sign_acc.chunks_exact_mut(m).enumerate() {
                P::accumulate_signs(sign_weights[i * heads + h], &record[run.sign_offset..], a);
            }
        }
    }
}

pub(crate) fn accumulate_plain<P: Prims>(run: &PlainRun<'_>, weights: &[f32], acc: &mut [f32]) {
    let d = run.dim;
    let heads = acc.len() / d;
    let mut stack = [0.0f32; STACK_DIM];
    let mut heap = Vec::new();
    let vector = work_vector(d, &mut stack, &mut heap);
    for (i, record) in run.words.chunks_exact(run.record_words).enumerate() {
        decode_plain::<P>(run.kind, &record[run.offset..], vector);
        for (h, a) in acc.chunks_exact_mut(d).enumerate() {
            P::axpy(weights[i * heads + h], vector, a);
        }
    }
}
