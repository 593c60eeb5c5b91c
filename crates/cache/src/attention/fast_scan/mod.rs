//! Key scoring at memory speed: the "fast scan" layout of product-quantization search applied
//! to TurboQuant_mse keys (codes of b ≤ 4 bits per rotated coordinate).
//!
//! A compressed key is `norm · c[code_j]` in the rotated domain, so its score against a query
//! is `norm · Σ_j q'_j · c[code_j]`, with `q' = Π·q` rotated once per query. The fused kernel
//! evaluates that per token: unpack a record, look up its centroids, multiply-add, reduce. Here
//! instead:
//!
//! - [`FastScanBlocks`] stores the codes of a **block of 32 tokens in nibble lanes**: a nibble
//!   holds one 4-bit (or 3-bit) code, two 2-bit or four 1-bit codes (the nibbles of their
//!   packed words), and per lane 16 bytes hold the block's 32 nibbles (token `i` in the low
//!   half of byte `i`, token `i + 16` in the high half); the block's norms sit beside the codes.
//! - [`ScoreTable`] holds, per query and lane, the 16 sums `Σ_i q'_i · c[n_i]` of the lane's
//!   coordinates for each nibble `n` (for one code per nibble, the `2^b` products `q'_j · c_k`),
//!   **quantized to bytes** with one step `δ` shared by every lane (each keeps its own offset,
//!   the smallest of its sums).
//! - A block's scores are then one byte shuffle per lane and 32 tokens (`vpshufb`, NEON's
//!   `tbl`: the 16-entry table indexes itself with the 32 nibbles), summed in **16-bit integers**. Integer
//!   sums are exact: the sums, and so the scores, are the same bits on every instruction set,
//!   thread count and block split (tested: [`Isa::Scalar`], [`Isa::Avx2`], [`Isa::Avx512`],
//!   [`Isa::Neon`]).
//!
//! **The table's error.** Rounding an entry to the nearest multiple of `δ` moves it by at most
//! `δ/2`, and a score adds one entry per lane, so the fast score differs from the exact
//! `norm · Σ_j q'_j c[code_j]` by at most `norm · L · δ / 2` (plus f32 rounding) over the `L`
//! lanes that hold coordinates, with `δ = max_l (Σ_{i ∈ l} |q'_i|·(c_max − c_min)) / 255`.
//! Tested against that bound, and against the codec's own score error: the table adds a small
//! fraction of it (`tests/fast_scan.rs`: 0.07% of it at b = 2, where two codes share a lane's
//! step, 3% at b = 4).
//!
//! [`attend`] completes a decode step on the layout: scores, a softmax, and the values'
//! weighted sum from the same layout in the rotated domain, one inverse rotation per output,
//! the same bits on every instruction set. [`attend_with`] with [`ValueSums::Int8`] sums the
//! values in integers too (7-bit weights per block and head, 8-bit centroids, `vpmaddubsw`),
//! with a derived and tested error bound.
//!
//! **In the cache.** A stream whose allocation asks for `record_order = "fast-scan"` stores its
//! body in this layout ([`record_order`](crate::record_order): the same bytes as its rows), and
//! the fused kernel scores and sums its runs with these kernels (the module `runs`): keys
//! through each query head's [`ScoreTable`], values in integers as [`ValueSums::Int8`] sums
//! them, both tested (`tests/fast_scan_cache.rs`). Measured on Zen 3 (AVX2, docs/results.md):
//! a 4-bit cache decodes 1.5–2.0× faster in this order than in rows at 16K–64K tokens, a
//! 2-bit one 1.6–1.7× (1.6–2.2× f16), with the same KL divergence within its error. A basis
//! record takes the order too: one table per query head over every group
//! ([`ScoreTable::rebuild_parts`]), the values summed group by group.
//!
//! **Bit planes** (the module `wide`): in the cache, codes of 3 and 5 to 8 bits are stored as
//! planes of 4, 2 and 1 bits ([`record_order`](crate::record_order)), which no nibble lane
//! holds whole. Their lanes' byte entries are zero, and a second pass puts each coordinate's
//! 32 codes back together from its planes and adds the product of two integers, the code's
//! centroid on a 12-bit grid and the query coordinate on the grid of the sum's unit (the
//! nibble lanes' bytes then count [`ScoreTable::lane_unit`] units) — still one exact integer
//! sum, the same on every instruction set (AVX2: the centroids looked up once per coordinate
//! for every head by `vpshufb`, each head's products by `vpmaddwd`; AVX-512: two
//! coordinates' codes per `vpermb`, 16 tokens per `vpmaddwd`; NEON runs the scalar loop).
//! Values look the code up in the centroid bytes (AVX2: `vpshufb`, blended past 4 bits;
//! AVX-512: `vpermb`).
//!
//! **Limits**: the standalone layout holds single-part TurboQuant_mse codes of b ≤ 4 bits (a
//! 3-bit code takes a whole nibble there, so it saves no bytes over 4 bits); the f32 value
//! sums of [`attend`] are slower than the fused
//! kernel's on AVX-512 and AVX2
//! (`tq bench scan --attention`), the integer ones 2.0–2.3× the f16 kernel for a whole
//! standalone step on AVX2 (docs/results.md). On
//! aarch64 [`Isa::Neon`] scores with the NEON shuffle (`tbl`, one head per pass) and sums
//! integer values with `tbl` and `smull` (tested under QEMU, not timed on hardware); its f32
//! value sums run the scalar loops, which give the same bits. On AVX-512 the integer value
//! sums (nibble lanes and bit planes) transpose sixteen coordinates' centroid bytes into
//! groups of four tokens and add each head's weighted tokens with one `vpdpbusd` per group
//! (module `values_avx512`; `vpmaddubsw` and `vpmaddwd` without VNNI).
//!
//! ```
//! use tq_cache::attention::fast_scan::{FastScanBlocks, ScoreTable, scores};
//! use tq_cache::attention::simd::Isa;
//!
//! // Two-bit codes at d = 4 with a toy codebook.
//! let centroids = [-1.5f32, -0.5, 0.5, 1.5];
//! let mut keys = FastScanBlocks::new(4, 2).unwrap();
//! keys.push(&[0, 1, 2, 3], 2.0).unwrap();
//! keys.push(&[3, 3, 3, 3], 1.0).unwrap();
//! let table = ScoreTable::new(&[1.0, 0.0, -1.0, 0.5], &centroids, 2).unwrap();
//! let mut out = [0.0f32; 2];
//! scores(Isa::detect(), &table, &keys, &mut out).unwrap();
//! // Exact: 2·(−1.5 + 0 − 0.5 + 0.75) = −2.5 and 1·(1.5 + 0 − 1.5 + 0.75) = 0.75.
//! assert!((out[0] + 2.5).abs() < 0.05 && (out[1] - 0.75).abs() < 0.05);
//! ```

