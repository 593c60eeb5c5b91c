//! Shared helpers of the `quant_*` tests: a fixed-seed proptest config, a small deterministic
//! generator, and builders of random blocks, rows and activations.

#![allow(dead_code)]

use half::f16;
use proptest::test_runner::{Config, RngSeed};
use tq_models::quant::QuantKind;

/// Fixed seed, explicit case count, no failure files.
pub fn config(cases: u32, seed: u64) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The little-endian bytes of `v` as f16 (`v` must be representable, or it is rounded).
pub fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// SplitMix64: a tiny deterministic generator driven by a proptest-chosen seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Roughly standard normal (sum of four uniforms, rescaled).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A random f16 scale of either sign with magnitude in [2⁻¹⁰, 2⁻²] (model-like).
pub fn scale(rng: &mut Rng) -> [u8; 2] {
    let mag = 2f32.powf(rng.uniform(-10.0, -2.0));
    f16_bytes(if rng.byte() & 1 == 0 { mag } else { -mag })
}

/// One random block of `kind`: valid f16 scales, arbitrary quantized bytes.
pub fn random_block(kind: QuantKind, rng: &mut Rng) -> Vec<u8> {
    let mut b: Vec<u8> = (0..kind.block_bytes()).map(|_| rng.byte()).collect();
    match kind {
        QuantKind::F32 => b.copy_from_slice(&rng.normal().to_le_bytes()),
        QuantKind::F16 => b.copy_from_slice(&f16_bytes(rng.normal())),
        QuantKind::Q4_0 | QuantKind::Q5_0 | QuantKind::Q8_0 => b[0..2].copy_from_slice(&scale(rng)),
        QuantKind::Q4_1 | QuantKind::Q4K => {
            b[0..2].copy_from_slice(&scale(rng));
            b[2..4].copy_from_slice(&scale(rng));
        }
        QuantKind::Q6K => b[208..210].copy_from_slice(&scale(rng)),
    }
    b
}

/// `rows` random rows of `cols` values of `kind`.
pub fn random_matrix(kind: QuantKind, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let blocks = rows * cols / kind.block_size();
    (0..blocks).flat_map(|_| random_block(kind, rng)).collect()
}

/// `n` random activations: mostly normal, some blocks scaled up or down by large factors, some
/// zero blocks and some single outliers (so block scales vary widely).
pub fn random_activation(n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    for block in x.chunks_mut(32) {
        match rng.below(8) {
            0 => block.fill(0.0),
            1 => block.iter_mut().for_each(|v| *v *= 1e-3),
            2 => block.iter_mut().for_each(|v| *v *= 50.0),
            3 => {
                let i = rng.below(block.len());
                block[i] *= 40.0;
            }
            _ => {}
        }
    }
    x
}
