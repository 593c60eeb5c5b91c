//! Vectorized inner loops of the fused attention kernel, with runtime dispatch.
//!
//! The fused kernel works on *runs*: consecutive records of one stream ([`CodedRun`],
//! [`PlainRun`]). Per run it scores every record against the query heads of a GQA group
//! ([`score_coded`], [`score_coded_parts`], [`score_plain`]) and accumulates the weighted records
//! ([`accumulate_coded`], [`accumulate_coded_parts`], [`accumulate_plain`]). Heads go in tiles of up to four, so a record's
//! codes are unpacked once per tile and stay in registers while every head of the tile uses
//! them. Four instruction sets, chosen once per call through [`Isa`]:
//!
//! - [`Isa::Avx512`] (x86-64 with AVX-512 F/BW/VL/VBMI besides AVX2/FMA/F16C, detected at run
//!   time): sixteen coordinates per instruction. Sixteen codes of b ≤ 4 bits unpack with one
//!   broadcast load, one `vpmultishiftqb` and one 16-entry `vpermps` — as cheap as converting
//!   sixteen f16 values with `vcvtph2ps`. The code is the same for every b ≤ 4 (only the shuffle
//!   control, the table and the chunk stride differ), so all parts of a record (the two tiers
//!   of a two-tier record) score in one pass: each part's table is scaled by the token's norm
//!   and every part accumulates into one register per head, one reduction per token. Values
//!   accumulate up to four chunks per pass over the tokens (sixteen independent multiply-add
//!   chains). The f16/f32 baselines get 16-wide kernels too, their scores two tokens per
//!   register so that they sum in the eight-lane order every path shares (below). Primitives
//!   are AVX2's.
//! - [`Isa::Avx2`] (x86-64 with AVX2, FMA and F16C, detected at run time): eight coordinates per
//!   instruction: one broadcast, one variable shift and one `vpermps` from an 8-entry table (two
//!   tables and a blend for 4 bits, a gather from the codebook for 5–8 bits).
//! - [`Isa::Neon`] (aarch64, where NEON is always present): vector primitives (dot, axpy, code
//!   unpacking through `tbl`, f16 conversion, signs, `exp`) composed per token.
//! - [`Isa::Scalar`]: the plain-Rust reference of [`primitives`], composed per token the same
//!   way. Every vector path is tested against it.
//!
//! On both x86 paths the QJL sign term of a key is read from per-tile byte tables built once
//! per (query, KV head) (see [`KeyQueries`]): one 16-byte load per sign byte gives four heads'
//! partial sums, faster than expanding the signs to `±1` vectors and multiply-adding (both
//! variants are kept and tested; with tables the TQ_prod key kernel measured 1.2× (AVX-512) to
//! 1.45× (AVX2) faster).
//!
//! Over coded records the vector and scalar paths sum in different orders, so they may differ
//! in the last bits (tests compare them within a tolerance derived from the f32 rounding bound).
//! Plain (f16/f32) records sum in one order on every path ([`primitives::lane8_dot`] for
//! scores, one fused multiply-add per token for values), so uncompressed caches attend with the
//! same bits on every machine: the models' 8-bit activation rounding turns a last-bit change of
//! a score into a 0.2% move of the f16 perplexity. Each path alone is deterministic: a result
//! depends only on its inputs, never on timing or thread count.
//!
//! The environment variable `TQ_SIMD` (`scalar`, `avx2`, `avx512`, `neon`) overrides the
//! detected instruction set for [`Isa::detect`] (an unavailable choice falls back to scalar).

#[cfg(target_arch = "x86_64")]
mod avx512;
mod composed;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

use half::f16;

use super::AttentionShape;
use super::primitives;
use crate::error::CacheError;
use crate::kv_cache::KvCache;

/// An instruction set the kernels run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, eight fixed lanes (the reference).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F + BW + VL + VBMI (with AVX2 + FMA + F16C).
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Isa {
    /// The instruction set the fused kernel uses: `TQ_SIMD` if set (and available), otherwise
    /// the best one this CPU supports. Detected once per process.
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let requested = std::env::var("TQ_SIMD")
                .ok()
                .and_then(|v| match v.as_str() {
                    "scalar" => Some(Isa::Scalar),
                    "avx2" => Some(Isa::Avx2),
                    "avx512" => Some(Isa::Avx512),
                    "neon" => Some(Isa::Neon),
                    _ => None,
                });
            match requested {
                Some(isa) if isa.is_available() => isa,
                Some(_) => Isa::Scalar,
                None => Isa::best(),
            }
        })
    }

    /// The best instruction set this CPU supports (ignores `TQ_SIMD`).
    pub fn best() -> Isa {
        if Isa::Avx512.is_available() {
            Isa::Avx512
        } else if Isa::Avx2.is_available() {
            Isa::Avx2
        } else if Isa::Neon.is_available() {
            Isa::Neon
        } else {
            Isa::Scalar
        }
    }

    /// Whether this CPU can run the instruction set.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2_available(),
            Isa::Avx512 => avx512_available(),
            Isa::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    /// Every instruction set this CPU can run, scalar first.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon]
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// Lower-case name (`scalar`, `avx2`, `avx512`, `neon`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// `self` if available, otherwise scalar: a request for an instruction set the CPU lacks
    /// must never reach its code.
    fn usable(self) -> Isa {
        if self.is_available() {
            self
        } else {
            Isa::Scalar
        }
    }
}

