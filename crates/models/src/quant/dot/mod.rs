//! Dot products of one quantized weight row with an activation row.
//!
//! Three strategies, chosen per format:
//!
//! - **Q8 activations, integer sums** ([`dot_q8`]; Q4_0, Q4_1, Q5_0, Q8_0): the activation is
//!   quantized once per matvec to Q8 blocks ([`Q8Activation`](super::Q8Activation)), each
//!   block's products are summed exactly in integers, and the sums are combined in f32 in one
//!   of two fixed orders ([`Q8Order`]). This is what llama.cpp does (`vec_dot_q4_1_q8_1`,
//!   `vec_dot_q8_0_q8_0`, `vec_dot_q4_0_q8_0`, `vec_dot_q5_0_q8_0`); its AVX2 kernels'
//!   combination ([`Q8Order::LlamaCppAvx2`], [`scalar::combine`]) gives a forward pass the
//!   numerics of the engine behind the reference outputs. The default,
//!   [`Q8Order::BlockLanes`] ([`scalar::combine_block_lanes`]), makes one f32 term per block
//!   and sums the terms by block index mod 8, so a product of many tokens can keep tokens in
//!   the vector lanes: on AVX-512 VNNI (`x86_vnni`), sixteen tokens per instruction over
//!   activations regrouped once per product ([`Q8Panel`]) — about twice the prefill speed of
//!   the AVX2 tile kernel in llama.cpp's order (docs/results.md); on aarch64 with DotProd,
//!   four tokens per `sdot` (`neon_panel`). Either way the activation reads a quarter of the
//!   bytes an f32 activation would. For a given order, the VNNI, AVX2, NEON and scalar
//!   kernels produce the same integer sums and the same f32 result bit for bit. (Q5_0 has no
//!   NEON row kernel: on aarch64 its matrix–vector products run the scalar kernel, which gives
//!   the same bits; its matrix products take `sdot` like the others.)
//! - **Q8_K activations, integer sums** ([`dot_q8k`]; Q4_K, Q6_K): 256-value super-blocks,
//!   exact integer products scaled by the integer sub-block scales, combined in f32 in the
//!   order [`KQuantOrder`] selects (see `kquant`). The default [`KQuantOrder::BlockLanes`]
//!   makes one term per super-block, so products of many tokens run sixteen tokens per
//!   `vpdpbusd` on AVX-512 VNNI (`x86_vnni_kquant`, over activations regrouped once per
//!   product, [`Q8KPanel`]), eight per `vpmaddubsw` on AVX2 (`x86_panel_avx2_kquant`) and
//!   four per `sdot` on aarch64 with DotProd (`neon_panel`); it and [`KQuantOrder::VecDot`]
//!   have AVX2 row kernels (`x86_kquant`, bit-identical to the scalar ones); the llama.cpp x86
//!   orders are scalar (they serve parity runs, not speed).
//! - **f32 activations** ([`dot_f32`]; every format): dequantize a block, multiply by the f32
//!   activation. Used by the matvec for F32 and F16, and as the
//!   reference the integer path is tested against: the two differ by the activation's
//!   quantization error, `|Σ_j w_j (x_j − x̂_j)| ≤ Σ_j |w_j|·d_x/2` per block, plus rounding.

mod kquant;
mod panel;
mod panel_k;
pub(crate) mod scalar;
mod tile_buf;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_panel;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_kquant;
#[cfg(target_arch = "x86_64")]
mod x86_panel_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_panel_avx2_kquant;
#[cfg(target_arch = "x86_64")]
mod x86_vnni;
#[cfg(target_arch = "x86_64")]
mod x86_vnni_kquant;

use tq_cache::attention::simd::Isa;

use super::activation::Q8Row;
use super::activation_k::Q8KRow;
use super::error::QuantError;
use super::kind::QuantKind;
pub(crate) use kquant::Q8KKernel;
pub(crate) use panel::{GemmBufs, Q8Panel};
pub(crate) use panel_k::Q8KPanel;
pub(crate) use tile_buf::{TILE, TileBuf};

