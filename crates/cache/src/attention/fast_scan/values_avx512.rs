//! Integer value sums on AVX-512, token groups against coordinates: a block's centroid bytes
//! for sixteen coordinates are transposed into groups of four tokens ([`transpose`]), so that
//! one `vpdpbusd` per group and head ([`dot_bytes`]; `vpmaddubsw`, `vpmaddwd` and an add
//! without VNNI) adds the head's four weighted tokens to all sixteen coordinates' sums — no
//! horizontal additions, which the AVX2 forms spend a third of their instructions on. Here the
//! form over nibble lanes ([`values_int::accumulate_block`](super::values_int::accumulate_block):
//! a pair's lanes broadcast, shifted to nibbles and looked up with one `vpshufb` per 64 bytes,
//! each 128-bit lane through its coordinate's table); the bit planes' form, which puts its
//! codes together first, is in [`wide_avx512`](super::wide_avx512). The same integers and
//! float steps as the loops.

use std::arch::x86_64::*;

use super::BLOCK;
use super::layout::LANE_BYTES;
use super::values_int::ValueTables;

/// Coordinates summed per pass.
const PASS: usize = 16;

/// Whether the CPU has AVX-512 VNNI (`vpdpbusd`, `vpdpwssd`: a multiply-add and its sum in
/// one instruction, the same integers). Detected once per process.
pub(super) fn vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| is_x86_feature_detected!("avx512vnni"))
}

/// One stage of [`transpose`]: registers `a` and `b` (register bit `p` 0 and 1) exchange that
/// bit with element bit `q`: `a` keeps the elements with bit `q` clear, from both (those of
/// `b` where the bit is set), `b` the others. The `vpermt2d` orders for `a` and `b`, then
/// `final_order` applied to where each output element lands.
const fn stage_orders(q: usize, final_order: &[usize; 16]) -> [[u32; 16]; 2] {
    let mut orders = [[0u32; 16]; 2];
    let mut at = 0;
    while at < 16 {
        let e = final_order[at];
        let bit = 1 << q;
        orders[0][at] = if e & bit == 0 { e } else { 16 + (e ^ bit) } as u32;
        orders[1][at] = if e & bit == 0 { e | bit } else { 16 + e } as u32;
        at += 1;
    }
    orders
}

/// Positions unchanged.
const IDENTITY: [usize; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// After the three stages element `e` holds coordinate `2·(e mod 8) + e / 8`; the last stage
/// reads through this order so that element `j` holds coordinate `j`.
const COORDINATE_ORDER: [usize; 16] = {
    let mut order = [0usize; 16];
    let mut j = 0;
    while j < 16 {
        order[j] = (j % 2) * 8 + j / 2;
        j += 1;
    }
    order
};

/// The orders of the three stages of [`transpose`].
static STAGES: [[[u32; 16]; 2]; 3] = [
    stage_orders(0, &IDENTITY),
    stage_orders(1, &IDENTITY),
    stage_orders(2, &COORDINATE_ORDER),
];

/// A transpose of 16 coordinates' centroid bytes by groups of four tokens: in, register `r`
/// holds coordinates `2r` (dwords 0–7) and `2r + 1` (dwords 8–15), dword `g` of each the bytes
/// of tokens `4g .. 4g + 4`; out, register `g` holds those four tokens' bytes of coordinate
/// `j` in dword `j` — what `vpdpbusd` multiplies with the four tokens' weights. Three stages,
/// each exchanging a bit of the register index (`r`'s, low first) with a bit of the dword
/// index (`g`'s), eight `vpermt2d` each.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn transpose(rows: &mut [__m512i; 8]) {
    for (s, [a_order, b_order]) in STAGES.iter().enumerate() {
        // SAFETY: each order holds 16 u32 (64 bytes).
        let (a_order, b_order) = unsafe {
            (
                _mm512_loadu_si512(a_order.as_ptr().cast()),
                _mm512_loadu_si512(b_order.as_ptr().cast()),
            )
        };
        let bit = 1 << s;
        for r in 0..8 {
            if r & bit == 0 {
                let (a, b) = (rows[r], rows[r | bit]);
                rows[r] = _mm512_permutex2var_epi32(a, a_order, b);
                rows[r | bit] = _mm512_permutex2var_epi32(a, b_order, b);
            }
        }
    }
}

