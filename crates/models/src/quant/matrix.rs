//! A quantized weight matrix and its matrix–vector products.

use rayon::prelude::*;
use tq_cache::attention::simd::Isa;

use super::activation::{Q8Activation, Q8Row, check_finite};
use super::activation_k::{Q8KActivation, Q8KRow};
use super::dequant::dequantize_unchecked;
use super::dot::{
    GemmBufs, KQuantOrder, Q8GemmKernel, Q8KGemmKernel, Q8KKernel, Q8KPanel, Q8Kernel, Q8Order,
    Q8Panel, Q8RowsKernel, Q8TileKernel, ROWS, TILE, TileBuf, q8_gemm_kernel, q8_kernel,
    q8_rows_kernel, q8_tile_kernel, q8k_gemm_kernel, q8k_kernel, scalar, usable,
};
use super::error::QuantError;
use super::kind::QuantKind;

/// About the weight bytes of one parallel task (`task_rows` evens the tasks out): large
/// enough to amortize scheduling, small enough to balance a 576-row matrix over a few cores.
const TASK_BYTES: usize = 32 * 1024;

/// A `rows × cols` weight matrix in a ggml format, row-major: row `r` is bytes
/// `r·row_bytes .. (r+1)·row_bytes`, exactly as a GGUF tensor of shape `[cols, rows]` stores it
/// (GGUF lists the contiguous dimension first).
///
/// The bytes are any `B: AsRef<[u8]>`: a `Vec<u8>` (tests), a borrowed `&[u8]`, or a cheap
/// handle into a memory-mapped model file (an `Arc` of the map plus a byte range, implementing
/// `AsRef<[u8]>`), so weights are never copied and the model struct needs no lifetime tied to
/// the map. A generic, rather than a fixed `&'a [u8]` or `Arc<[u8]>`, leaves that choice to the
/// loader: an `Arc<[u8]>` cannot point into a map without copying, and a lifetime would make
/// the model borrow from its own file handle.
#[derive(Clone, Debug)]
pub struct QuantMatrix<B = Vec<u8>> {
    kind: QuantKind,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: B,
}

/// Reusable buffers of [`QuantMatrix::matvec`] / [`QuantMatrix::matmul`], and the instruction
/// set they run on. After the first call of a given shape, calls allocate nothing.
#[derive(Clone, Debug)]
pub struct MatvecScratch {
    isa: Isa,
    act: Q8Activation,
    act_k: Q8KActivation,
    /// The Q8 activation rows regrouped for the matrix-product kernels (built when one runs).
    panel: Q8Panel,
    /// The Q8_K activation rows regrouped for the K formats' matrix-product kernels.
    panel_k: Q8KPanel,
    k_order: KQuantOrder,
    q8_order: Q8Order,
    out: Vec<f32>,
}

impl Default for MatvecScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl MatvecScratch {
    /// Scratch running on [`Isa::detect`] (the best available, or `TQ_SIMD`).
    pub fn new() -> Self {
        Self::with_isa(Isa::detect())
    }

    /// Scratch running on `isa`, or scalar if this CPU lacks it.
    pub fn with_isa(isa: Isa) -> Self {
        Self {
            isa: usable(isa),
            act: Q8Activation::new(),
            act_k: Q8KActivation::new(),
            panel: Q8Panel::default(),
            panel_k: Q8KPanel::default(),
            k_order: KQuantOrder::default(),
            q8_order: Q8Order::default(),
            out: Vec::new(),
        }
    }

    /// Sums the K formats' products in `order` (see [`KQuantOrder`]).
    pub fn set_k_order(&mut self, order: KQuantOrder) {
        self.k_order = order;
    }

    /// Sums the Q8 formats' products in `order` (see [`Q8Order`]).
    pub fn set_q8_order(&mut self, order: Q8Order) {
        self.q8_order = order;
    }

    /// The Q8 formats' summation order.
    pub fn q8_order(&self) -> Q8Order {
        self.q8_order
    }