/// A row kernel of the integer path: `(weight row bytes, quantized activation row) → Σ`.
pub(crate) type Q8Kernel = fn(&[u8], &Q8Row<'_>) -> f32;

/// A tile kernel of the integer path: one weight row against up to [`TILE`] activation rows,
/// `out[a]` bit-identical to the row kernel on `acts[a]`; `buf` is its unpacking space.
pub(crate) type Q8TileKernel = fn(&[u8], &[Q8Row<'_>], &mut [f32], &mut TileBuf);

/// A multi-row kernel of the integer path: [`ROWS`] weight rows against one activation row,
/// each result bit-identical to the row kernel's.
pub(crate) type Q8RowsKernel = fn(&[&[u8]; ROWS], &Q8Row<'_>) -> [f32; ROWS];

/// Weight rows a multi-row kernel takes at once.
pub(crate) const ROWS: usize = 4;

/// A matrix-product kernel of the integer path: weight rows against every token of a
/// [`Q8Panel`] (`n` tokens), `out[r·n + i]` bit-identical to the row kernel of the same order
/// on row `r` and token `i`; `bufs` is its unpacking space.
pub(crate) type Q8GemmKernel = fn(&[&[u8]], &Q8Panel, usize, &mut [f32], &mut GemmBufs);

/// A matrix-product kernel of the K formats: weight rows against every token of a
/// [`Q8KPanel`], `out[r·n + i]` bit-identical to the block-lanes row kernel on row `r` and
/// token `i`.
pub(crate) type Q8KGemmKernel = fn(&[&[u8]], &Q8KPanel, usize, &mut [f32], &mut GemmBufs);

/// The summation order of the Q8 formats' products (Q4_0, Q4_1, Q5_0, Q8_0). Both compute the
/// same exact integer sums per block; they differ in how the f32 combination is grouped,
/// which moves results by a few ulps — enough to flip greedy decoding at near-ties, so parity
/// with the reference engine needs its order. Every instruction set gives the same bits for a
/// given order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Q8Order {
    /// One term per block, `d_w·d_x·isum` (Q4_1: `+ m_w·s_x` in the same FMA), summed in eight
    /// running sums by block index mod 8 (`combine_block_lanes` in `quant/dot/scalar.rs`). Products of
    /// several tokens keep tokens in the vector lanes (AVX-512 VNNI: sixteen per `vpdpbusd`),
    /// which llama.cpp's order, eight position lanes per block and token, does not allow.
    #[default]
    BlockLanes,
    /// llama.cpp's x86 AVX2 `ggml_vec_dot_*_q8_*` (`combine` in `quant/dot/scalar.rs`): eight lanes per block,
    /// one FMA per lane and block, the Q4_1 minimum in its own chain. For parity runs
    /// (`--kernel llamacpp`).
    LlamaCppAvx2,
}

/// The multi-row kernel for `kind` in `order` on `isa`, where one exists (AVX2); elsewhere a
/// matrix–vector product calls the row kernel per row.
pub(crate) fn q8_rows_kernel(kind: QuantKind, order: Q8Order, isa: Isa) -> Option<Q8RowsKernel> {
    match (kind, order, usable(isa)) {
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q8_0_rows),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_0_rows),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_1_rows),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q5_0_rows),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q8_0_rows_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_0_rows_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_1_rows_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q5_0_rows_bl),
        _ => None,
    }
}

/// The tile kernel for `kind` in `order` on `isa`, where one exists (AVX2); elsewhere products
/// of several activation rows call the row kernel per row.
pub(crate) fn q8_tile_kernel(kind: QuantKind, order: Q8Order, isa: Isa) -> Option<Q8TileKernel> {
    match (kind, order, usable(isa)) {
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q8_0_tile),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_0_tile),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_1_tile),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => Some(avx2::q5_0_tile),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q8_0_tile_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_0_tile_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q4_1_tile_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => Some(avx2::q5_0_tile_bl),
        _ => None,
    }
}

