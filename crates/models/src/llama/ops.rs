//! The small numeric pieces of a Llama block, written to follow llama.cpp's arithmetic (the
//! reference engine) where it matters for greedy decoding: RMSNorm sums squares in f64, RoPE
//! builds its angles by repeated multiplication in f32, SiLU is `x / (1 + e^−x)` in f32.

use rayon::prelude::*;

/// `out = x / √(mean(x²) + ε) ⊙ weight`, one row.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    // As ggml: the mean is rounded to f32 before ε is added.
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * scale) * w;
    }
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` of the first `rope_dims` dimensions of every
/// head by `pos·base^(−2i/rope_dims)` — the "normal" RoPE layout that GGUF's permuted Q/K
/// weights are stored for. `x` is `[heads, head_dim]` for one token.
pub fn rope(x: &mut [f32], head_dim: usize, rope_dims: usize, base: f32, position: u32) {
    let theta_scale = base.powf(-2.0 / rope_dims as f32);
    for head in x.chunks_exact_mut(head_dim) {
        let mut theta = position as f32;
        for pair in head[..rope_dims].chunks_exact_mut(2) {
            let (sin, cos) = theta.sin_cos();
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos - x1 * sin;
            pair[1] = x0 * sin + x1 * cos;
            theta *= theta_scale;
        }
    }
}

/// Values per parallel task of an element-wise activation over a prefill chunk: one decode
/// step's vector (a few thousand values) stays on the calling thread, a chunk's (hundreds of
/// thousands, ~5% of a prefill on one thread) is split.
pub const ELEMENTWISE_TASK: usize = 16 * 1024;

/// Applies `gated(gate, up)`, an element-wise gated activation, over blocks of
/// [`ELEMENTWISE_TASK`] values in parallel (one block on the calling thread). Element by
/// element, so the same bits whatever the split: the one split rule of both models' MLPs.
pub fn gated_in_blocks(gate: &mut [f32], up: &[f32], gated: impl Fn(&mut [f32], &[f32]) + Sync) {
    if gate.len() <= ELEMENTWISE_TASK {
        return gated(gate, up);
    }
    gate.par_chunks_mut(ELEMENTWISE_TASK)
        .zip(up.par_chunks(ELEMENTWISE_TASK))
        .for_each(|(gate, up)| gated(gate, up));
}

/// `gate ← silu(gate) ⊙ up`, the SwiGLU activation, through [`gated_in_blocks`].
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    gated_in_blocks(gate, up, swiglu_serial);
}

fn swiglu_serial(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Index of the largest value (the first one on ties); `None` for an empty or all-NaN slice.
pub fn argmax(values: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values across several parallel blocks, with a tail: the split must not change a bit.
    #[test]
    fn swiglu_in_blocks_is_swiglu_per_value() {
        let n = 3 * ELEMENTWISE_TASK + 17;
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 50.0)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 53 % 997) as f32 - 498.0) / 100.0)
            .collect();
        let (mut blocks, mut serial) = (gate.clone(), gate);
        swiglu(&mut blocks, &up);
        swiglu_serial(&mut serial, &up);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&blocks), bits(&serial));
    }

    #[test]
    fn rms_norm_normalizes_then_scales() {
        let mut out = [0.0; 4];
        rms_norm(
            &[1.0, -1.0, 1.0, -1.0],
            &[1.0, 2.0, 3.0, 4.0],
            0.0,
            &mut out,
        );
        assert_eq!(out, [1.0, -2.0, 3.0, -4.0]);
    }

    #[test]
    fn rope_rotates_pairs_by_position_and_frequency() {
        // Position 0 is the identity; the first pair turns by `pos` radians, the next by
        // pos·base^(−2/d).
        let mut x = [1.0, 0.0, 1.0, 0.0];
        rope(&mut x, 4, 4, 100.0, 0);
        assert_eq!(x, [1.0, 0.0, 1.0, 0.0]);
        rope(&mut x, 4, 4, 100.0, 1);
        let second = 100f32.powf(-0.5);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        assert!((x[2] - second.cos()).abs() < 1e-6 && (x[3] - second.sin()).abs() < 1e-6);
        // Norms of pairs are preserved; the part past rope_dims is untouched.
        let mut y = [0.6, 0.8, 5.0, 7.0];
        rope(&mut y, 4, 2, 10_000.0, 17);
        assert!((y[0].hypot(y[1]) - 1.0).abs() < 1e-6);
        assert_eq!(&y[2..], &[5.0, 7.0]);
    }

    #[test]
    fn swiglu_and_argmax() {
        let mut g = [0.0, 2.0];
        swiglu(&mut g, &[3.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
