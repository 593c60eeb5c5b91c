//! Quantized weights: ggml block formats kept quantized in memory, dequantized exactly, and
//! multiplied by activations fast on the CPU.
//!
//! - [`QuantKind`]: F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K with ggml's block layouts and type
//!   ids; [`dequantize_row`] decodes any of them bit-exactly as ggml does
//!   ([`unpack_q4k_scales`] is the Q4_K scale/min unpacking).
//! - [`QuantMatrix`]: a `rows × cols` matrix over borrowed or owned bytes (raw bytes, a format
//!   and a shape: no dependency on the GGUF reader), with [`matvec`](QuantMatrix::matvec),
//!   [`matmul`](QuantMatrix::matmul) for a chunk of activation rows,
//!   [`matmul_each`](QuantMatrix::matmul_each) for several matrices over one input (quantized
//!   once: an attention block's q, k and v, an MLP's gate and up), and
//!   [`embedding_row`](QuantMatrix::embedding_row); [`MatvecScratch`] holds what they reuse.
//! - [`dot_q8`] / [`dot_q8k`] / [`dot_f32`]: the row kernels, public so they can be tested and
//!   compared.
//!
//! **Activation strategy.** Q4_0, Q4_1, Q5_0 and Q8_0 — the formats of the reference model (210
//! Q4_1 matrices; the Q8_0 token embedding, which is also the tied output head) and Gemma 3's
//! Q5_0 projections — quantize the
//! activation to Q8 blocks once per product ([`Q8Activation`], llama.cpp's `q8_0`/`q8_1`) and
//! take integer block dot products, as llama.cpp does: its numerics are what the reference
//! greedy continuations came from, the integer kernels do 32 multiply-adds per two
//! instructions, and the activation is read at a quarter of its f32 size. The K formats (Q4_K,
//! Q6_K: Gemma 3's output projections and MLP down projections) quantize the activation to
//! Q8_K super-blocks ([`Q8KActivation`], ggml's `quantize_row_q8_K_ref`) and sum exact integer
//! products per super-block ([`dot_q8k`]) in one of three f32 orders ([`KQuantOrder`]): by
//! default one term per super-block summed by super-block index mod 8 (the order a matrix
//! product with tokens in the vector lanes can keep: sixteen tokens per `vpdpbusd` on AVX-512
//! VNNI), the AVX2 `vec_dot` order, or the batch-dependent order of llama.cpp's current x86
//! backend (repacked Q4_K, tiled Q6_K), which greedy parity with the Gemma 3 reference needs. The f32
//! strategy (dequantize, multiply by f32 activations) serves F32 and F16 and is the reference
//! the integer paths are tested against (see [`dot_q8`] and [`dot_f32`] for the bounds).
//!
//! **Instruction sets.** AVX2+FMA+F16C (runtime-detected; also used under [`Isa::Avx512`]),
//! AVX-512 VNNI (the matrix products of several tokens, under [`Isa::Avx512`] where the CPU has
//! it) and NEON (aarch64; the matrix products with `sdot` where DotProd is detected) kernels
//! compute the integer path; the scalar kernels are the
//! reference and the fallback. All of them produce the same bits for a given [`Q8Order`]: each
//! block's products are exact integers, and the f32 combination is fixed — by default one term
//! `d_w·d_x·isum` per block (Q4_1: with `m_w·s_x` in one FMA) summed in eight running sums by
//! block index; with [`Q8Order::LlamaCppAvx2`] per block `acc[l] = fma(d_w·d_x, lane_l,
//! acc[l])`, the Q4_1 minimum term in one FMA chain, then a fixed horizontal order, exactly
//! that of llama.cpp's x86 AVX2 `ggml_vec_dot_*` kernels, so a row product equals llama.cpp's
//! bit for bit given the same quantized activation. The
//! instruction set is [`Isa`] (shared with `tq-cache`, so `TQ_SIMD=scalar|avx2|avx512|neon`
//! selects it process-wide). The scalar path's FMAs are software calls on x86 CPUs without
//! FMA, so it is slow there; it exists as the reference.
//!
//! **Determinism.** Output rows are split over the current rayon pool; every output value is
//! computed by a single kernel call, so results never depend on the thread count.
//!
//! Dependencies: `half` for f16 block scales (exact conversion both ways, round-to-nearest-even
//! like F16C) and `rayon` for the row-parallel products.

mod activation;
mod activation_k;
mod dequant;
mod dot;
mod error;
mod kind;
mod matrix;

pub use activation::{Q8_BLOCK, Q8Activation, Q8Row};
pub use activation_k::{Q8KActivation, Q8KRow, QK_K};
pub use dequant::{dequantize_row, unpack_q4k_scales};
pub use dot::{KQuantOrder, Q8Order, dot_f32, dot_q8, dot_q8k};
pub use error::QuantError;
pub use kind::QuantKind;
pub use matrix::{MatvecScratch, QuantMatrix};
pub use tq_cache::attention::simd::Isa;
