//! Tensor types (the ggml type ids), their block layouts, tensor descriptions and views of their
//! bytes.

use std::fmt;

/// The most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;

/// A ggml tensor type, with the id the format stores.
///
/// Every type a current GGUF file may carry is known by name; ids that were removed from the
/// format (4, 5, 31–33, 36–38) are unknown. Only the types with a [`BlockLayout`] can have their
/// data delimited and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(non_camel_case_types, missing_docs)] // The names are ggml's own.
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
}

/// How a type packs elements: `block_size` consecutive elements of a row take `bytes_per_block`
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    /// Elements per block.
    pub block_size: u64,
    /// Bytes per block.
    pub bytes_per_block: u64,
}

impl GgmlType {
    /// The type for a format id, `None` for ids no current ggml defines.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// The format id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The block layout for the supported types (F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K),
    /// `None` for the others.
    ///
    /// The byte counts are ggml's block structs: Q4_0 = f16 scale + 16 bytes of nibbles; Q4_1
    /// adds an f16 minimum; Q5_0 = f16 scale + 4 bytes of fifth bits + 16 bytes of nibbles; Q8_0 = f16 scale + 32 signed bytes; Q4_K = two f16 super-scales,
    /// 12 bytes of 6-bit scales and 128 bytes of nibbles per 256; Q6_K = 128 bytes of low nibbles,
    /// 64 of high bits, 16 i8 scales and an f16 super-scale per 256.
    ///
    /// ```
    /// use tq_models::gguf::{BlockLayout, GgmlType};
    /// assert_eq!(
    ///     GgmlType::Q4_1.layout(),
    ///     Some(BlockLayout { block_size: 32, bytes_per_block: 20 })
    /// );
    /// assert_eq!(GgmlType::IQ2_XXS.layout(), None);
    /// ```
    pub fn layout(self) -> Option<BlockLayout> {
        let (block_size, bytes_per_block) = match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q6_K => (256, 210),
            _ => return None,
        };
        Some(BlockLayout {
            block_size,
            bytes_per_block,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The Debug names are ggml's names.
        fmt::Debug::fmt(self, f)
    }
}

/// The description of one tensor in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// The dimensions, innermost (contiguous) first, as ggml orders them: a matrix of `rows`
    /// rows of `cols` elements is `[cols, rows]`.
    pub dims: Vec<u64>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// The offset of the data from the start of the data section (a multiple of the alignment).
    pub offset: u64,
}

impl TensorInfo {
    /// The number of elements (the product of the dimensions; 1 for a zero-dimensional tensor).
    /// Overflow was ruled out when the file was parsed.
    pub fn element_count(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The size of the data in bytes, `None` when the type's layout is not supported.
    pub fn byte_size(&self) -> Option<u64> {
        let layout = self.ggml_type.layout()?;
        // Parsing checked that the element count is a whole number of blocks and that this
        // product fits in the file.
        Some(self.element_count() / layout.block_size * layout.bytes_per_block)
    }
}

/// The bytes of one tensor, borrowed from the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The tensor's description.
    pub info: &'a TensorInfo,
    /// Exactly [`TensorInfo::byte_size`] bytes, in the type's block format.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// The tensor name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The dimensions, innermost first.
    pub fn dims(&self) -> &[u64] {
        &self.info.dims
    }

    /// The element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.info.ggml_type
    }
}