// Detected once: every kernel call asks (`usable`), and eight feature tests per call were 0.6%
// of a decode step.
#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        avx2_available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vbmi")
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_available() -> bool {
    false
}

/// Storage of a plain (uncompressed) record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainKind {
    /// `d` f32 bit patterns.
    F32,
    /// `ceil(d/2)` words of two f16 halves (even index in the low half).
    F16,
}

impl PlainKind {
    /// `u32` words per record of dimension `dim`.
    pub fn record_words(self, dim: usize) -> usize {
        match self {
            PlainKind::F32 => dim,
            PlainKind::F16 => dim.div_ceil(2),
        }
    }
}

/// A run of consecutive records holding uncompressed vectors (at word `offset` of each record).
#[derive(Clone, Copy, Debug)]
pub struct PlainRun<'a> {
    /// `n · record_words` words.
    pub words: &'a [u32],
    /// Words per record (the stride; at least `offset + kind.record_words(dim)`).
    pub record_words: usize,
    /// Word index of the vector within each record.
    pub offset: usize,
    /// f32 or f16.
    pub kind: PlainKind,
    /// Vector dimension `d`.
    pub dim: usize,
}

impl PlainRun<'_> {
    /// Records in the run.
    pub fn len(&self) -> usize {
        self.words.len() / self.record_words.max(1)
    }

    /// Whether the run holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check(&self) {
        assert!(self.dim > 0, "plain run: zero dimension");
        assert!(
            self.record_words >= self.offset + self.kind.record_words(self.dim),
            "plain run: records are too short"
        );
        assert_eq!(
            self.words.len() % self.record_words,
            0,
            "plain run: words are not whole records"
        );
    }
}

/// A run of consecutive records holding packed codes (TQ_mse, debiased MSE or TQ_prod, or one
/// tier of a two-tier record) with their scales already converted to f32.
#[derive(Clone, Copy, Debug)]
pub struct CodedRun<'a> {
    /// `n · record_words` words: each record holds `words_for(d, bits)` code words from word
    /// `code_offset` (code `j` at bits `[j·b, (j+1)·b)`, little-endian), and for TQ_prod
    /// `ceil(m/32)` sign words from word `sign_offset` (bit `i` set = `+1`).
    pub words: &'a [u32],
    /// Words per record (the stride).
    pub record_words: usize,
    /// Word index of the first code word within each record.
    pub code_offset: usize,
    /// Code width `b` (1..=8).
    pub bits: u8,
    /// Vector dimension `d`.
    pub dim: usize,
    /// The `2^b` centroids.
    pub centroids: &'a [f32],
    /// Word index of the sign words within a record (ignored when `sketch_dim` is 0).
    pub sign_offset: usize,
    /// Sketch dimension `m` (0: no QJL signs).
    pub sketch_dim: usize,
    /// Per token, the norm and (with signs) `γ`, as f32: record `i`'s scales start at
    /// `scales[i · scale_stride]`.
    pub scales: &'a [f32],
    /// Floats from one record's scales to the next: [`scales_per_token`](Self::scales_per_token)
    /// for compact scales, more when they are interleaved with other parts' (the tiers of a
    /// two-tier record share one scale array, so no per-tier copy is made).
    pub scale_stride: usize,
}

impl CodedRun<'_> {
    /// Records in the run.
    pub fn len(&self) -> usize {
        self.words.len() / self.record_words.max(1)
    }

    /// Whether the run holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Scales per token: 2 with signs (norm, `γ`), 1 without.
    pub fn scales_per_token(&self) -> usize {
        if self.sketch_dim > 0 { 2 } else { 1 }
    }

    fn check(&self) {
        assert!(
            (1..=8).contains(&self.bits),
            "coded run: bits must be 1..=8"
        );
        assert!(self.dim > 0, "coded run: zero dimension");
        assert_eq!(
            self.centroids.len(),
            1usize << self.bits,
            "coded run: need 2^bits centroids"
        );
        let code_end = self.code_offset + (self.dim * self.bits as usize).div_ceil(32);
        let needed = if self.sketch_dim > 0 {
            assert!(
                self.sign_offset >= code_end,
                "coded run: sign words overlap the codes"
            );
            self.sign_offset + self.sketch_dim.div_ceil(32)
        } else {
            code_end
        };
        assert!(
            self.record_words >= needed,
            "coded run: records are too short"
        );
        assert_eq!(
            self.words.len() % self.record_words,
            0,
            "coded run: words are not whole records"
        );
        assert!(
            self.scale_stride >= self.scales_per_token(),
            "coded run: scale stride below the scales per token"
        );
        let scales_needed = match self.len() {
            0 => 0,
            n => (n - 1) * self.scale_stride + self.scales_per_token(),
        };
        assert!(
            self.scales.len() >= scales_needed,
            "coded run: scales do not cover the records"
        );
    }
}

