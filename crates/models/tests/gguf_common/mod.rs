//! Builds GGUF files byte by byte for the tests, independently of the reader: every field is
//! written with `to_le_bytes` in the order the format specifies.

#![allow(dead_code)] // Each test crate uses a different part of the builder.

pub const GGUF_TYPE_U8: u32 = 0;
pub const GGUF_TYPE_I8: u32 = 1;
pub const GGUF_TYPE_U16: u32 = 2;
pub const GGUF_TYPE_I16: u32 = 3;
pub const GGUF_TYPE_U32: u32 = 4;
pub const GGUF_TYPE_I32: u32 = 5;
pub const GGUF_TYPE_F32: u32 = 6;
pub const GGUF_TYPE_BOOL: u32 = 7;
pub const GGUF_TYPE_STRING: u32 = 8;
pub const GGUF_TYPE_ARRAY: u32 = 9;
pub const GGUF_TYPE_U64: u32 = 10;
pub const GGUF_TYPE_I64: u32 = 11;
pub const GGUF_TYPE_F64: u32 = 12;

/// A metadata value as the test writes it: a type id and its encoded bytes.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub type_id: u32,
    pub bytes: Vec<u8>,
}

pub fn u8_value(v: u8) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_U8,
        bytes: vec![v],
    }
}
pub fn i8_value(v: i8) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_I8,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn u16_value(v: u16) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_U16,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn i16_value(v: i16) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_I16,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn u32_value(v: u32) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_U32,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn i32_value(v: i32) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_I32,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn f32_value(v: f32) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_F32,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn bool_value(v: bool) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_BOOL,
        bytes: vec![u8::from(v)],
    }
}
pub fn string_value(v: &str) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_STRING,
        bytes: string_bytes(v),
    }
}
pub fn u64_value(v: u64) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_U64,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn i64_value(v: i64) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_I64,
        bytes: v.to_le_bytes().to_vec(),
    }
}
pub fn f64_value(v: f64) -> Encoded {
    Encoded {
        type_id: GGUF_TYPE_F64,
        bytes: v.to_le_bytes().to_vec(),
    }
}

/// An array of elements that all have type `element_type` (their type ids are not repeated
/// inside the array, as the format specifies).
pub fn array_value(element_type: u32, elements: &[Encoded]) -> Encoded {
    let mut bytes = element_type.to_le_bytes().to_vec();
    bytes.extend((elements.len() as u64).to_le_bytes());
    for element in elements {
        assert_eq!(element.type_id, element_type, "test bug: mixed array");
        bytes.extend(&element.bytes);
    }
    Encoded {
        type_id: GGUF_TYPE_ARRAY,
        bytes,
    }
}

pub fn string_array(values: &[&str]) -> Encoded {
    let elements: Vec<Encoded> = values.iter().map(|s| string_value(s)).collect();
    array_value(GGUF_TYPE_STRING, &elements)
}

pub fn i32_array(values: &[i32]) -> Encoded {
    let elements: Vec<Encoded> = values.iter().map(|&v| i32_value(v)).collect();
    array_value(GGUF_TYPE_I32, &elements)
}

/// A GGUF string: u64 length, then the bytes.
pub fn string_bytes(s: &str) -> Vec<u8> {
    let mut bytes = (s.len() as u64).to_le_bytes().to_vec();
    bytes.extend(s.as_bytes());
    bytes
}

/// One tensor to write: its info fields and its data bytes.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// Builds a whole file. Tensor offsets are assigned in order, each padded to the alignment; the
/// file ends right after the last tensor's data (or after the data-section padding when there
/// are no tensors).
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    pub version: u32,
    pub pairs: Vec<(String, Encoded)>,
    pub tensors: Vec<TensorSpec>,
    /// The alignment used for layout (also write `general.alignment` to change the reader's).
    pub alignment: u64,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder {
            version: 3,
            pairs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }
}

