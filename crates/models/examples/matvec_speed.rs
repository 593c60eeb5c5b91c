//! Speed of quantized matrix–vector products at the reference model's shapes.
//!
//! `cargo run --release -p tq-models --example matvec_speed`
//!
//! Prints, per matrix, instruction set and thread count: microseconds per product (best of
//! several timed batches), weight bytes streamed per second, and multiply-adds per second.
//! Random weights and activations (the speed does not depend on the values). An argument
//! filters the rows printed by substring (`ffn_down`, `avx2`, `n=32`, …).

use std::time::Instant;

use tq_models::quant::{Isa, MatvecScratch, QuantKind, QuantMatrix};

/// SplitMix64, so the example needs no extra dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

fn matrix(kind: QuantKind, rows: usize, cols: usize, rng: &mut Rng) -> QuantMatrix {
    let bb = kind.block_bytes();
    let blocks = rows * cols / kind.block_size();
    let mut bytes: Vec<u8> = (0..blocks * bb).map(|_| rng.next() as u8).collect();
    // Valid, small f16 scales (d, and m for Q4_1): 0x2000 ≈ 0.0078.
    for block in bytes.chunks_mut(bb) {
        block[0..2].copy_from_slice(&0x2000u16.to_le_bytes());
        if kind == QuantKind::Q4_1 {
            block[2..4].copy_from_slice(&0xA000u16.to_le_bytes());
        }
    }
    QuantMatrix::new(kind, rows, cols, bytes).expect("consistent shape")
}

/// Best time per call, in seconds, over 150 batches of about 1 ms: short batches, so that on a
/// shared machine some run without being descheduled.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed().as_secs_f64() < 0.001 {
        f();
        calls += 1;
    }
    let per_batch = calls.max(1);
    let mut best = f64::INFINITY;
    for _ in 0..150 {
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / per_batch as f64);
    }
    best
}

fn main() {
    let mut rng = Rng(42);
    let threads_all = rayon::current_num_threads();
    let filter = std::env::args().nth(1).unwrap_or_default();
    let shapes = [
        ("ffn_down 576×1536", QuantKind::Q4_1, 576, 1536),
        ("ffn_up   1536×576", QuantKind::Q4_1, 1536, 576),
        ("head 49152×576   ", QuantKind::Q8_0, 49152, 576),
    ];
    println!("matrix             kind  isa     thr  n     µs/call    GB/s  GMAC/s");
    for (name, kind, rows, cols) in shapes {
        let m = matrix(kind, rows, cols, &mut rng);
        let bytes = (m.rows() * m.row_bytes()) as f64;
        for n in [1usize, 32] {
            if n > 1 && rows > 4096 {
                continue;
            }
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let mut y = vec![0.0f32; n * rows];
            for isa in Isa::available() {
                for threads in [1, threads_all] {
                    let label = format!("{name} {} thr={threads} n={n}", isa.name());
                    if !label.contains(&filter) {
                        continue;
                    }
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("thread pool");
                    let mut scratch = MatvecScratch::with_isa(isa);
                    let t = pool.install(|| {
                        time(|| m.matmul(&x, n, &mut y, &mut scratch).expect("valid shapes"))
                    });
                    println!(
                        "{name}  {kind:<4}  {:<6}  {threads:>3}  {n:<3} {:>9.1}  {:>6.2}  {:>6.2}",
                        isa.name(),
                        t * 1e6,
                        bytes / t / 1e9,
                        (n * rows * cols) as f64 / t / 1e9,
                    );
                }
            }
        }
    }
}