/// `acc + Σ` of four byte products per dword, `u` unsigned and `c` signed: `vpdpbusd` with
/// VNNI, otherwise `vpmaddubsw` (pairs; weight bytes ≤ 127 and centroid bytes in
/// [−127, 127], so a pair's sum stays within 2·127·127 and nothing saturates), `vpmaddwd`
/// and an add. The same exact integers.
///
/// # Safety
/// AVX-512 F and BW must be available, and VNNI with `VNNI` (it is inlined into the kernels
/// that enable them).
#[inline(always)]
pub(super) unsafe fn dot_bytes<const VNNI: bool>(
    acc: __m512i,
    u: __m512i,
    c: __m512i,
    ones: __m512i,
) -> __m512i {
    // SAFETY: the features are available (the caller's contract).
    unsafe {
        if VNNI {
            _mm512_dpbusd_epi32(acc, u, c)
        } else {
            _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, c), ones))
        }
    }
}

/// What both value kernels do with sixteen coordinates' centroid bytes (`centroids`, two
/// coordinates per register as [`transpose`] takes them): transposed, then per head `h` the
/// weighted sums `Σ_t u_ht · e_tj` (one [`dot_bytes`] per four tokens) of the coordinates
/// `first .. first + valid`, added as `lane + scale_h·sum` (the loops' two roundings) to
/// `lanes[h·rows + first ..]`; the lanes past `valid` are neither read nor written.
///
/// # Safety
/// AVX-512 F and BW must be available, and VNNI with `VNNI` (it is inlined into the kernels
/// that enable them); `weights` and `scales` one entry per head.
#[inline(always)]
pub(super) unsafe fn add_head_sums<const VNNI: bool>(
    mut centroids: [__m512i; 8],
    (weights, scales): (&[[u8; BLOCK]], &[f32]),
    (rows, first, valid): (usize, usize, usize),
    lanes: &mut [f32],
) {
    debug_assert!(valid <= PASS);
    // SAFETY: the features are available (the caller's contract); each masked load and store
    // covers `valid` f32 from `at`, inside `lanes` (asserted).
    unsafe {
        transpose(&mut centroids);
        let ones = _mm512_set1_epi16(1);
        let mask: u16 = if valid == PASS {
            u16::MAX
        } else {
            (1 << valid) - 1
        };
        for (h, (u, &scale)) in weights.iter().zip(scales).enumerate() {
            let mut sums = _mm512_setzero_si512();
            for (g, c) in centroids.iter().enumerate() {
                let quad = u32::from_le_bytes([u[4 * g], u[4 * g + 1], u[4 * g + 2], u[4 * g + 3]]);
                sums = dot_bytes::<VNNI>(sums, _mm512_set1_epi32(quad as i32), *c, ones);
            }
            let at = h * rows + first;
            assert!(at + valid <= lanes.len());
            let ptr = lanes.as_mut_ptr().add(at);
            let add = _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(sums));
            let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, ptr), add);
            _mm512_mask_storeu_ps(ptr, mask, sum);
        }
    }
}