/// The matrix-product kernel for `kind` in `order` on `isa`, where one exists: the
/// block-lanes order on [`Isa::Avx512`] where the CPU also has VNNI (every format), on AVX2
/// otherwise (Q4_0, Q4_1, Q5_0: Q8_0's weights would saturate its 16-bit pair sums). Elsewhere
/// products of several activation rows take the tile or row kernels.
pub(crate) fn q8_gemm_kernel(kind: QuantKind, order: Q8Order, isa: Isa) -> Option<Q8GemmKernel> {
    if order != Q8Order::BlockLanes {
        return None;
    }
    #[cfg(target_arch = "aarch64")]
    if usable(isa) == Isa::Neon && dotprod_available() {
        return match kind {
            QuantKind::Q8_0 => Some(neon_gemm::q8_0),
            QuantKind::Q4_0 => Some(neon_gemm::q4_0),
            QuantKind::Q4_1 => Some(neon_gemm::q4_1),
            QuantKind::Q5_0 => Some(neon_gemm::q5_0),
            _ => None,
        };
    }
    let vnni = usable(isa) == Isa::Avx512 && vnni_available();
    match (kind, usable(isa), vnni) {
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, _, true) => Some(vnni::q8_0),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, _, true) => Some(vnni::q4_0),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, _, true) => Some(vnni::q4_1),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, _, true) => Some(vnni::q5_0),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Isa::Avx2 | Isa::Avx512, false) => Some(avx2_panel::q4_0),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Isa::Avx2 | Isa::Avx512, false) => Some(avx2_panel::q4_1),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Isa::Avx2 | Isa::Avx512, false) => Some(avx2_panel::q5_0),
        _ => None,
    }
}

/// Whether this CPU runs the NEON dot-product matrix products (Armv8.2 DotProd).
#[cfg(target_arch = "aarch64")]
fn dotprod_available() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// Whether this CPU runs the VNNI matrix products (AVX-512 F, BW and VNNI).
fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `isa` if this CPU runs it, otherwise scalar: an unavailable instruction set never reaches
/// its kernels.
pub(crate) fn usable(isa: Isa) -> Isa {
    if isa.is_available() { isa } else { Isa::Scalar }
}

/// The integer-path row kernel for `kind` in `order` on `isa` (scalar if `isa` is
/// unavailable), or `None` for formats without one.
pub(crate) fn q8_kernel(kind: QuantKind, order: Q8Order, isa: Isa) -> Option<Q8Kernel> {
    let isa = usable(isa);
    let kernel: Q8Kernel = match (kind, order, isa) {
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => avx2::q8_0,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => avx2::q4_0,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => avx2::q4_1,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Q8Order::LlamaCppAvx2, Isa::Avx2 | Isa::Avx512) => avx2::q5_0,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q8_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => avx2::q8_0_bl,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => avx2::q4_0_bl,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4_1, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => avx2::q4_1_bl,
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q5_0, Q8Order::BlockLanes, Isa::Avx2 | Isa::Avx512) => avx2::q5_0_bl,
        #[cfg(target_arch = "aarch64")]
        (QuantKind::Q8_0, Q8Order::LlamaCppAvx2, Isa::Neon) => neon_rows::q8_0,
        #[cfg(target_arch = "aarch64")]
        (QuantKind::Q4_0, Q8Order::LlamaCppAvx2, Isa::Neon) => neon_rows::q4_0,
        #[cfg(target_arch = "aarch64")]
        (QuantKind::Q4_1, Q8Order::LlamaCppAvx2, Isa::Neon) => neon_rows::q4_1,
        #[cfg(target_arch = "aarch64")]
        (QuantKind::Q8_0, Q8Order::BlockLanes, Isa::Neon) => neon_rows::q8_0_bl,
        #[cfg(target_arch = "aarch64")]
        (QuantKind::Q4_0, Q8Order::BlockLanes, Isa::Neon) => neon_rows::q4_0_bl,
        #[cfg(target_arch = "aarch64")]
        (QuantKind::Q4_1, Q8Order::BlockLanes, Isa::Neon) => neon_rows::q4_1_bl,
        (QuantKind::Q8_0, Q8Order::LlamaCppAvx2, _) => scalar::dot_q8_0,
        (QuantKind::Q4_0, Q8Order::LlamaCppAvx2, _) => scalar::dot_q4_0,
        (QuantKind::Q4_1, Q8Order::LlamaCppAvx2, _) => scalar::dot_q4_1,
        (QuantKind::Q5_0, Q8Order::LlamaCppAvx2, _) => scalar::dot_q5_0,
        (QuantKind::Q8_0, Q8Order::BlockLanes, _) => scalar::dot_q8_0_block_lanes,
        (QuantKind::Q4_0, Q8Order::BlockLanes, _) => scalar::dot_q4_0_block_lanes,
        (QuantKind::Q4_1, Q8Order::BlockLanes, _) => scalar::dot_q4_1_block_lanes,
        (QuantKind::Q5_0, Q8Order::BlockLanes, _) => scalar::dot_q5_0_block_lanes,
        _ => return None,
    };
    Some(kernel)
}