/// `Σ a_i·b_i` over the common length.
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C), so the CPU has AVX2, FMA and F16C.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::dot(a, b) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::dot(a, b),
        _ => primitives::dot(a, b),
    }
}

/// `y += alpha·x` over the common length, each element with one rounding (a fused
/// multiply-add on every path), so every instruction set gives the same bits.
pub fn axpy(isa: Isa, alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C), so the CPU has AVX2, FMA and F16C.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::axpy(alpha, x, y) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::axpy(alpha, x, y),
        _ => primitives::axpy(alpha, x, y),
    }
}

/// Unpacks `out.len()` b-bit codes from `words` and writes their centroids.
///
/// # Panics
/// If `bits` is not 1..=8, `centroids` does not hold `2^bits` values or `words` holds fewer
/// than `ceil(out.len()·bits/32)` words.
pub fn dequantize(isa: Isa, words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]) {
    assert!((1..=8).contains(&bits), "dequantize: bits must be 1..=8");
    assert_eq!(
        centroids.len(),
        1usize << bits,
        "dequantize: need 2^bits centroids"
    );
    assert!(
        words.len() >= (out.len() * bits as usize).div_ceil(32),
        "dequantize: too few words"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C); the lengths were checked above.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::dequantize(words, bits, centroids, out) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::dequantize(words, bits, centroids, out),
        _ => primitives::dequantize_codes(words, bits, centroids, out),
    }
}

/// Asks the CPU to bring the cache lines of `data` into its caches ahead of use: a hint, which
/// never faults and changes no result (a no-op off x86-64).
///
/// Why: a block's norms are read in one short pass before its records (converted to f32), so
/// that pass waited on their lines' first miss from memory, a few percent of a decode step at
/// 8K tokens; asked for before the work that precedes it, they arrive meanwhile.
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = data.as_ptr() as *const i8;
        let bytes = std::mem::size_of_val(data);
        for offset in (0..bytes).step_by(64) {
            // SAFETY: SSE is part of the x86-64 baseline; a prefetch never faults (the address,
            // inside `data` here, is not dereferenced).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Converts f16 values to f32 over the common length.
pub fn f16_to_f32(isa: Isa, halves: &[f16], out: &mut [f32]) {
    let n = halves.len().min(out.len());
    let (halves, out) = (&halves[..n], &mut out[..n]);
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C), so the CPU has F16C.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::f16_to_f32(halves, out) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::f16_to_f32(halves, out),
        _ => primitives::f16_to_f32(halves, out),
    }
}

/// Unpacks `out.len()` f16 values stored two per word (even index in the low half).
///
/// # Panics
/// If `words` holds fewer than `ceil(out.len()/2)` words.
pub fn decode_f16_pairs(isa: Isa, words: &[u32], out: &mut [f32]) {
    assert!(
        words.len() >= out.len().div_ceil(2),
        "decode_f16_pairs: too few words"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C); the length was checked above.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::decode_f16_pairs(words, out) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::decode_f16_pairs(words, out),
        _ => primitives::decode_f16_pairs(words, out),
    }
}

/// `⟨w, z⟩` for the packed ±1 vector `z` (bit `i` of `signs` set = `+1`), `w.len()` terms.
///
/// # Panics
/// If `signs` holds fewer than `ceil(w.len()/32)` words.
pub fn signed_dot(isa: Isa, w: &[f32], signs: &[u32]) -> f32 {
    assert!(
        signs.len() >= w.len().div_ceil(32),
        "signed_dot: too few sign words"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C); the length was checked above.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::signed_dot(w, signs) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::signed_dot(w, signs),
        _ => primitives::signed_dot(w, signs),
    }
}

/// `acc += alpha·z` for the packed ±1 vector `z`, `acc.len()` terms.
///
/// # Panics
/// If `signs` holds fewer than `ceil(acc.len()/32)` words.
pub fn accumulate_signs(isa: Isa, alpha: f32, signs: &[u32], acc: &mut [f32]) {
    assert!(
        signs.len() >= acc.len().div_ceil(32),
        "accumulate_signs: too few sign words"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both imply AVX2, FMA and F16C); the length was checked above.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::accumulate_signs(alpha, signs, acc) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::accumulate_signs(alpha, signs, acc),
        _ => primitives::accumulate_signs(alpha, signs, acc),
    }
}