/// [`values_int::accumulate_block`](super::values_int::accumulate_block) on AVX-512; with
/// `vnni`, one `vpdpbusd` per four tokens.
///
/// # Safety
/// AVX-512 F, BW and AVX2 must be available, and AVX-512 VNNI with `vnni`; `rows` must be
/// even and `codes` hold its `⌈rows / m⌉` nibble lanes (16 bytes each), `weights` and
/// `scales` one entry per head, and `lanes` `heads · rows` values (asserted).
pub(super) unsafe fn accumulate_block_int_avx512(
    vnni: bool,
    codes: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    let heads = weights.len();
    assert!(rows.is_multiple_of(2) && codes.len() >= rows.div_ceil(tables.per) * LANE_BYTES);
    assert!(scales.len() == heads && lanes.len() >= heads * rows);
    let args = (codes, rows, tables, weights, scales, lanes);
    // SAFETY: the features are available, VNNI with `vnni` (the caller's contract); the
    // slices fit (asserted above).
    unsafe {
        match (tables.per, vnni) {
            (1, true) => block_vnni::<1>(args),
            (2, true) => block_vnni::<2>(args),
            (_, true) => block_vnni::<4>(args),
            (1, false) => block_plain::<1>(args),
            (2, false) => block_plain::<2>(args),
            (_, false) => block_plain::<4>(args),
        }
    }
}

/// The arguments of [`accumulate_block_int_avx512`] after `vnni`.
type Args<'a> = (
    &'a [u8],
    usize,
    &'a ValueTables,
    &'a [[u8; BLOCK]],
    &'a [f32],
    &'a mut [f32],
);

/// [`body`] compiled with AVX-512 VNNI.
///
/// # Safety
/// As [`accumulate_block_int_avx512`] with `vnni`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
unsafe fn block_vnni<const PER: usize>(args: Args<'_>) {
    // SAFETY: the features `body::<PER, true>` needs are enabled here.
    unsafe { body::<PER, true>(args) }
}

/// [`body`] without VNNI.
///
/// # Safety
/// As [`accumulate_block_int_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn block_plain<const PER: usize>(args: Args<'_>) {
    // SAFETY: the features `body::<PER, false>` needs are enabled here.
    unsafe { body::<PER, false>(args) }
}