/// The summation order of the K formats' products. Every order computes the same exact
/// integer sums per block; they differ in how the f32 combination is grouped, which moves
/// results by a few ulps — enough to flip greedy decoding at near-ties, so parity with the
/// reference engine needs its order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KQuantOrder {
    /// One f32 term per super-block, `fma(d_w·d_x, I, −(dmin_w·d_x)·M)` (Q6_K: `(d_w·d_x)·I`)
    /// from its exact integers, summed in eight running sums by super-block index mod 8
    /// (`dot_q4k_block_lanes` / `dot_q6k_block_lanes` in `quant/dot/kquant.rs`), as
    /// [`Q8Order::BlockLanes`] does per Q8 block. Products of several tokens keep tokens in the
    /// vector lanes (AVX-512 VNNI: sixteen per `vpdpbusd`), which the per-row lanes of
    /// [`VecDot`](Self::VecDot) do not allow.
    #[default]
    BlockLanes,
    /// `ggml_vec_dot_q4_K_q8_K` / `ggml_vec_dot_q6_K_q8_K` (AVX2): eight lanes per row, for
    /// every batch size.
    VecDot,
    /// What llama.cpp's x86 CPU backend (the reference build) does, which depends on the batch:
    /// Q4_K weights are repacked into interleaved groups of eight rows and multiplied by
    /// `ggml_gemm_q4_K_8x8_q8_K` for the activation rows in whole groups of four and by
    /// `ggml_gemv_q4_K_8x8_q8_K` for the rest; Q6_K goes through its tiled K-quant matmul for
    /// batches of eight rows or more and through `ggml_vec_dot_q6_K_q8_K` below that.
    LlamaCppX86,
}