/// The RoPE-aware key center's score corrections of a run of center blocks: `out[h·n + i]`
/// is [`score_bias`](crate::rope_center::score_bias) of row `h` of `coefficients` (`[group,
/// d]`, from [`bias_coefficients`](crate::rope_center::bias_coefficients)) at block
/// `blocks.start + i`, for every query head `h` and `i < n = blocks.len()`.
///
/// `live` lists the 8-entry chunks (`j` covers entries `8j..8j+8`) where some head's
/// coefficients are not zero ([`live_center_chunks`]); the vector path sums only those. That
/// skips only products `±0`, which leave a running sum that starts at `+0` unchanged, so every
/// path returns `score_bias`'s bits. The vector path takes the blocks four at a time (four
/// independent chains per head, each coefficient vector loaded once for the four), and reads
/// each block's angles once for the whole group where calling `score_bias` per head reads
/// them once per head.
///
/// # Panics
/// If `coefficients` is not a whole number of `d`-rows, the table does not cover `blocks`, a
/// live chunk lies past `d`, or `out` is shorter than `group · n`.
pub fn center_biases(
    isa: Isa,
    coefficients: &[f32],
    d: usize,
    live: &[u32],
    angles: &crate::rope_center::CenterAngles,
    blocks: std::ops::Range<usize>,
    out: &mut [f32],
) {
    assert!(
        d > 0 && coefficients.len().is_multiple_of(d),
        "center_biases: [group, d] coefficients"
    );
    let group = coefficients.len() / d;
    let n = blocks.len();
    assert!(out.len() >= group * n, "center_biases: output too short");
    assert!(
        live.iter().all(|&j| (j as usize + 1) * 8 <= d),
        "center_biases: live chunk past d"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if d.is_multiple_of(8) => {
            let span = angles.span(blocks);
            // SAFETY: `usable` returned an x86 vector ISA, so the CPU has AVX2; `span` holds
            // `n·d` angles, `coefficients` `group·d`, `out` at least `group·n` floats and every
            // live chunk ends within `d` (all checked above).
            unsafe { x86::center_biases(coefficients, d, live, span, n, out) }
        }
        _ => {
            for (h, c) in coefficients.chunks_exact(d).enumerate() {
                for (i, b) in blocks.clone().enumerate() {
                    out[h * n + i] = crate::rope_center::score_bias(c, angles, b);
                }
            }
        }
    }
}

/// The 8-entry chunks of `coefficients` (`[group, d]`) holding a nonzero entry in some row,
/// for [`center_biases`]: a center whose fit dropped planes leaves their coefficients exactly
/// zero in every row. Chunks past the last whole one (`d` not a multiple of 8) are not listed;
/// paths that use the list need `d % 8 == 0`.
pub fn live_center_chunks(coefficients: &[f32], d: usize, out: &mut Vec<u32>) {
    out.clear();
    if d == 0 {
        return;
    }
    for j in 0..d / 8 {
        let live = coefficients
            .chunks_exact(d)
            .any(|row| row[8 * j..8 * j + 8].iter().any(|&c| c != 0.0));
        if live {
            out.push(j as u32);
        }
    }
}

/// 8-bit window copies as f32 bit patterns: record `r` (`codes.len() / steps.len()` words,
/// its signed byte codes little-endian) becomes `out[r·d + j] = (s_r · c_j).to_bits()` for
/// `j < d`, `s_r = steps[r]`. The products are exact in f32 (8 bits times an f16's 11), so
/// every path gives the same bits.
///
/// # Panics
/// If a record holds fewer than `d` codes or `out` is not `steps.len() · d` long.
pub fn q8_to_f32_bits(isa: Isa, codes: &[u32], steps: &[f16], d: usize, out: &mut [u32]) {
    let record_words = codes.len().checked_div(steps.len()).unwrap_or(0);
    assert!(record_words * 4 >= d, "a q8 record holds its codes");
    assert_eq!(out.len(), steps.len() * d);
    let records = codes.chunks_exact(record_words.max(1)).zip(steps);
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => {
            for ((record, step), out) in records.zip(out.chunks_exact_mut(d)) {
                // SAFETY: `usable` returned an x86 vector ISA, so the CPU has AVX2; each
                // record holds its `d` codes (asserted above).
                unsafe { x86::q8_to_f32_bits(record, step.to_f32(), out) };
            }
        }
        _ => {
            for ((record, step), out) in records.zip(out.chunks_exact_mut(d)) {
                primitives::q8_to_f32_bits(record, step.to_f32(), out);
            }
        }
    }
}

/// The largest value (`-∞` for an empty slice). Exact, so every path returns the same bits.
pub fn max(isa: Isa, values: &[f32]) -> f32 {
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx512.
        Isa::Avx512 => unsafe { avx512::max(values) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2, so the CPU has AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { x86::max(values) },
        _ => primitives::max(values),
    }
}

/// Replaces every value `x` by `exp(x − shift)` and returns their sum (eight lanes in a fixed
/// order).
///
/// The scalar path calls `f32::exp`; the vector paths evaluate a Cody–Waite reduced degree-6
/// polynomial (the Cephes `expf` scheme) with FMA, within 2 ulp of the exact `exp` (1.25 ulp
/// measured on a 2-million-point grid) for arguments in `[−87.3, 88]` and flushed to 0 below `−87.3` (where `exp` is under `1.2e-38`); the tests
/// measure both bounds. Arguments must not be NaN.
pub fn exp_shifted_sum(isa: Isa, values: &mut [f32], shift: f32) -> f32 {
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx512.
        Isa::Avx512 => unsafe { avx512::exp_shifted_sum(values, shift) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2, so the CPU has AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { x86::exp_shifted_sum(values, shift) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::exp_shifted_sum(values, shift),
        _ => primitives::exp_shifted_sum(values, shift),
    }
}

/// The polynomial `exp` the vector paths evaluate, in portable scalar Rust (same operations,
/// same constants), so its accuracy can be checked on any machine.
pub fn exp_poly(x: f32) -> f32 {
    primitives::exp_poly(x)
}

/// f16 bits to f32 with integer operations only (the algorithm of the NEON path, which cannot
/// use the unstable `f16` vector types), in portable scalar Rust so it can be checked
/// exhaustively on any machine.
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    primitives::f16_bits_to_f32(bits)
}