    /// The instruction set the products run on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Bytes the buffers hold (their capacities).
    pub fn allocated_bytes(&self) -> usize {
        self.act.allocated_bytes()
            + self.act_k.allocated_bytes()
            + self.panel.allocated_bytes()
            + self.panel_k.allocated_bytes()
            + 4 * self.out.capacity()
    }

    /// The activation rows the last integer-path product quantized.
    pub fn activation(&self) -> &Q8Activation {
        &self.act
    }
}

impl<B: AsRef<[u8]>> QuantMatrix<B> {
    /// A matrix over `bytes`, which must hold exactly `rows` rows of `cols` values of `kind`
    /// (`cols` a multiple of the block size).
    pub fn new(kind: QuantKind, rows: usize, cols: usize, bytes: B) -> Result<Self, QuantError> {
        let row_bytes = kind.row_bytes(cols)?;
        let expected = rows
            .checked_mul(row_bytes)
            .ok_or(QuantError::SizeOverflow { kind, rows, cols })?;
        let actual = bytes.as_ref().len();
        if actual != expected {
            return Err(QuantError::ByteLength {
                what: "matrix",
                expected,
                actual,
            });
        }
        Ok(Self {
            kind,
            rows,
            cols,
            row_bytes,
            bytes,
        })
    }

    /// The storage format.
    pub fn kind(&self) -> QuantKind {
        self.kind
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (values per row).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The storage.
    pub fn storage(&self) -> &B {
        &self.bytes
    }

    /// The raw bytes, checked again against the shape (an `AsRef` is not bound to return the
    /// same slice every time).
    fn data(&self) -> Result<&[u8], QuantError> {
        let data = self.bytes.as_ref();
        let expected = self.rows * self.row_bytes;
        if data.len() != expected {
            return Err(QuantError::ByteLength {
                what: "matrix",
                expected,
                actual: data.len(),
            });
        }
        Ok(data)
    }

    /// The bytes of row `index`.
    pub fn row(&self, index: usize) -> Result<&[u8], QuantError> {
        if index >= self.rows {
            return Err(QuantError::RowOutOfRange {
                index,
                rows: self.rows,
            });
        }
        let rb = self.row_bytes;
        Ok(&self.data()?[index * rb..(index + 1) * rb])
    }

    /// Dequantizes row `index` into `out` (`cols` values): a token embedding lookup.
    pub fn embedding_row(&self, index: usize, out: &mut [f32]) -> Result<(), QuantError> {
        let row = self.row(index)?;
        check_len("embedding output", self.cols, out.len())?;
        dequantize_unchecked(self.kind, row, out);
        Ok(())
    }

    /// Rows per parallel task: tasks of about [`TASK_BYTES`] of weights, their count a
    /// multiple of the current pool's threads and their rows equal (up to the last task) and a
    /// multiple of the multi-row kernel's [`ROWS`] so no task ends in single rows; the whole
    /// matrix in one task on one thread. (Tasks of a fixed size split a 576-row matrix 4 : 3
    /// over two threads, and the thread with more waited on at every product.) The split moves
    /// no bits: every row is computed by the same operations whichever task holds it.
    fn task_rows(&self) -> usize {
        let threads = rayon::current_num_threads().max(1);
        if threads == 1 {
            return self.rows.max(1);
        }
        let tasks = (self.rows * self.row_bytes)
            .div_ceil(TASK_BYTES)
            .max(1)
            .next_multiple_of(threads);
        self.rows.div_ceil(tasks).max(1).next_multiple_of(ROWS)
    }
}

impl<B: AsRef<[u8]> + Sync> QuantMatrix<B> {
    /// `y = W·x`: `x` has `cols` values, `y` gets `rows`.
    ///
    /// Q4_0, Q4_1, Q5_0 and Q8_0 quantize `x` to Q8 blocks once (into `scratch`) and take
    /// integer dot products on `scratch.isa()`, summed in `scratch.q8_order()`; Q4_K and Q6_K
    /// quantize it to Q8_K super-blocks and sum in the scratch's [`KQuantOrder`]; F32 and F16
    /// multiply dequantized weights by `x` in f32 (scalar). Output rows are split over the
    /// current rayon pool in equal tasks, a multiple of its threads, and each `y[r]` is
    /// computed by the same operations in the same order whichever kernel variant (one row,
    /// several rows, several activations) and thread computes it, so the result is the same
    /// bits whatever the number of threads.
    /// `x` must be finite.
    pub fn matvec(
        &self,
        x: &[f32],
        y: &mut [f32],
        scratch: &mut MatvecScratch,
    ) -> Result<(), QuantError> {
        self.matmul(x, 1, y, scratch)
    }