/// The Q8_K-activation kernel for `kind` (Q4_K, Q6_K) in `order`, for activation row `row` of
/// `rows` (the repacked order depends on it), on `isa` (scalar if unavailable), or `None` for
/// formats without one.
pub(crate) fn q8k_kernel(
    kind: QuantKind,
    order: KQuantOrder,
    row: usize,
    rows: usize,
    isa: Isa,
) -> Option<Q8KKernel> {
    let avx2 = matches!(usable(isa), Isa::Avx2 | Isa::Avx512);
    let vec_dot_q6k: Q8KKernel = match avx2 {
        #[cfg(target_arch = "x86_64")]
        true => avx2::q6k,
        _ => kquant::dot_q6k,
    };
    match (kind, order) {
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4K, KQuantOrder::BlockLanes) if avx2 => Some(avx2::q4k_bl),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q6K, KQuantOrder::BlockLanes) if avx2 => Some(avx2::q6k_bl),
        (QuantKind::Q4K, KQuantOrder::BlockLanes) => Some(kquant::dot_q4k_block_lanes),
        (QuantKind::Q6K, KQuantOrder::BlockLanes) => Some(kquant::dot_q6k_block_lanes),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4K, KQuantOrder::VecDot) if avx2 => Some(avx2::q4k),
        (QuantKind::Q4K, KQuantOrder::VecDot) => Some(kquant::dot_q4k),
        (QuantKind::Q4K, KQuantOrder::LlamaCppX86) if row < rows - rows % 4 => {
            Some(kquant::dot_q4k_repacked_gemm)
        }
        (QuantKind::Q4K, KQuantOrder::LlamaCppX86) => Some(kquant::dot_q4k_repacked_gemv),
        (QuantKind::Q6K, KQuantOrder::LlamaCppX86) if rows >= 8 => Some(kquant::dot_q6k_tiled),
        (QuantKind::Q6K, _) => Some(vec_dot_q6k),
        _ => None,
    }
}

/// The K formats' matrix-product kernel in `order` on `isa`, where one exists: the
/// block-lanes order on [`Isa::Avx512`] where the CPU also has VNNI, on AVX2 otherwise, on
/// NEON with DotProd. Elsewhere products of several activation rows take the row kernel per
/// token.
pub(crate) fn q8k_gemm_kernel(
    kind: QuantKind,
    order: KQuantOrder,
    isa: Isa,
) -> Option<Q8KGemmKernel> {
    if order != KQuantOrder::BlockLanes {
        return None;
    }
    #[cfg(target_arch = "aarch64")]
    if usable(isa) == Isa::Neon && dotprod_available() {
        return match kind {
            QuantKind::Q4K => Some(neon_gemm::q4k),
            QuantKind::Q6K => Some(neon_gemm::q6k),
            _ => None,
        };
    }
    let vnni = usable(isa) == Isa::Avx512 && vnni_available();
    match (kind, usable(isa), vnni) {
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4K, _, true) => Some(vnni::q4k),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q6K, _, true) => Some(vnni::q6k),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q4K, Isa::Avx2 | Isa::Avx512, false) => Some(avx2_panel::q4k),
        #[cfg(target_arch = "x86_64")]
        (QuantKind::Q6K, Isa::Avx2 | Isa::Avx512, false) => Some(avx2_panel::q6k),
        _ => None,
    }
}