/// Query heads prepared for scoring coded keys: the rotated queries `[G, d]`, the sketch
/// queries `[G, m]` and, for the AVX2 path, the QJL sign tables built from them.
///
/// The sign term `⟨w, z⟩` of a key is a sum of `±w_i`. With tables, the heads are taken in
/// tiles of up to four and each tile gets, per sign byte `k` of a record, 256 entries of four
/// floats: entry `[k][b]` holds `Σ_{i<8} ±w_h[8k+i]` (signs from the bits of `b`) for the
/// tile's heads. A key's sign term for all heads of a tile then costs `m/8` 16-byte loads and
/// adds instead of `m/8` sign expansions and `m/8·H` multiply-adds. The tables take
/// `4·m·256/8·4 = 512·m` bytes per tile (64 KiB at m = 128) and are built once per
/// (query, KV head).
#[derive(Clone, Debug, Default)]
pub struct KeyQueries {
    dim: usize,
    sketch_dim: usize,
    queries: Vec<f32>,
    sketch: Vec<f32>,
    tables: Vec<f32>,
}

impl KeyQueries {
    /// Prepares `queries` (`[G, dim]`) and `sketch` (`[G, sketch_dim]`, empty when
    /// `sketch_dim` is 0) for scoring on `isa`; `sign_tables` chooses whether the AVX2 path
    /// scores the sign term through byte tables (faster) or multiply-adds.
    ///
    /// # Panics
    /// If the lengths are not whole rows of the same `G`.
    pub fn new(
        isa: Isa,
        queries: Vec<f32>,
        sketch: Vec<f32>,
        dim: usize,
        sketch_dim: usize,
        sign_tables: bool,
    ) -> Self {
        let heads = check_tile(queries.len(), dim, "key queries");
        if sketch_dim > 0 {
            assert_eq!(
                sketch.len(),
                heads * sketch_dim,
                "key queries: sketch is not [G, m]"
            );
        }
        let mut keys = Self {
            dim,
            sketch_dim,
            queries,
            sketch,
            tables: Vec::new(),
        };
        keys.build_tables(isa, heads, sign_tables);
        keys
    }

    /// Rebuilds these key queries in place, as [`KeyQueries::new`] would from what `fill` writes
    /// into the (emptied) query and sketch buffers; every buffer is reused, so once they are
    /// large enough nothing is allocated (the decode loop prepares queries once per token).
    ///
    /// # Panics
    /// If the filled lengths are not whole rows of the same `G`.
    pub fn rebuild<E>(
        &mut self,
        isa: Isa,
        dim: usize,
        sketch_dim: usize,
        sign_tables: bool,
        fill: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.queries.clear();
        self.sketch.clear();
        fill(&mut self.queries, &mut self.sketch)?;
        let heads = check_tile(self.queries.len(), dim, "key queries");
        if sketch_dim > 0 {
            assert_eq!(
                self.sketch.len(),
                heads * sketch_dim,
                "key queries: sketch is not [G, m]"
            );
        }
        self.dim = dim;
        self.sketch_dim = sketch_dim;
        self.build_tables(isa, heads, sign_tables);
        Ok(())
    }

    fn build_tables(&mut self, isa: Isa, heads: usize, sign_tables: bool) {
        self.tables.clear();
        if sign_tables && self.sketch_dim > 0 && matches!(isa.usable(), Isa::Avx2 | Isa::Avx512) {
            build_sign_tables(&self.sketch, heads, self.sketch_dim, &mut self.tables);
        }
    }

    /// Query heads `G`.
    pub fn heads(&self) -> usize {
        self.queries.len() / self.dim.max(1)
    }

    /// The rotated queries, `[G, d]`.
    pub fn queries(&self) -> &[f32] {
        &self.queries
    }

    /// The sketch queries, `[G, m]`.
    pub fn sketch(&self) -> &[f32] {
        &self.sketch
    }

    /// Whether sign tables were built.
    pub fn has_sign_tables(&self) -> bool {
        !self.tables.is_empty()
    }
}

/// Whether a kernel may take its unrolled loops for the presets' record layouts: always, but
/// tests switch it off to hold those loops to the general loop's bits (each kernel has its
/// own switch, so tests of one do not change another's path).
#[cfg(target_arch = "x86_64")]
pub(crate) struct FlatSwitch {
    #[cfg(test)]
    on: std::sync::atomic::AtomicBool,
}

#[cfg(target_arch = "x86_64")]
impl FlatSwitch {
    /// A switch that is on.
    pub(crate) const fn new() -> Self {
        Self {
            #[cfg(test)]
            on: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Whether the unrolled loops may run.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        #[cfg(test)]
        return self.on.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(test))]
        true
    }

    /// Turns the unrolled loops on or off.
    #[cfg(test)]
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Tiles of at most four heads, balanced: `heads` split into `ceil(heads/4)` near-equal parts,
/// as `(first head, heads)`. Every path tiles the same way.
pub(crate) fn tiles(heads: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = heads.div_ceil(4).max(1);
    let (base, extra) = (heads / count, heads % count);
    (0..count).scan(0usize, move |first, k| {
        let size = base + usize::from(k < extra);
        let tile = (*first, size);
        *first += size;
        Some(tile)
    })
}