mod attend;
mod layout;
#[cfg(target_arch = "aarch64")]
mod neon;
mod runs;
mod scalar;
mod table;
#[cfg(target_arch = "x86_64")]
mod values_avx512;
mod values_int;
mod weights;
mod wide;
#[cfg(target_arch = "x86_64")]
mod wide_avx512;
#[cfg(target_arch = "x86_64")]
mod wide_x86;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attend::{AttendScratch, FastScanStream, ValueSums, attend, attend_with};
pub use layout::FastScanBlocks;
pub(crate) use runs::{RunPart, RunScratch, accumulate_run, score_run};
pub use table::{ScoreTable, TablePart};
pub(crate) use values_int::ValueTables;

use super::simd::Isa;
use layout::LANE_BYTES;

/// Whether `isa` lets the AVX2 kernels and the AVX2-compiled loops run: asked for (AVX-512
/// CPUs take them too, where no AVX-512 form exists) and present on this CPU.
#[cfg(target_arch = "x86_64")]
fn avx2_kernels(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512) && Isa::Avx2.is_available()
}

/// Tokens per block of the layout: the cache's fast-scan record order
/// ([`FAST_SCAN_BLOCK`](crate::record_order::FAST_SCAN_BLOCK)), whose blocks these kernels read.
pub const BLOCK: usize = crate::record_order::FAST_SCAN_BLOCK;