/// Safe entry points to the AVX2 kernels, reachable only through [`q8_kernel`] and
/// [`q8_tile_kernel`], which hand them out only when [`Isa::Avx2`] or [`Isa::Avx512`] (a
/// superset: AVX-512 besides AVX2, FMA and F16C) is available. There is no separate AVX-512
/// kernel: the 256-bit integer kernels are what llama.cpp's numerics are defined by, and the
/// products are bound by memory (one row) or by the multiply ports (several rows), not width.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::x86::{self, Q4_0, Q4_1, Q5_0, Q8_0};
    use super::{Q8KRow, Q8Row, ROWS, TileBuf, x86_kquant};

    pub(super) fn q4k(row: &[u8], act: &Q8KRow<'_>) -> f32 {
        // SAFETY: as `q8_0`; `dot_q8k` and the matrix product check the row and activation
        // lengths before calling.
        unsafe { x86_kquant::dot_q4k::<false>(row, act) }
    }

    pub(super) fn q6k(row: &[u8], act: &Q8KRow<'_>) -> f32 {
        // SAFETY: as `q4k`.
        unsafe { x86_kquant::dot_q6k::<false>(row, act) }
    }

    pub(super) fn q4k_bl(row: &[u8], act: &Q8KRow<'_>) -> f32 {
        // SAFETY: as `q4k`.
        unsafe { x86_kquant::dot_q4k::<true>(row, act) }
    }

    pub(super) fn q6k_bl(row: &[u8], act: &Q8KRow<'_>) -> f32 {
        // SAFETY: as `q4k`.
        unsafe { x86_kquant::dot_q6k::<true>(row, act) }
    }

    pub(super) fn q8_0_rows(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows::<Q8_0, ROWS>(rows, act) }
    }

    pub(super) fn q4_0_rows(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows::<Q4_0, ROWS>(rows, act) }
    }

    pub(super) fn q4_1_rows(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows::<Q4_1, ROWS>(rows, act) }
    }

    pub(super) fn q5_0_rows(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows::<Q5_0, ROWS>(rows, act) }
    }

    pub(super) fn q8_0_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q8_0, 1>(&[row], act)[0] }
    }

    pub(super) fn q4_0_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q4_0, 1>(&[row], act)[0] }
    }

    pub(super) fn q4_1_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q4_1, 1>(&[row], act)[0] }
    }

    pub(super) fn q5_0_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q5_0, 1>(&[row], act)[0] }
    }

    pub(super) fn q8_0_rows_bl(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q8_0, ROWS>(rows, act) }
    }

    pub(super) fn q4_0_rows_bl(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q4_0, ROWS>(rows, act) }
    }

    pub(super) fn q4_1_rows_bl(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q4_1, ROWS>(rows, act) }
    }

    pub(super) fn q5_0_rows_bl(rows: &[&[u8]; ROWS], act: &Q8Row<'_>) -> [f32; ROWS] {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_rows_block_lanes::<Q5_0, ROWS>(rows, act) }
    }

    pub(super) fn q8_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: selected only after `Isa::Avx2` or `Isa::Avx512` was found available (both
        // detect AVX2, FMA and F16C at run time).
        unsafe { x86::dot::<Q8_0>(row, act) }
    }

    pub(super) fn q4_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot::<Q4_0>(row, act) }
    }

    pub(super) fn q4_1(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot::<Q4_1>(row, act) }
    }

    pub(super) fn q5_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot::<Q5_0>(row, act) }
    }

    pub(super) fn q5_0_tile(row: &[u8], acts: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile::<Q5_0>(row, acts, out, buf) }
    }

    pub(super) fn q8_0_tile(row: &[u8], acts: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile::<Q8_0>(row, acts, out, buf) }
    }

    pub(super) fn q4_0_tile(row: &[u8], acts: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile::<Q4_0>(row, acts, out, buf) }
    }

    pub(super) fn q4_1_tile(row: &[u8], acts: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile::<Q4_1>(row, acts, out, buf) }
    }

    pub(super) fn q8_0_tile_bl(row: &[u8], a: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile_block_lanes::<Q8_0>(row, a, out, buf) }
    }

    pub(super) fn q4_0_tile_bl(row: &[u8], a: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile_block_lanes::<Q4_0>(row, a, out, buf) }
    }

    pub(super) fn q4_1_tile_bl(row: &[u8], a: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile_block_lanes::<Q4_1>(row, a, out, buf) }
    }

    pub(super) fn q5_0_tile_bl(row: &[u8], a: &[Q8Row<'_>], out: &mut [f32], buf: &mut TileBuf) {
        // SAFETY: as `q8_0`.
        unsafe { x86::dot_tile_block_lanes::<Q5_0>(row, a, out, buf) }
    }
}