/// Floats of one tile's sign tables for sketch dimension `m`.
pub(crate) fn sign_table_len(m: usize) -> usize {
    m.div_ceil(8) * 256 * 4
}

/// The sign tables of every tile, tile after tile (see [`KeyQueries`]). Entry `b` is built from
/// entry `b` without its lowest set bit by adding `2·w` of that bit, starting from `−Σ w`; bits
/// past `m` in the last byte are ignored.
fn build_sign_tables(sketch: &[f32], heads: usize, m: usize, tables: &mut Vec<f32>) {
    let per_tile = sign_table_len(m);
    tables.clear();
    tables.resize(tiles(heads).count() * per_tile, 0.0);
    for (t, (first, size)) in tiles(heads).enumerate() {
        let tile = &mut tables[t * per_tile..(t + 1) * per_tile];
        for (k, table) in tile.chunks_exact_mut(256 * 4).enumerate() {
            let valid = (m - 8 * k).min(8);
            // `twice[i][h] = 2·w_h[8k + i]`; the entry of byte 0 is `−Σ_i w_h[8k + i]`.
            let mut twice = [[0.0f32; 4]; 8];
            let mut entry = [0.0f32; 4];
            for h in 0..size {
                let w = &sketch[(first + h) * m + 8 * k..(first + h) * m + 8 * k + valid];
                entry[h] = -w.iter().sum::<f32>();
                for (i, &x) in w.iter().enumerate() {
                    twice[i][h] = 2.0 * x;
                }
            }
            table[..4].copy_from_slice(&entry);
            for b in 1..256usize {
                let low = b.trailing_zeros() as usize;
                let rest = b & (b - 1);
                let mut next: [f32; 4] = table[4 * rest..4 * rest + 4]
                    .try_into()
                    .expect("four floats");
                for (v, add) in next.iter_mut().zip(&twice[low]) {
                    *v += add;
                }
                table[4 * b..4 * b + 4].copy_from_slice(&next);
            }
        }
    }
}

fn check_tile(len: usize, width: usize, what: &str) -> usize {
    assert!(
        width > 0 && len.is_multiple_of(width),
        "{what}: not whole rows"
    );
    len / width
}