    /// `Y = X·Wᵀ` for `n` activation rows at once: `x` is `[n, cols]` row-major, `y` gets
    /// `[n, rows]`. Row `i` of `y` is bit-identical to `matvec` of row `i` of `x`; the
    /// activations are quantized once. In the default orders ([`Q8Order`], [`KQuantOrder`]) on
    /// AVX2, AVX-512 VNNI or NEON with DotProd the activations are also regrouped sixteen
    /// tokens at a time and every weight row is read and unpacked once per product (tokens in
    /// the vector lanes); otherwise once per eight activation rows (a tile) or per row. For
    /// `n > 1` the scratch holds an `n × rows` buffer (results are gathered per weight row,
    /// then transposed into `y`).
    pub fn matmul(
        &self,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        scratch: &mut MatvecScratch,
    ) -> Result<(), QuantError> {
        self.matmul_prepared(x, n, y, scratch, None).map(|_| ())
    }

    /// `Y_k = X·W_kᵀ` for several matrices over the same input `x` (an attention block's q, k
    /// and v; an MLP's gate and up): each `products[k].1` gets what
    /// [`matmul`](Self::matmul) of `products[k].0` gives, bit for bit, but `x` is quantized
    /// once per activation form the matrices read (the Q8 blocks of Q4_0, Q4_1, Q5_0 and
    /// Q8_0 are one form; each K-format grouping another) instead of once per matrix.
    ///
    /// ```
    /// use tq_models::quant::{MatvecScratch, QuantKind, QuantMatrix};
    ///
    /// // Two 1×32 Q8_0 matrices (scale 1.0 as f16, then 32 values).
    /// let row = |v: i8| [&[0x00u8, 0x3c][..], &[v as u8; 32][..]].concat();
    /// let (a, b) = (
    ///     QuantMatrix::new(QuantKind::Q8_0, 1, 32, row(1))?,
    ///     QuantMatrix::new(QuantKind::Q8_0, 1, 32, row(2))?,
    /// );
    /// // 127 quantizes exactly (scale 1.0), so the integer products are the exact sums.
    /// let x = [127.0f32; 32];
    /// let (mut ya, mut yb) = ([0.0f32], [0.0f32]);
    /// let mut scratch = MatvecScratch::new();
    /// QuantMatrix::matmul_each(&x, 1, &mut [(&a, &mut ya[..]), (&b, &mut yb[..])], &mut scratch)?;
    /// assert_eq!((ya[0], yb[0]), (32.0 * 127.0, 64.0 * 127.0));
    /// # Ok::<(), tq_models::quant::QuantError>(())
    /// ```
    pub fn matmul_each(
        x: &[f32],
        n: usize,
        products: &mut [(&Self, &mut [f32])],
        scratch: &mut MatvecScratch,
    ) -> Result<(), QuantError> {
        let mut prepared = None;
        for (matrix, y) in products.iter_mut() {
            prepared = Some(matrix.matmul_prepared(x, n, y, scratch, prepared)?);
        }
        Ok(())
    }

    /// The activation form a product of `n` rows with this matrix reads, given whether it has
    /// a Q8 kernel (`q8`) or a Q8_K kernel (`q8k`) and the K formats' summation order.
    fn activation_form(
        &self,
        n: usize,
        q8: bool,
        q8k: bool,
        k_order: KQuantOrder,
    ) -> ActivationForm {
        match (q8, q8k) {
            (true, _) => ActivationForm::Q8 { panel: false },
            // The repacked Q4_K kernels read rows in whole groups of four, quantized by their
            // own routine (see `Q8KActivation::quantize_grouped`).
            (false, true) => ActivationForm::Q8K {
                grouped: match (self.kind, k_order) {
                    (QuantKind::Q4K, KQuantOrder::LlamaCppX86) => n - n % 4,
                    _ => 0,
                },
                panel: false,
            },
            (false, false) => ActivationForm::F32,
        }
    }