/// Safe entry points to the VNNI matrix products, reachable only through [`q8_gemm_kernel`]
/// and [`q8k_gemm_kernel`],
/// which hands them out only when AVX-512 F, BW and VNNI (and so AVX2, FMA, F16C: every CPU
/// with AVX-512 has them, and [`Isa::Avx512`] checks them) were found at run time.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::x86::{Q4_0, Q4_1, Q5_0, Q8_0};
    use super::x86_vnni_kquant::{Q4K, Q6K};
    use super::{GemmBufs, Q8KPanel, Q8Panel, x86_vnni, x86_vnni_kquant};

    pub(super) fn q4k(rows: &[&[u8]], p: &Q8KPanel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_vnni_kquant::gemm::<Q4K>(rows, p, n, out, b) }
    }

    pub(super) fn q6k(rows: &[&[u8]], p: &Q8KPanel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_vnni_kquant::gemm::<Q6K>(rows, p, n, out, b) }
    }

    pub(super) fn q8_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_vnni::gemm::<Q8_0>(rows, p, n, out, b) }
    }

    pub(super) fn q4_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_vnni::gemm::<Q4_0>(rows, p, n, out, b) }
    }

    pub(super) fn q4_1(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_vnni::gemm::<Q4_1>(rows, p, n, out, b) }
    }

    pub(super) fn q5_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_vnni::gemm::<Q5_0>(rows, p, n, out, b) }
    }
}

/// Safe entry points to the AVX2 matrix products, reachable only through [`q8_gemm_kernel`]
/// and [`q8k_gemm_kernel`], which hand them out only for [`Isa::Avx2`] or [`Isa::Avx512`]
/// found available (both detect AVX2, FMA and F16C at run time), and only for Q4_0, Q4_1,
/// Q5_0, Q4_K and Q6_K.
#[cfg(target_arch = "x86_64")]
mod avx2_panel {
    use super::x86::{Q4_0, Q4_1, Q5_0};
    use super::{GemmBufs, Q8KPanel, Q8Panel, x86_panel_avx2, x86_panel_avx2_kquant};

    pub(super) fn q4k(rows: &[&[u8]], p: &Q8KPanel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_panel_avx2_kquant::gemm::<false>(rows, p, n, out, b) }
    }

    pub(super) fn q6k(rows: &[&[u8]], p: &Q8KPanel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_panel_avx2_kquant::gemm::<true>(rows, p, n, out, b) }
    }

    pub(super) fn q4_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_panel_avx2::gemm::<Q4_0>(rows, p, n, out, b) }
    }

    pub(super) fn q4_1(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_panel_avx2::gemm::<Q4_1>(rows, p, n, out, b) }
    }

    pub(super) fn q5_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { x86_panel_avx2::gemm::<Q5_0>(rows, p, n, out, b) }
    }
}

/// Safe entry points to the NEON dot-product matrix products, reachable only through
/// [`q8_gemm_kernel`] and [`q8k_gemm_kernel`], which hand them out only where DotProd was
/// detected at run time.
#[cfg(target_arch = "aarch64")]
mod neon_gemm {
    use super::{GemmBufs, Q8KPanel, Q8Panel, QuantKind, neon_panel};

    pub(super) fn q8_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { neon_panel::gemm(QuantKind::Q8_0, rows, p, n, out, b) }
    }

    pub(super) fn q4_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { neon_panel::gemm(QuantKind::Q4_0, rows, p, n, out, b) }
    }

    pub(super) fn q4_1(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { neon_panel::gemm(QuantKind::Q4_1, rows, p, n, out, b) }
    }

    pub(super) fn q5_0(rows: &[&[u8]], p: &Q8Panel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { neon_panel::gemm(QuantKind::Q5_0, rows, p, n, out, b) }
    }

    pub(super) fn q4k(rows: &[&[u8]], p: &Q8KPanel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { neon_panel::gemm_k(false, rows, p, n, out, b) }
    }

    pub(super) fn q6k(rows: &[&[u8]], p: &Q8KPanel, n: usize, out: &mut [f32], b: &mut GemmBufs) {
        // SAFETY: see the module doc.
        unsafe { neon_panel::gemm_k(true, rows, p, n, out, b) }
    }
}

/// The NEON row kernels: NEON block sums in the scalar combination.
#[cfg(target_arch = "aarch64")]
mod neon_rows {
    use super::{Q8Row, neon, scalar};