/// Errors of the fast-scan layout and tables.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FastScanError {
    /// The layout holds codes of 1 to 4 bits.
    #[error("fast scan holds codes of 1 to 4 bits, not {bits}")]
    UnsupportedBits {
        /// The requested width.
        bits: u8,
    },
    /// A zero head dimension.
    #[error("fast scan needs a positive head dimension")]
    ZeroDim,
    /// A slice of the wrong length.
    #[error("{what}: expected {expected} values, got {actual}")]
    LengthMismatch {
        /// Which input.
        what: &'static str,
        /// Its required length.
        expected: usize,
        /// Its length.
        actual: usize,
    },
    /// A code at or above `2^bits`.
    #[error("code {code} at coordinate {coordinate} does not fit in {bits} bits")]
    CodeOutOfRange {
        /// The code.
        code: u8,
        /// Where it is.
        coordinate: usize,
        /// The layout's width.
        bits: u8,
    },
    /// A NaN or infinite query coordinate, centroid or norm.
    #[error("{what} is not finite")]
    NotFinite {
        /// Which input.
        what: &'static str,
    },
    /// A codec whose dimension or width differs from its blocks'.
    #[error("the {what} does not match its blocks' dimension and width")]
    CodecMismatch {
        /// Which codec.
        what: &'static str,
    },
    /// A rotation or codec error, with its message.
    #[error("codec: {0}")]
    Codec(String),
    /// A table built for another dimension or width than the keys.
    #[error(
        "table for d = {table_dim}, b = {table_bits} against keys of d = {keys_dim}, b = {keys_bits}"
    )]
    TableMismatch {
        /// The table's dimension.
        table_dim: usize,
        /// The table's width.
        table_bits: u8,
        /// The keys' dimension.
        keys_dim: usize,
        /// The keys' width.
        keys_bits: u8,
    },
}

/// The 32 integer sums `Σ_j u_j[code(t, j)]` of block `block` (tokens past the end of the keys
/// sum their zero padding). The same integers on every instruction set.
pub fn block_sums(
    isa: Isa,
    table: &ScoreTable,
    keys: &FastScanBlocks,
    block: usize,
    out: &mut [u32; BLOCK],
) -> Result<(), FastScanError> {
    check(table, keys)?;
    if block >= keys.blocks() {
        return Err(FastScanError::LengthMismatch {
            what: "block index",
            expected: keys.blocks(),
            actual: block,
        });
    }
    sums_unchecked(isa, table, keys.block_codes(block), out);
    Ok(())
}

/// Every key's approximate score `norm · (δ · sum + Σ_j offset_j)` into `out` (one per token).
pub fn scores(
    isa: Isa,
    table: &ScoreTable,
    keys: &FastScanBlocks,
    out: &mut [f32],
) -> Result<(), FastScanError> {
    check(table, keys)?;
    if out.len() != keys.len() {
        return Err(FastScanError::LengthMismatch {
            what: "scores",
            expected: keys.len(),
            actual: out.len(),
        });
    }
    let mut sums = [0u32; BLOCK];
    for (block, chunk) in out.chunks_mut(BLOCK).enumerate() {
        sums_unchecked(isa, table, keys.block_codes(block), &mut sums);
        let norms = keys.block_norms(block);
        for ((o, &s), &n) in chunk.iter_mut().zip(&sums).zip(norms) {
            *o = n * table.dequantize(s);
        }
    }
    Ok(())
}

