//! The numeric pieces Gemma 3 adds to a Llama block: RoPE in the NEOX layout, the GELU-gated
//! MLP activation (exact, or through the reference engine's f16 table), and RMSNorm per head.

use std::sync::OnceLock;

use half::f16;

use crate::llama::ops::{gated_in_blocks, rms_norm};

/// Rotates the pairs `(x[i], x[i + head_dim/2])` of every head by `pos·base^(−2i/head_dim)` —
/// the NEOX layout (GGUF stores Gemma's Q/K weights unpermuted). Angles are built by repeated
/// multiplication in f32 and `sin`/`cos` are f32, as llama.cpp's rope cache does, so the
/// rotation rounds as the reference engine's. `x` is `[heads, head_dim]` for one token.
pub fn rope_neox(x: &mut [f32], head_dim: usize, base: f32, position: u32) {
    rope_neox_with(x, head_dim, base, position, false);
}

/// [`rope_neox`], or with `fused` the rotation as GCC contracts ggml's
/// `x0·cos − x1·sin` and `x0·sin + x1·cos` on an FMA machine: the first product of each is
/// fused into the addition, the second rounded.
pub fn rope_neox_with(x: &mut [f32], head_dim: usize, base: f32, position: u32, fused: bool) {
    let half = head_dim / 2;
    let theta_scale = base.powf(-2.0 / head_dim as f32);
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, hi) = head.split_at_mut(half);
        let mut theta = position as f32;
        for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
            let (sin, cos) = theta.sin_cos();
            let (x0, x1) = (*a, *b);
            if fused {
                *a = x0.mul_add(cos, -(x1 * sin));
                *b = x0.mul_add(sin, x1 * cos);
            } else {
                *a = x0 * cos - x1 * sin;
                *b = x0 * sin + x1 * cos;
            }
            theta *= theta_scale;
        }
    }
}

/// RMSNorm of every `head_dim`-wide head of `x` in place, each multiplied by the one shared
/// `weight` (Gemma 3's QK-norm).
pub fn rms_norm_heads(x: &mut [f32], weight: &[f32], eps: f32, tmp: &mut [f32]) {
    let d = weight.len();
    for head in x.chunks_exact_mut(d) {
        rms_norm(head, weight, eps, &mut tmp[..d]);
        head.copy_from_slice(&tmp[..d]);
    }
}

/// `GELU(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))` in f32, with ggml's constants.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// How the MLP evaluates GELU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gelu {
    /// [`gelu_tanh`] in f32.
    #[default]
    Exact,
    /// llama.cpp's CPU build: 0 at or below −10, `x` at or above 10, otherwise the input
    /// rounded to f16 indexes a 65 536-entry table of f16 results (`ggml_vec_geglu_f32` with
    /// `GGML_GELU_FP16`). Needed for greedy parity: the table's rounding moves logits.
    F16Table,
}

/// [`gelu_tanh`] as GCC compiles ggml's C with its default `-ffp-contract=fast` on an FMA
/// machine: `1 + a·x·x` becomes one fused multiply-add.
fn gelu_tanh_contracted(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (COEF_A * x).mul_add(x, 1.0)).tanh())
}

fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                f16::from_f32(gelu_tanh_contracted(f16::from_bits(bits).to_f32())).to_bits()
            })
            .collect()
    })
}

impl Gelu {
    /// `gate ← GELU(gate) ⊙ up`, through [`gated_in_blocks`] (parallel blocks, the same bits).
    pub fn gate(self, gate: &mut [f32], up: &[f32]) {
        gated_in_blocks(gate, up, |gate, up| self.gate_serial(gate, up));
    }

    fn gate_serial(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Gelu::Exact => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    *g = gelu_tanh(*g) * u;
                }
            }
            Gelu::F16Table => {
                let table = gelu_table();
                for (g, &u) in gate.iter_mut().zip(up) {
                    let x = *g;
                    *g = if x <= -10.0 {
                        0.0
                    } else if x >= 10.0 {
                        x * u
                    } else {
                        let t = table[f16::from_f32(x).to_bits() as usize];
                        f16::from_bits(t).to_f32() * u
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::ops::ELEMENTWISE_TASK;

    /// Both GELUs over several parallel blocks with a tail equal the one-thread pass bit for
    /// bit.
    #[test]
    fn gelu_gate_in_blocks_is_the_serial_gate() {
        let n = 3 * ELEMENTWISE_TASK + 17;
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 40.0)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 53 % 997) as f32 - 498.0) / 100.0)
            .collect();
        for gelu in [Gelu::Exact, Gelu::F16Table] {
            let (mut blocks, mut serial) = (gate.clone(), gate.clone());
            gelu.gate(&mut blocks, &up);
            gelu.gate_serial(&mut serial, &up);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&blocks), bits(&serial), "{gelu:?}");
        }
    }

    #[test]
    fn neox_rope_rotates_halves_and_keeps_norms() {
        // head_dim 4: pairs (0, 2) and (1, 3); the first turns by pos, the second by
        // pos·base^(−1/2).
        let mut x = [1.0, 1.0, 0.0, 0.0];
        rope_neox(&mut x, 4, 100.0, 0);
        assert_eq!(x, [1.0, 1.0, 0.0, 0.0]);
        rope_neox(&mut x, 4, 100.0, 3);
        let second = 3.0 * 100f32.powf(-0.5);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        assert!((x[1] - second.cos()).abs() < 1e-6 && (x[3] - second.sin()).abs() < 1e-6);
    }

    #[test]
    fn gelu_table_is_the_exact_gelu_rounded_through_f16() {
        let exact = gelu_tanh(1.0);
        assert!((exact - 0.841_192).abs() < 1e-5);
        let (mut a, mut b) = ([1.0f32, -11.0, 12.0, 0.3], [1.0f32, -11.0, 12.0, 0.3]);
        let up = [2.0, 2.0, 2.0, 2.0];
        Gelu::Exact.gate(&mut a, &up);
        Gelu::F16Table.gate(&mut b, &up);
        assert_eq!(b[1], 0.0);
        assert_eq!(b[2], 24.0);
        for (x, y) in a.iter().zip(&b) {
            // f16 input and output: relative error within a few 2⁻¹¹.
            assert!((x - y).abs() <= 4e-3 * x.abs().max(1e-3), "{x} vs {y}");
        }
        assert_ne!(a[3], b[3], "the table rounds");
    }
}