    pub(super) fn q8_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
        scalar::combine::<34, false>(row, act, |w, y| {
            // SAFETY: NEON is part of every aarch64 target (its baseline ABI).
            unsafe { neon::lanes_q8_0(w, y) }
        })
    }

    pub(super) fn q4_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
        scalar::combine::<18, false>(row, act, |w, y| {
            // SAFETY: as `q8_0`.
            unsafe { neon::lanes_q4_0(w, y) }
        })
    }

    pub(super) fn q4_1(row: &[u8], act: &Q8Row<'_>) -> f32 {
        scalar::combine::<20, true>(row, act, |w, y| {
            // SAFETY: as `q8_0`.
            unsafe { neon::lanes_q4_1(w, y) }
        })
    }

    pub(super) fn q8_0_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        scalar::combine_block_lanes::<34, false>(row, act, |w, y| {
            // SAFETY: as `q8_0`.
            unsafe { neon::lanes_q8_0(w, y) }
        })
    }

    pub(super) fn q4_0_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        scalar::combine_block_lanes::<18, false>(row, act, |w, y| {
            // SAFETY: as `q8_0`.
            unsafe { neon::lanes_q4_0(w, y) }
        })
    }

    pub(super) fn q4_1_bl(row: &[u8], act: &Q8Row<'_>) -> f32 {
        scalar::combine_block_lanes::<20, true>(row, act, |w, y| {
            // SAFETY: as `q8_0`.
            unsafe { neon::lanes_q4_1(w, y) }
        })
    }
}

/// Checks that `row` holds exactly `cols` values of `kind`.
fn check_row(kind: QuantKind, row: &[u8], cols: usize) -> Result<(), QuantError> {
    let expected = kind.row_bytes(cols)?;
    if row.len() != expected {
        return Err(QuantError::ByteLength {
            what: "weight row",
            expected,
            actual: row.len(),
        });
    }
    Ok(())
}

/// `Σ_j w_j·x_j` with the row dequantized exactly and `x` in f32 (the reference strategy).
///
/// `row` must hold `x.len()` values of `kind` (a whole number of blocks). Products are
/// accumulated in eight lanes (`j mod 8`) summed in a fixed order: deterministic, and within
/// `(cols/8 + 3)·2⁻²⁴·Σ|w_j x_j|` of the exact sum.
pub fn dot_f32(kind: QuantKind, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    check_row(kind, row, x.len())?;
    Ok(scalar::dot_f32(kind, row, x))
}

/// `Σ_j w_j·x̂_j` of a K-format weight row (Q4_K, Q6_K) and a Q8_K-quantized activation row
/// `x̂`, in `order` for activation row `batch_row` of a product over `batch_rows` rows (the
/// llama.cpp x86 order depends on both), on `isa` (scalar if unavailable). Every order
/// computes the same exact integer sums per block; their f32 combinations differ by rounding
/// only. Every instruction set returns the same bits for a given order.
pub fn dot_q8k(
    kind: QuantKind,
    row: &[u8],
    act: &Q8KRow<'_>,
    order: KQuantOrder,
    batch_row: usize,
    batch_rows: usize,
    isa: Isa,
) -> Result<f32, QuantError> {
    let kernel =
        q8k_kernel(kind, order, batch_row, batch_rows, isa).ok_or(QuantError::NoQ8Dot { kind })?;
    check_row(kind, row, act.len())?;
    Ok(kernel(row, act))
}

/// `Σ_j w_j·x̂_j` of a weight row of `kind` (Q4_0, Q4_1, Q5_0 or Q8_0) and a Q8-quantized
/// activation row `x̂`, with exact integer block sums combined in f32 in `order`, on `isa`
/// (scalar if unavailable). Every instruction set returns the same bits for a given order.
pub fn dot_q8(
    kind: QuantKind,
    row: &[u8],
    act: &Q8Row<'_>,
    order: Q8Order,
    isa: Isa,
) -> Result<f32, QuantError> {
    let kernel = q8_kernel(kind, order, isa).ok_or(QuantError::NoQ8Dot { kind })?;
    check_row(kind, row, act.len())?;
    Ok(kernel(row, act))
}