impl GgufBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    pub fn pair(mut self, key: &str, value: Encoded) -> Self {
        self.pairs.push((key.to_owned(), value));
        self
    }

    pub fn alignment(mut self, alignment: u32) -> Self {
        self.alignment = u64::from(alignment);
        self.pair("general.alignment", u32_value(alignment))
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(TensorSpec {
            name: name.to_owned(),
            dims: dims.to_vec(),
            type_id,
            data,
        });
        self
    }

    /// The offsets (relative to the data section) the builder assigns.
    pub fn offsets(&self) -> Vec<u64> {
        let mut offsets = Vec::new();
        let mut next = 0u64;
        for tensor in &self.tensors {
            offsets.push(next);
            next = (next + tensor.data.len() as u64).next_multiple_of(self.alignment);
        }
        offsets
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_offsets(&self.offsets())
    }

    /// Builds with explicit tensor offsets (which may be wrong on purpose); data is written at
    /// the builder's own layout.
    pub fn build_with_offsets(&self, offsets: &[u64]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.pairs.len() as u64).to_le_bytes());
        for (key, value) in &self.pairs {
            out.extend(string_bytes(key));
            out.extend(value.type_id.to_le_bytes());
            out.extend(&value.bytes);
        }
        for (tensor, offset) in self.tensors.iter().zip(offsets) {
            out.extend(string_bytes(&tensor.name));
            out.extend((tensor.dims.len() as u32).to_le_bytes());
            for dim in &tensor.dims {
                out.extend(dim.to_le_bytes());
            }
            out.extend(tensor.type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        let data_start = (out.len() as u64).next_multiple_of(self.alignment) as usize;
        out.resize(data_start, 0);
        for (tensor, offset) in self.tensors.iter().zip(self.offsets()) {
            out.resize(data_start + offset as usize, 0);
            out.extend(&tensor.data);
        }
        out
    }
}

/// `n` distinct bytes, so a test can tell one tensor's data from another's.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A file exercising every metadata type, nested arrays, and one tensor of each supported type.
pub fn rich_fixture() -> GgufBuilder {
    GgufBuilder::new()
        .pair("t.u8", u8_value(200))
        .pair("t.i8", i8_value(-100))
        .pair("t.u16", u16_value(60_000))
        .pair("t.i16", i16_value(-30_000))
        .pair("t.u32", u32_value(4_000_000_000))
        .pair("t.i32", i32_value(-2_000_000_000))
        .pair("t.f32", f32_value(1e-5))
        .pair("t.bool", bool_value(true))
        .pair("t.string", string_value("naïve 🙂"))
        .pair("t.u64", u64_value(u64::MAX - 1))
        .pair("t.i64", i64_value(i64::MIN + 1))
        .pair("t.f64", f64_value(-2.5e300))
        .pair("t.strings", string_array(&["a", "", "ĠĊ"]))
        .pair(
            "t.nested",
            array_value(
                GGUF_TYPE_ARRAY,
                &[
                    i32_array(&[1, -2, 3]),
                    string_array(&["x"]),
                    array_value(GGUF_TYPE_U8, &[]),
                ],
            ),
        )
        .tensor("f32", &[3, 2], 0, pattern(3 * 2 * 4, 1))
        .tensor("f16", &[5], 1, pattern(5 * 2, 2))
        .tensor("q4_0", &[64, 2], 2, pattern(4 * 18, 3))
        .tensor("q4_1", &[32], 3, pattern(20, 4))
        .tensor("q8_0", &[32, 1, 1, 2], 8, pattern(2 * 34, 5))
        .tensor("q4_k", &[256], 12, pattern(144, 6))
        .tensor("q6_k", &[256, 2], 14, pattern(2 * 210, 7))
}

/// The reference model's path when it has been fetched. When it has not: prints why the test
/// is skipped and returns `None`, unless `TQ_REQUIRE_MODEL=1` (set by CI after fetching), in
/// which case the test fails.
pub fn reference_model_or_skip() -> Option<std::path::PathBuf> {
    model_or_skip(tq_models::fetch::reference_model_path())
}

/// Gemma 3 270M's path when it has been fetched; otherwise as [`reference_model_or_skip`].
pub fn gemma3_model_or_skip() -> Option<std::path::PathBuf> {
    model_or_skip(tq_models::fetch::KnownModel::Gemma3_270m.path())
}

fn model_or_skip(path: std::path::PathBuf) -> Option<std::path::PathBuf> {
    if path.exists() {
        return Some(path);
    }
    if std::env::var("TQ_REQUIRE_MODEL").as_deref() == Ok("1") {
        panic!(
            "model not found at {} and TQ_REQUIRE_MODEL=1; run `cargo xtask fetch-model`",
            path.display()
        );
    }
    eprintln!(
        "skipped: model not found at {}; run `cargo xtask fetch-model`",
        path.display()
    );
    None
}