    /// [`matmul`](Self::matmul), where `prepared` says the form in which `scratch` already
    /// holds `x` (quantized by the previous product of [`matmul_each`](Self::matmul_each));
    /// returns the form this product read.
    fn matmul_prepared(
        &self,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        scratch: &mut MatvecScratch,
        prepared: Option<ActivationForm>,
    ) -> Result<ActivationForm, QuantError> {
        let overflow = QuantError::SizeOverflow {
            kind: self.kind,
            rows: n,
            cols: self.cols.max(self.rows),
        };
        let x_len = n.checked_mul(self.cols).ok_or(overflow.clone())?;
        let y_len = n.checked_mul(self.rows).ok_or(overflow)?;
        check_len("matmul input", x_len, x.len())?;
        check_len("matmul output", y_len, y.len())?;
        let data = self.data()?;
        let kernel = q8_kernel(self.kind, scratch.q8_order, scratch.isa);
        let gemm = match n {
            2.. => q8_gemm_kernel(self.kind, scratch.q8_order, scratch.isa),
            _ => None,
        };
        let kernel_k = q8k_kernel(self.kind, scratch.k_order, 0, n, scratch.isa);
        let gemm_k = match n {
            2.. => q8k_gemm_kernel(self.kind, scratch.k_order, scratch.isa),
            _ => None,
        };
        let mut form =
            self.activation_form(n, kernel.is_some(), kernel_k.is_some(), scratch.k_order);
        match (form, prepared) {
            // Quantized by the previous product; regrouped too if that one needed it.
            (ActivationForm::Q8 { .. }, Some(ActivationForm::Q8 { panel })) => {
                form = ActivationForm::Q8 { panel };
            }
            (ActivationForm::Q8 { .. }, _) => scratch.act.quantize(x, n, self.cols)?,
            (
                ActivationForm::Q8K { grouped, .. },
                Some(ActivationForm::Q8K { grouped: g, panel }),
            ) if g == grouped => {
                form = ActivationForm::Q8K { grouped, panel };
            }
            (ActivationForm::Q8K { grouped, .. }, _) => {
                scratch.act_k.quantize_grouped(x, n, self.cols, grouped)?
            }
            (ActivationForm::F32, _) if prepared != Some(form) => check_finite(x)?,
            _ => {}
        }
        if gemm.is_some() && form == (ActivationForm::Q8 { panel: false }) {
            scratch.panel.build(&scratch.act);
            form = ActivationForm::Q8 { panel: true };
        }
        if let (
            Some(_),
            ActivationForm::Q8K {
                grouped,
                panel: false,
            },
        ) = (gemm_k, form)
        {
            scratch.panel_k.build(&scratch.act_k);
            form = ActivationForm::Q8K {
                grouped,
                panel: true,
            };
        }
        if n == 0 || self.rows == 0 {
            return Ok(form);
        }
        if self.cols == 0 {
            y.fill(0.0);
            return Ok(form);
        }
        let rows = Rows {
            data,
            row_bytes: self.row_bytes,
            task_rows: self.task_rows(),
        };
        let dot = RowDot {
            kind: self.kind,
            kernel,
            gemm,
            gemm_k,
            tile: q8_tile_kernel(self.kind, scratch.q8_order, scratch.isa),
            rows: q8_rows_kernel(self.kind, scratch.q8_order, scratch.isa),
            kernel_k,
            k_order: scratch.k_order,
            isa: scratch.isa,
            act: &scratch.act,
            panel: &scratch.panel,
            panel_k: &scratch.panel_k,
            act_k: &scratch.act_k,
            x,
            cols: self.cols,
        };
        if n == 1 {
            rows.for_each_chunk(y, 1, &dot);
            return Ok(form);
        }
        // Each task writes its rows' outputs for all n activations contiguously (`out[r·n + i]`),
        // then one pass transposes into `y[i·rows + r]`.
        let out = &mut scratch.out;
        out.clear();
        out.resize(y_len, 0.0);
        rows.for_each_chunk(out, n, &dot);
        transpose_into(out, self.rows, n, y);
        Ok(form)
    }
}

/// The form in which a product reads its activation rows (what [`QuantMatrix::matmul`]
/// prepares in the scratch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActivationForm {
    /// Q8 blocks of 32 ([`Q8Activation`]): Q4_0, Q4_1, Q5_0 and Q8_0; `panel`: also
    /// regrouped token-parallel ([`Q8Panel`]) for the matrix-product kernels.
    Q8 { panel: bool },
    /// Q8_K super-blocks ([`Q8KActivation`]), the first `grouped` rows quantized in groups
    /// of four: Q4_K and Q6_K; `panel`: also regrouped token-parallel ([`Q8KPanel`]).
    Q8K { grouped: usize, panel: bool },
    /// The f32 rows themselves (checked finite): F32 and F16.
    F32,
}