/// The scores of every key against several query heads (one table each, e.g. the heads of a
/// GQA group): `out[h · n + t]` for head `h` and token `t`, `n = keys.len()`. Each block's codes
/// are read once for all heads (they stay in the L1 cache between heads); every score is the
/// one [`scores`] gives for that head, bit for bit.
pub fn scores_heads(
    isa: Isa,
    tables: &[ScoreTable],
    keys: &FastScanBlocks,
    out: &mut [f32],
) -> Result<(), FastScanError> {
    for table in tables {
        check(table, keys)?;
    }
    let n = keys.len();
    if out.len() != tables.len() * n {
        return Err(FastScanError::LengthMismatch {
            what: "scores of every head",
            expected: tables.len() * n,
            actual: out.len(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time just above.
        unsafe { scores_heads_avx2(isa, tables, keys, out) };
        return Ok(());
    }
    scores_heads_body(isa, tables, keys, out);
    Ok(())
}

/// [`scores_heads_body`] compiled for AVX2, so that the scores' float steps run eight lanes
/// at a time: the same operations, so the same bits.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scores_heads_avx2(
    isa: Isa,
    tables: &[ScoreTable],
    keys: &FastScanBlocks,
    out: &mut [f32],
) {
    scores_heads_body(isa, tables, keys, out);
}

#[inline(always)]
fn scores_heads_body(isa: Isa, tables: &[ScoreTable], keys: &FastScanBlocks, out: &mut [f32]) {
    let n = keys.len();
    let mut sums = [[0u32; BLOCK]; 4];
    for block in 0..keys.blocks() {
        let codes = keys.block_codes(block);
        let norms = keys.block_norms(block);
        let (start, end) = (block * BLOCK, n.min((block + 1) * BLOCK));
        for (tile, group) in tables.chunks(4).enumerate() {
            sums_tile(isa, group, codes, &mut sums[..group.len()]);
            for (g, table) in group.iter().enumerate() {
                let h = 4 * tile + g;
                for ((o, &s), &norm) in out[h * n + start..h * n + end]
                    .iter_mut()
                    .zip(&sums[g])
                    .zip(norms)
                {
                    *o = norm * table.dequantize(s);
                }
            }
        }
    }
}

/// The sums of up to four heads' tables over one block: the nibble lanes in one pass over
/// the codes on AVX2 and AVX-512 (only the runs of lanes that hold nibble codes,
/// [`ScoreTable::nibble_runs`]), then the coordinates stored as bit planes ([`wide`]).
pub(super) fn sums_tile(isa: Isa, tables: &[ScoreTable], codes: &[u8], out: &mut [[u32; BLOCK]]) {
    let heads = tables.len().min(4);
    let runs = tables[0].nibble_runs();
    let mut entries: [&[u8]; 4] = [&[]; 4];
    if let [run] = runs
        && run.start == 0
        && run.end * LANE_BYTES == codes.len()
    {
        for (e, table) in entries.iter_mut().zip(tables) {
            *e = table.entries();
        }
        nibble_sums_tile(isa, &entries[..heads], codes, out);
    } else {
        for o in out.iter_mut() {
            o.fill(0);
        }
        let mut part = [[0u32; BLOCK]; 4];
        for run in runs {
            let bytes = run.start * LANE_BYTES..run.end * LANE_BYTES;
            for (e, table) in entries.iter_mut().zip(tables) {
                *e = &table.entries()[bytes.clone()];
            }
            nibble_sums_tile(isa, &entries[..heads], &codes[bytes], &mut part[..heads]);
            for (o, p) in out.iter_mut().zip(&part) {
                for (o, p) in o.iter_mut().zip(p) {
                    *o += p;
                }
            }
        }
    }
    for (o, table) in out.iter_mut().zip(tables) {
        let unit = table.lane_unit();
        if unit != 1 {
            // Counted in the wide entries' finer steps (each head's own; exact: at most
            // 255·256 a lane). A power of two, so a shift (this loop is compiled for the
            // baseline instruction set, whose 32-bit multiply is slow).
            debug_assert!(unit.is_power_of_two());
            let shift = unit.trailing_zeros();
            for o in o.iter_mut() {
                *o <<= shift;
            }
        }
    }
    wide::add_sums(isa, tables, codes, out);
}

/// The nibble lanes' part of [`sums_tile`]: `out[h]` the sums of `entries[h]` (16 bytes a
/// lane, the lanes of `codes`).
fn nibble_sums_tile(isa: Isa, entries: &[&[u8]], codes: &[u8], out: &mut [[u32; BLOCK]]) {
    #[cfg(target_arch = "x86_64")]
    {
        let e = |h: usize| entries[h];
        if isa == Isa::Avx512 && isa.is_available() {
            // SAFETY: AVX-512 F/BW (with AVX2) was detected at run time just above; every
            // table and `codes` hold `lanes · 16` bytes, a multiple of 64 (the tables were
            // checked against the keys, their runs of nibble lanes are whole registers).
            unsafe {
                match entries.len() {
                    1 => x86::sums_heads_avx512::<1>([e(0)], codes, out.try_into().expect("1")),
                    2 => {
                        x86::sums_heads_avx512::<2>([e(0), e(1)], codes, out.try_into().expect("2"))
                    }
                    3 => x86::sums_heads_avx512::<3>(
                        [e(0), e(1), e(2)],
                        codes,
                        out.try_into().expect("3"),
                    ),
                    _ => x86::sums_heads_avx512::<4>(
                        [e(0), e(1), e(2), e(3)],
                        codes,
                        out.try_into().expect("4"),
                    ),
                }
            }
            return;
        }
        if avx2_kernels(isa) {
            // Two heads per pass: a third one's accumulators would not fit in the sixteen
            // registers (three heads at once measured 1.15× slower than two then one).
            for (pair, o) in (0..entries.len()).step_by(2).zip(out.chunks_mut(2)) {
                // SAFETY: AVX2 was detected at run time just above; lengths as for AVX-512.
                unsafe {
                    if o.len() == 2 {
                        let o = o.try_into().expect("2");
                        x86::sums_heads_avx2::<2>([e(pair), e(pair + 1)], codes, o);
                    } else {
                        x86::sums_heads_avx2::<1>([e(pair)], codes, o.try_into().expect("1"));
                    }
                }
            }
            return;
        }
    }
    for (entries, o) in entries.iter().zip(out.iter_mut()) {
        nibble_sums(isa, entries, codes, o);
    }
}

fn check(table: &ScoreTable, keys: &FastScanBlocks) -> Result<(), FastScanError> {
    if table.dim() != keys.dim() || table.bits() != keys.bits() {
        return Err(FastScanError::TableMismatch {
            table_dim: table.dim(),
            table_bits: table.bits(),
            keys_dim: keys.dim(),
            keys_bits: keys.bits(),
        });
    }
    Ok(())
}

/// One table's sums of one block ([`sums_tile`] for one head).
fn sums_unchecked(isa: Isa, table: &ScoreTable, codes: &[u8], out: &mut [u32; BLOCK]) {
    sums_tile(
        isa,
        std::slice::from_ref(table),
        codes,
        std::slice::from_mut(out),
    );
}

/// Dispatch on an instruction set the CPU has (anything else runs the scalar loop).
fn nibble_sums(isa: Isa, entries: &[u8], codes: &[u8], out: &mut [u32; BLOCK]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_available() => {
            // SAFETY: AVX-512 F/BW (with AVX2) was detected at run time just above; `codes` and
            // the table hold `lanes · 16` bytes, a multiple of 64 (asserted by `x86`).
            unsafe {
                x86::sums_heads_avx512::<1>(
                    [entries],
                    codes,
                    std::slice::from_mut(out).try_into().expect("one head"),
                )
            }
        }
        #[cfg(target_arch = "x86_64")]
        _ if avx2_kernels(isa) => {
            // SAFETY: AVX2 was detected at run time just above; lengths as for AVX-512.
            unsafe {
                x86::sums_heads_avx2::<1>(
                    [entries],
                    codes,
                    std::slice::from_mut(out).try_into().expect("one head"),
                )
            }
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::sums(entries, codes, out),
        _ => scalar::sums(entries, codes, out),
    }
}