/// Adds the scores of every record of a coded run against `G` prepared query heads:
/// `out[h·stride + i] += norm_i·⟨queries_h, c[idx_i]⟩ + γ_i·⟨sketch_queries_h, z_i⟩`
/// (adding lets the tiers of a two-tier record score into one row).
///
/// `queries` holds the rotated, scaled queries `[G, d]` and, with signs, the sketch queries
/// `[G, m]` (the rotated query projected by the sketch, times its gain).
///
/// # Panics
/// On inconsistent lengths (see [`CodedRun`]), or if `out` is too short.
pub fn score_coded(
    isa: Isa,
    run: &CodedRun<'_>,
    queries: &KeyQueries,
    out: &mut [f32],
    stride: usize,
) {
    run.check();
    assert_eq!(
        queries.dim, run.dim,
        "score_coded: query dimension differs from the run's"
    );
    let heads = queries.heads();
    if run.sketch_dim > 0 {
        assert_eq!(
            queries.sketch_dim, run.sketch_dim,
            "score_coded: sketch dimension differs from the run's"
        );
    }
    let n = run.len();
    if n == 0 {
        return;
    }
    assert!(
        stride >= n && out.len() >= (heads - 1) * stride + n,
        "score_coded: out too short"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2; every length was checked above.
        Isa::Avx2 => unsafe { x86::score_coded(run, queries, out, stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx512; every length was checked above.
        Isa::Avx512 => unsafe { avx512::score_coded(run, queries, out, stride) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => {
            composed::score_coded::<neon::Neon>(run, &queries.queries, &queries.sketch, out, stride)
        }
        _ => composed::score_coded::<composed::Scalar>(
            run,
            &queries.queries,
            &queries.sketch,
            out,
            stride,
        ),
    }
}

/// Adds the scores of runs that are parts of the same records (the tiers of a two-tier record,
/// the groups of a basis record): `out[h·stride + i] += Σ_parts score_part(h, i)`, each part
/// scored as by [`score_coded`] against its own prepared queries. Vector paths score all parts
/// in one pass over the tokens: AVX2 with the bits of a pass per part (each part's score
/// reduced on its own and added in part order), AVX-512 the two parts of a two-tier record
/// with one reduction per token.
///
/// # Panics
/// If the runs do not share their words and record size, if `queries` does not hold one entry
/// per run with the same number of heads, or as [`score_coded`].
pub fn score_coded_parts(
    isa: Isa,
    runs: &[CodedRun<'_>],
    queries: &[&KeyQueries],
    out: &mut [f32],
    stride: usize,
) {
    assert_eq!(
        runs.len(),
        queries.len(),
        "score_coded_parts: one query set per run"
    );
    let Some(first) = runs.first() else {
        return;
    };
    let heads = queries[0].heads();
    for (run, q) in runs.iter().zip(queries) {
        assert!(
            std::ptr::eq(run.words, first.words) && run.record_words == first.record_words,
            "score_coded_parts: the runs must be parts of the same records"
        );
        assert_eq!(
            q.heads(),
            heads,
            "score_coded_parts: query sets differ in heads"
        );
        run.check();
        assert_eq!(
            q.dim, run.dim,
            "score_coded_parts: query dimension differs from the run's"
        );
        if run.sketch_dim > 0 {
            assert_eq!(
                q.sketch_dim, run.sketch_dim,
                "score_coded_parts: sketch dimension differs from the run's"
            );
        }
    }
    let n = first.len();
    if n == 0 {
        return;
    }
    assert!(
        stride >= n && out.len() >= (heads - 1) * stride + n,
        "score_coded_parts: out too short"
    );
    #[cfg(target_arch = "x86_64")]
    if isa.usable() == Isa::Avx512 {
        // AVX-512 fuses the tiers of a two-tier record (one reduction per token, its own
        // bits); the groups of a basis record go one by one, each as a one-part record.
        if runs.len() <= 2 && avx512::parts_supported(runs) {
            // SAFETY: `usable` returned Avx512; every length and the shared records were
            // checked.
            unsafe { avx512::score_parts(runs, queries, out, stride) };
            return;
        }
        if runs.len() > 2 {
            for (run, q) in runs.iter().zip(queries) {
                let one = std::slice::from_ref(run);
                if avx512::parts_supported(one) {
                    // SAFETY: as above, for one of the checked runs.
                    unsafe { avx512::score_parts(one, std::slice::from_ref(q), out, stride) };
                } else {
                    score_coded(isa, run, q, out, stride);
                }
            }
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa.usable() == Isa::Avx2 && runs.len() <= x86::MAX_PARTS {
        // SAFETY: `usable` returned Avx2; every length and the shared records were checked.
        unsafe { x86::score_parts(runs, queries, out, stride) };
        return;
    }
    for (run, q) in runs.iter().zip(queries) {
        score_coded(isa, run, q, out, stride);
    }
}

/// Adds the scores of every record of a plain run against `G` query heads `[G, d]`:
/// `out[h·stride + i] += ⟨queries_h, x_i⟩`, each dot product summed in the order of
/// [`primitives::lane8_dot`], so every instruction set gives the same bits.
///
/// # Panics
/// On inconsistent lengths, or if `out` is too short.
pub fn score_plain(isa: Isa, run: &PlainRun<'_>, queries: &[f32], out: &mut [f32], stride: usize) {
    run.check();
    let heads = check_tile(queries.len(), run.dim, "score_plain queries");
    let n = run.len();
    if n == 0 {
        return;
    }
    assert!(
        stride >= n && out.len() >= (heads - 1) * stride + n,
        "score_plain: out too short"
    );
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx512; every length was checked above, and the dimension
        // is a multiple of 8.
        Isa::Avx512 if run.dim.is_multiple_of(8) => unsafe {
            avx512::score_plain(run, queries, out, stride)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2 or Avx512 (both have AVX2, FMA and F16C); every
        // length was checked above.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::score_plain(run, queries, out, stride) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => composed::score_plain::<neon::Neon>(run, queries, out, stride),
        _ => composed::score_plain::<composed::Scalar>(run, queries, out, stride),
    }
}

/// Accumulates the records of a coded run in the rotated (and sketch) domain:
/// `acc[h] += Σ_i code_weights[i·G + h]·c[idx_i]` and, with signs,
/// `sign_acc[h] += Σ_i sign_weights[i·G + h]·z_i`.
///
/// `code_weights` and `sign_weights` are token-major `[n, G]` (usually `p·norm` and `p·γ`);
/// `acc` is `[G, d]`, `sign_acc` is `[G, m]` (both may be empty without signs).
///
/// # Panics
/// On inconsistent lengths.
pub fn accumulate_coded(
    isa: Isa,
    run: &CodedRun<'_>,
    code_weights: &[f32],
    sign_weights: &[f32],
    acc: &mut [f32],
    sign_acc: &mut [f32],
) {
    run.check();
    let heads = check_tile(acc.len(), run.dim, "accumulate_coded acc");
    let n = run.len();
    assert_eq!(
        code_weights.len(),
        n * heads,
        "accumulate_coded: code weights not [n, G]"
    );
    if run.sketch_dim > 0 {
        assert_eq!(
            sign_weights.len(),
            n * heads,
            "accumulate_coded: sign weights not [n, G]"
        );
        assert_eq!(
            sign_acc.len(),
            heads * run.sketch_dim,
            "accumulate_coded: sign accumulators not [G, m]"
        );
    }
    if n == 0 {
        return;
    }
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2; every length was checked above.
        Isa::Avx2 => unsafe {
            x86::accumulate_coded(run, code_weights, sign_weights, acc, sign_acc)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx512; every length was checked above.
        Isa::Avx512 => unsafe {
            avx512::accumulate_coded(run, code_weights, sign_weights, acc, sign_acc)
        },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => {
            composed::accumulate_coded::<neon::Neon>(run, code_weights, sign_weights, acc, sign_acc)
        }
        _ => composed::accumulate_coded::<composed::Scalar>(
            run,
            code_weights,
            sign_weights,
            acc,
            sign_acc,
        ),
    }
}

/// Accumulates the records of coded runs that share their records (the parts of one record
/// layout: one codec's codes, the two tiers of a two-tier record, the groups of a basis) with
/// head-major weights: part `k`'s `accs[k][h] += Σ_i (weights[h·stride + i]·norm_k,i)·c_k,i` —
/// what [`accumulate_coded`] adds from the token-major weights `p·norm`, the same products and
/// fused multiply-adds in the same order, so the same bits, without writing those weights.
///
/// AVX-512 takes the parts together when they have codes of at most 4 bits without QJL signs in
/// whole chunks of sixteen coordinates (the presets' two tiers in one pass over the tokens),
/// AVX2 takes runs without signs part by part. Returns `false`, touching nothing, for other
/// runs and instruction sets; the caller then weighs each part through [`accumulate_coded`].
///
/// # Panics
/// On inconsistent lengths, or runs that are not parts of the same records.
pub fn accumulate_coded_parts(
    isa: Isa,
    runs: &[CodedRun<'_>],
    weights: &[f32],
    stride: usize,
    accs: &mut [&mut [f32]],
) -> bool {
    assert_eq!(
        runs.len(),
        accs.len(),
        "accumulate_coded_parts: one accumulator per run"
    );
    let Some(first) = runs.first() else {
        return true;
    };
    let heads = check_tile(accs[0].len(), first.dim, "accumulate_coded_parts acc");
    if heads == 0 {
        return true;
    }
    for (run, acc) in runs.iter().zip(accs.iter()) {
        assert!(
            std::ptr::eq(run.words, first.words) && run.record_words == first.record_words,
            "accumulate_coded_parts: the runs must be parts of the same records"
        );
        run.check();
        assert_eq!(
            check_tile(acc.len(), run.dim, "accumulate_coded_parts acc"),
            heads,
            "accumulate_coded_parts: accumulators differ in heads"
        );
    }
    let n = first.len();
    assert!(
        stride >= n && weights.len() >= (heads - 1) * stride + n,
        "accumulate_coded_parts: weights too short"
    );
    #[cfg(target_arch = "x86_64")]
    if isa.usable() == Isa::Avx512 && avx512::value_parts_supported(runs) {
        if n == 0 {
            return true;
        }
        if runs.len() <= 2 {
            // SAFETY: `usable` returned Avx512; every length and the shared records were
            // checked, and the runs are supported.
            unsafe { avx512::accumulate_parts(runs, weights, stride, heads, accs) };
        } else {
            for (run, acc) in runs.iter().zip(accs.iter_mut()) {
                // SAFETY: as above, for one of the checked runs.
                unsafe {
                    avx512::accumulate_parts(
                        std::slice::from_ref(run),
                        weights,
                        stride,
                        heads,
                        std::slice::from_mut(acc),
                    )
                };
            }
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.usable() == Isa::Avx2 && runs.iter().all(|r| r.sketch_dim == 0) {
        if n > 0 {
            for (run, acc) in runs.iter().zip(accs.iter_mut()) {
                // SAFETY: `usable` returned Avx2; every length was checked, no run has signs.
                unsafe { x86::accumulate_head_major(run, weights, stride, acc) };
            }
        }
        return true;
    }
    let _ = (isa, weights);
    false
}

/// Accumulates the records of a plain run: `acc[h] += Σ_i weights[i·G + h]·x_i`, with
/// `weights` token-major `[n, G]` and `acc` `[G, d]`: one fused multiply-add per token and
/// coordinate, in token order, so every instruction set gives the same bits.
///
/// # Panics
/// On inconsistent lengths.
pub fn accumulate_plain(isa: Isa, run: &PlainRun<'_>, weights: &[f32], acc: &mut [f32]) {
    run.check();
    let heads = check_tile(acc.len(), run.dim, "accumulate_plain acc");
    let n = run.len();
    assert_eq!(
        weights.len(),
        n * heads,
        "accumulate_plain: weights not [n, G]"
    );
    if n == 0 {
        return;
    }
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx2; every length was checked above.
        Isa::Avx2 => unsafe { x86::accumulate_plain(run, weights, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returned Avx512; every length was checked above.
        Isa::Avx512 => unsafe { avx512::accumulate_plain(run, weights, acc) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => composed::accumulate_plain::<neon::Neon>(run, weights, acc),
        _ => composed::accumulate_plain::<composed::Scalar>(run, weights, acc),
    }
}

/// [`fused_attention`](super::fused_attention) on a chosen instruction set (an unavailable
/// one runs scalar). Each instruction set alone is deterministic and thread-count free; over
/// coded records two of them may differ in the last bits, over plain (f16/f32) records they
/// agree bit for bit.
pub fn fused_attention_on(
    isa: Isa,
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    super::attend(
        cache,
        queries,
        query_positions,
        shape,
        super::AttentionKernel::FusedOn(isa.usable()),
        out,
    )
}