/// The rows of a matrix, split into tasks of `task_rows` rows.
struct Rows<'a> {
    data: &'a [u8],
    row_bytes: usize,
    task_rows: usize,
}

impl Rows<'_> {
    /// For every row `r`: `out[r·n .. (r+1)·n]` = row `r` against the `n` activation rows,
    /// rows in parallel over the current rayon pool (serially when there is a single task).
    fn for_each_chunk(&self, out: &mut [f32], n: usize, dot: &RowDot<'_>) {
        let run = |w: &[u8], o: &mut [f32]| dot.eval_chunk(w, self.row_bytes, o, n);
        let (w_task, o_task) = (self.task_rows * self.row_bytes, self.task_rows * n);
        if self.data.len() <= w_task {
            run(self.data, out);
        } else {
            self.data
                .par_chunks(w_task)
                .zip(out.par_chunks_mut(o_task))
                .for_each(|(w, o)| run(w, o));
        }
    }
}

/// One weight row times the activation rows, by the strategy of the format.
struct RowDot<'a> {
    kind: QuantKind,
    kernel: Option<Q8Kernel>,
    gemm: Option<Q8GemmKernel>,
    gemm_k: Option<Q8KGemmKernel>,
    tile: Option<Q8TileKernel>,
    rows: Option<Q8RowsKernel>,
    kernel_k: Option<Q8KKernel>,
    k_order: KQuantOrder,
    isa: Isa,
    act: &'a Q8Activation,
    panel: &'a Q8Panel,
    panel_k: &'a Q8KPanel,
    act_k: &'a Q8KActivation,
    x: &'a [f32],
    cols: usize,
}