/// [`accumulate_block_int_avx512`] for `PER` codes per nibble (`tables.per`).
///
/// # Safety
/// As [`accumulate_block_int_avx512`], whose assertions it relies on; it is inlined into
/// [`block_vnni`] and [`block_plain`], which enable the features.
#[inline(always)]
unsafe fn body<const PER: usize, const VNNI: bool>(
    (codes, rows, tables, weights, scales, lanes): Args<'_>,
) {
    debug_assert_eq!(PER, tables.per);
    // SAFETY: every intrinsic below needs only the features the callers enable; the loads
    // and stores stay within the slices (the comments at each).
    unsafe {
        let table = |i: usize| _mm_loadu_si128(tables.tables[i].as_ptr().cast());
        // Per pair `(x, x + 1)`, `x` even: coordinate `x`'s table in the low 256 bits,
        // `x + 1`'s in the high (the pair's positions in its nibble: `x mod m` and the next).
        let luts: [__m512i; 2] = std::array::from_fn(|half| {
            let (a, b) = if PER == 1 {
                (table(0), table(0))
            } else {
                (table(2 * half % PER), table((2 * half + 1) % PER))
            };
            _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(a), 0xFF00, b)
        });
        // The high nibbles (tokens 16–31) in the odd 128-bit lanes: 64-bit shifts by 4 there.
        let shifts = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
        let nibble = _mm512_set1_epi8(0x0F);
        // The 64 centroid bytes of coordinates `x` (low half) and `x + 1`.
        let pair = |x: usize| {
            let lane = |l: usize| {
                debug_assert!((l + 1) * LANE_BYTES <= codes.len());
                _mm_loadu_si128(codes.as_ptr().add(l * LANE_BYTES).cast())
            };
            // `x + 1 < rows`, so both lanes lie in `codes` (asserted by the caller).
            let both = if PER == 1 {
                _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(lane(x)), 0xFF00, lane(x + 1))
            } else {
                _mm512_broadcast_i32x4(lane(x / PER))
            };
            let n = _mm512_and_si512(_mm512_srlv_epi64(both, shifts), nibble);
            _mm512_shuffle_epi8(luts[(x % PER) / 2], n)
        };
        for pass in 0..rows.div_ceil(PASS) {
            let first = pass * PASS;
            let valid = (rows - first).min(PASS);
            let mut centroids = [_mm512_setzero_si512(); 8];
            for (r, c) in centroids.iter_mut().enumerate().take(valid / 2) {
                *c = pair(first + 2 * r);
            }
            add_head_sums::<VNNI>(centroids, (weights, scales), (rows, first, valid), lanes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::simd::Isa;

    /// Both forms (with and without VNNI, where the CPU has it) give the loop's bits for
    /// one, two and four codes per nibble, dimensions that end a pass early, and one to five
    /// heads.
    #[test]
    fn nibble_value_sums_match_the_loop_bit_for_bit() {
        if !Isa::Avx512.is_available() {
            return;
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for (bits, rows) in [
            (4u8, 64usize),
            (4, 6),
            (2, 64),
            (2, 18),
            (1, 64),
            (1, 40),
            (3, 30),
        ] {
            let centroids: Vec<f32> = (0..1 << bits)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let tables = ValueTables::new(&centroids, bits);
            let lanes_in = rows.div_ceil(tables.per);
            let codes: Vec<u8> = (0..lanes_in * LANE_BYTES).map(|_| next() as u8).collect();
            for heads in 1..=5 {
                let weights: Vec<[u8; BLOCK]> = (0..heads)
                    .map(|_| std::array::from_fn(|_| (next() % 128) as u8))
                    .collect();
                let scales: Vec<f32> = (0..heads).map(|h| 0.25 + h as f32 * 0.7).collect();
                let mut expected = vec![0.5f32; heads * rows];
                super::super::values_int::accumulate_block(
                    &codes,
                    rows,
                    &tables,
                    &weights,
                    &scales,
                    &mut expected,
                );
                let forms: &[bool] = if super::vnni() {
                    &[false, true]
                } else {
                    &[false]
                };
                for &vnni in forms {
                    let mut got = vec![0.5f32; heads * rows];
                    // SAFETY: AVX-512 F, BW and AVX2 were detected, VNNI where `vnni`; the
                    // slices have the sizes asserted.
                    unsafe {
                        accumulate_block_int_avx512(
                            vnni, &codes, rows, &tables, &weights, &scales, &mut got,
                        )
                    };
                    let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits_of(&got),
                        bits_of(&expected),
                        "{bits} bits, {rows} rows, {heads} heads, vnni {vnni}"
                    );
                }
            }
        }
    }

    /// The transpose's orders put coordinate `j`'s tokens `4g .. 4g + 4` in dword `j` of
    /// register `g`, from dword `8·(j mod 2) + g` of register `j / 2`.
    #[test]
    fn the_transpose_puts_each_coordinates_token_quads_in_place() {
        if !crate::attention::simd::Isa::Avx512.is_available() {
            return;
        }
        let mut rows = [[0u32; 16]; 8];
        for (r, row) in rows.iter_mut().enumerate() {
            for (k, x) in row.iter_mut().enumerate() {
                let (j, g) = (2 * r + k / 8, k % 8);
                *x = (j * 100 + g) as u32;
            }
        }
        // SAFETY: AVX-512 F was detected just above; each row holds 64 bytes.
        let out = unsafe {
            let mut regs = rows.map(|r| _mm512_loadu_si512(r.as_ptr().cast()));
            transpose(&mut regs);
            regs.map(|r| {
                let mut x = [0u32; 16];
                _mm512_storeu_si512(x.as_mut_ptr().cast(), r);
                x
            })
        };
        for (g, reg) in out.iter().enumerate() {
            for (j, &x) in reg.iter().enumerate() {
                assert_eq!(x, (j * 100 + g) as u32, "register {g}, dword {j}");
            }
        }
    }
}
