//! The GPU encode kernel against the CPU codec (`TokenCodec::encode_into`), record by record.
//!
//! What must be equal and why some bits may differ: the kernel repeats the CPU's operations in
//! the CPU's order (eight-lane norm, the same Hadamard butterflies or the same in-order dense
//! sums, ×1/‖x‖, f32 thresholds, RNE to f16), so wherever the device's f32 arithmetic is IEEE
//! the records are bit-identical. A driver may still contract `a·b + c` into an FMA or compute
//! `sqrt` / division to a looser ULP bound; then a rotated coordinate moves by ~1e-7
//! relative and its code changes only if it lies that close to a threshold — for Gaussian-like
//! coordinates about 1e-6 of them. A non-power-of-two Hadamard rotation runs as a dense f32
//! matrix on the GPU but as three f32 passes on the CPU (~1e-5 relative), still far below
//! 1e-4. So the tolerance is: at most one mismatched code per 10⁴ codes (and per 10⁴ sign
//! bits), norms bit-identical, and γ (summed in f64 on the CPU, in f32 here) within one f16
//! ulp. A wrong rotation, codebook, bit layout or sign convention breaks thousands of codes.

mod common;

use common::{CODECS, codec, context, growing, vectors};
use half::f16;
use tq_attention_wgpu::{GpuKvCache, StreamKind};
use tq_cache::codec::{CodecScratch, packing};
use tq_cache::kv_cache::KvCache;
use tq_cache::{CodecSpec, TokenCodec};

struct Mismatches {
    codes: usize,
    total_codes: usize,
    signs: usize,
    total_signs: usize,
    norms: usize,
    gammas: usize,
}

fn compare(spec: CodecSpec, tokens: usize, heads: usize, seed: u64) -> Mismatches {
    let ctx = context().expect("adapter");
    let d = spec.dim();
    let cpu = KvCache::uniform(growing(heads, d), spec, CodecSpec::F32 { dim: d }).unwrap();
    let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
    let mut x = vectors(tokens * heads, d, seed);
    // A zero vector and one whose norm underflows f16: both take the zero path.
    x[..d].fill(0.0);
    for v in &mut x[d..2 * d] {
        *v *= 1e-9;
    }
    let (records, scales) = gpu.encode_records(StreamKind::Keys, &x).unwrap();
    let codec = TokenCodec::new(&spec).unwrap();
    let (rw, spt) = (codec.record_words(), codec.scales_per_token());
    let mut scratch = CodecScratch::new(d);
    let mut record = vec![0u32; rw];
    let mut halves = vec![f16::ZERO; spt];
    let mut m = Mismatches {
        codes: 0,
        total_codes: 0,
        signs: 0,
        total_signs: 0,
        norms: 0,
        gammas: 0,
    };
    for (v, chunk) in x.chunks_exact(d).enumerate() {
        codec
            .encode_into(chunk, &mut scratch, &mut record, &mut halves)
            .unwrap();
        let got = &records[v * rw..(v + 1) * rw];
        let got_scales = &scales[v * spt..(v + 1) * spt];
        match &codec {
            TokenCodec::F32 { .. } | TokenCodec::F16 { .. } => {
                assert_eq!(got, &record[..], "{spec:?} vector {v}");
            }
            _ => {
                let (bits, code_words) = match &codec {
                    TokenCodec::Prod(c) => (c.mse().spec().bits, c.mse().words_per_vector()),
                    TokenCodec::Mse(c) => (c.spec().bits, c.words_per_vector()),
                    TokenCodec::DebiasedMse(c) => {
                        (c.codec().spec().bits, c.codec().words_per_vector())
                    }
                    _ => unreachable!(),
                };
                let mut a = vec![0u8; d];
                let mut b = vec![0u8; d];
                packing::unpack(&got[..code_words], bits, &mut a).unwrap();
                packing::unpack(&record[..code_words], bits, &mut b).unwrap();
                m.codes += a.iter().zip(&b).filter(|(x, y)| x != y).count();
                m.total_codes += d;
                // Unused high bits of the last code word are zero on both sides.
                let mut repacked = vec![0u32; code_words];
                packing::pack(&a, bits, &mut repacked).unwrap();
                assert_eq!(repacked, &got[..code_words], "{spec:?}: stray bits");
                if got_scales[0] != halves[0] {
                    m.norms += 1;
                }
                if spt == 2 {
                    for (g, c) in got[code_words..].iter().zip(&record[code_words..]) {
                        m.signs += (g ^ c).count_ones() as usize;
                    }
                    m.total_signs += d;
                    let (g, c) = (got_scales[1].to_bits(), halves[1].to_bits());
                    assert!(
                        g.abs_diff(c) <= 1,
                        "{spec:?} vector {v}: γ {g:#x} vs {c:#x}"
                    );
                    m.gammas += usize::from(g != c);
                }
            }
        }
    }
    m
}

fn check(spec: CodecSpec, tokens: usize, heads: usize, seed: u64) {
    let m = compare(spec, tokens, heads, seed);
    eprintln!(
        "{spec:?}: {} / {} codes, {} / {} signs, {} norms, {} γ differ",
        m.codes, m.total_codes, m.signs, m.total_signs, m.norms, m.gammas
    );
    assert!(
        m.codes * 10_000 <= m.total_codes.max(10_000),
        "{spec:?}: {} codes differ",
        m.codes
    );
    assert!(
        m.signs * 10_000 <= m.total_signs.max(10_000),
        "{spec:?}: {} signs differ",
        m.signs
    );
    assert_eq!(m.norms, 0, "{spec:?}: stored norms differ");
}

/// Every codec family, b = 2..5, at the dimensions the models use.
#[test]
fn gpu_encode_matches_cpu_records() {
    if context().is_none() {
        return;
    }
    for (i, dim) in [64usize, 128, 256].into_iter().enumerate() {
        for kind in 0..CODECS {
            for bits in [2u8, 3, 4, 5] {
                if kind < 2 && bits > 2 {
                    continue; // f32 / f16 have no bits
                }
                let seed = 1000 * i as u64 + 10 * kind as u64 + u64::from(bits);
                check(codec(kind, dim, bits, seed), 24, 2, seed);
            }
        }
    }
}

/// A non-power-of-two dimension: Hadamard runs as a dense matrix on the GPU.
#[test]
fn gpu_encode_matches_cpu_records_at_odd_dimensions() {
    if context().is_none() {
        return;
    }
    for kind in [2usize, 5, 8] {
        check(codec(kind, 96, 4, 7), 32, 2, 99);
    }
}