impl RowDot<'_> {
    /// `out[r·n + i]` = row `r` of `w` (rows of `rb` bytes) against activation row `i`.
    fn eval_chunk(&self, w: &[u8], rb: usize, out: &mut [f32], n: usize) {
        if let (Some(gemm), 2..) = (self.gemm, n) {
            // Several activations, tokens in the vector lanes: every row of the task against
            // the whole panel.
            let rows: Vec<&[u8]> = w.chunks_exact(rb).collect();
            gemm(&rows, self.panel, n, out, &mut GemmBufs::default());
            return;
        }
        if let (Some(gemm_k), 2..) = (self.gemm_k, n) {
            let rows: Vec<&[u8]> = w.chunks_exact(rb).collect();
            gemm_k(&rows, self.panel_k, n, out, &mut GemmBufs::default());
            return;
        }
        let (mut w, mut out) = (w, out);
        if let (Some(rows), 1) = (self.rows, n) {
            // One activation: ROWS weight rows at a time, the rest one by one.
            let act = self.act.row_unchecked(0);
            let mut ws = w.chunks_exact(ROWS * rb);
            let mut os = out.chunks_exact_mut(ROWS);
            for (wc, oc) in (&mut ws).zip(&mut os) {
                let group: [&[u8]; ROWS] = core::array::from_fn(|r| &wc[r * rb..(r + 1) * rb]);
                oc.copy_from_slice(&rows(&group, &act));
            }
            (w, out) = (ws.remainder(), os.into_remainder());
        }
        // Products of several activation rows: their views (and for the K formats their
        // kernels) made once per task rather than once per weight row. A matrix-vector product
        // allocates nothing (the decode step must not): its one row is read in `eval_row`.
        let acts: Vec<_> = match (self.kernel_k, self.kernel) {
            (None, Some(_)) if n > 1 => (0..n).map(|i| self.act.row_unchecked(i)).collect(),
            _ => Vec::new(),
        };
        let acts_k: Vec<_> = match self.kernel_k {
            Some(first) if n > 1 => (0..n)
                .map(|i| {
                    // Only the llama.cpp order picks its kernel by batch position.
                    let kernel = match self.k_order {
                        KQuantOrder::BlockLanes | KQuantOrder::VecDot => Some(first),
                        KQuantOrder::LlamaCppX86 => {
                            q8k_kernel(self.kind, self.k_order, i, n, self.isa)
                        }
                    };
                    (kernel, self.act_k.row_unchecked(i))
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut buf = None;
        for (w, o) in w.chunks_exact(rb).zip(out.chunks_exact_mut(n)) {
            self.eval_row(w, o, &acts, &acts_k, &mut buf);
        }
    }

    /// `out[i]` = weight row `w` against activation row `i`, for `i < out.len()`; `acts` and
    /// `acts_k` are the activation rows' views when the row's path reads them.
    fn eval_row(
        &self,
        w: &[u8],
        out: &mut [f32],
        acts: &[Q8Row<'_>],
        acts_k: &[(Option<Q8KKernel>, Q8KRow<'_>)],
        buf: &mut Option<TileBuf>,
    ) {
        if let Some(first) = self.kernel_k {
            if let [o] = out {
                // Batch position 0 of 1: every order's kernel is `first` there.
                *o = first(w, &self.act_k.row_unchecked(0));
            }
            for (o, (kernel, act)) in out.iter_mut().zip(acts_k) {
                if let Some(kernel) = kernel {
                    *o = kernel(w, act);
                }
            }
            return;
        }
        match (self.tile, self.kernel) {
            (Some(tile), _) if out.len() > 1 => {
                let buf = buf.get_or_insert_with(TileBuf::new);
                for (out, acts) in out.chunks_mut(TILE).zip(acts.chunks(TILE)) {
                    tile(w, acts, out, buf);
                }
            }
            (_, Some(kernel)) => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = kernel(w, &self.act.row_unchecked(i));
                }
            }
            (_, None) => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = scalar::dot_f32(self.kind, w, &self.x[i * self.cols..(i + 1) * self.cols]);
                }
            }
        }
    }
}

/// Token rows per task of [`transpose_into`]: each task reads 64 contiguous bytes of every
/// weight row's outputs and writes its token rows whole.
const TRANSPOSE_TOKENS: usize = 16;

/// `y[i·rows + r] = out[r·n + i]`: the products, computed weight row by weight row, into the
/// token-major layout callers use. In parallel over blocks of token rows: done on one thread
/// it was 5–8% of a prefill (the strided writes miss the cache), all of it serial.
fn transpose_into(out: &[f32], rows: usize, n: usize, y: &mut [f32]) {
    y.par_chunks_mut(TRANSPOSE_TOKENS * rows)
        .enumerate()
        .for_each(|(block, ys)| {
            let i0 = block * TRANSPOSE_TOKENS;
            let count = ys.len() / rows;
            for (r, outs) in out.chunks_exact(n).enumerate() {
                for (k, &v) in outs[i0..i0 + count].iter().enumerate() {
                    ys[k * rows + r] = v;
                }
            }
        });
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), QuantError> {
    if expected != actual {
        return Err(QuantError::ShapeMismatch {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}
