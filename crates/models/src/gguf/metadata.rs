//! Metadata values: the thirteen GGUF value types, typed arrays, and the key-value map with
//! typed accessors.

use std::collections::HashMap;
use std::fmt;

use super::error::{GgufError, Result};
use super::string_array::StringArray;

/// Arrays nested deeper than this are refused: each level costs a stack frame while parsing, and
/// no real file nests at all (llama.cpp refuses nested arrays outright).
pub const MAX_ARRAY_NESTING: usize = 16;

/// The type tag of a metadata value, with the ids the format uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)] // The variant names are the format's own.
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type for a format id, `None` for ids outside 0..=12.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type occupies in a file: its size for numbers, the
    /// length field for strings, element type and count for arrays. Array counts are checked
    /// against this before anything is allocated.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        };
        f.write_str(name)
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // One variant per `ValueType`, same names.
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, stored by element type.
///
/// Typed vectors (rather than a `Vec<MetadataValue>`) keep a hostile file from turning a one-byte
/// element into a 32-byte value: memory stays within a small constant factor of the file size.
/// Arrays of arrays may mix element types between the inner arrays.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // One variant per element type, same names as `ValueType`.
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    /// Packed: one buffer for all the strings (see [`StringArray`]).
    String(StringArray),
    Array(Vec<MetadataArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed 128-bit integer when it is an integer of any width, so callers can
    /// convert with range checks instead of caring which width the writer chose.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A description of the type for error messages, e.g. `array of string`.
    fn describe(&self) -> String {
        match self {
            MetadataValue::Array(array) => format!("array of {}", array.element_type()),
            other => other.value_type().to_string(),
        }
    }
}

impl MetadataArray {
    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            MetadataArray::U8(_) => ValueType::U8,
            MetadataArray::I8(_) => ValueType::I8,
            MetadataArray::U16(_) => ValueType::U16,
            MetadataArray::I16(_) => ValueType::I16,
            MetadataArray::U32(_) => ValueType::U32,
            MetadataArray::I32(_) => ValueType::I32,
            MetadataArray::F32(_) => ValueType::F32,
            MetadataArray::Bool(_) => ValueType::Bool,
            MetadataArray::String(_) => ValueType::String,
            MetadataArray::Array(_) => ValueType::Array,
            MetadataArray::U64(_) => ValueType::U64,
            MetadataArray::I64(_) => ValueType::I64,
            MetadataArray::F64(_) => ValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The metadata key-value pairs of a file, in file order, with typed accessors.
///
/// The accessors fail with an error naming the key: [`GgufError::MissingKey`] when absent,
/// [`GgufError::WrongType`] when the stored type differs. Integer accessors accept any integer
/// width whose value fits ([`GgufError::OutOfRange`] otherwise), because writers differ in the
/// widths they choose for the same key.
///
/// ```
/// # use tq_models::gguf::{Metadata, MetadataValue, GgufError};
/// let metadata = Metadata::from_pairs(vec![
///     ("llama.block_count".to_owned(), MetadataValue::U32(30)),
///     ("general.name".to_owned(), MetadataValue::String("SmolLM2".to_owned())),
/// ])?;
/// assert_eq!(metadata.u32("llama.block_count")?, 30);
/// assert_eq!(metadata.u64("llama.block_count")?, 30);
/// assert_eq!(metadata.str("general.name")?, "SmolLM2");
/// assert!(matches!(metadata.f32("general.name"), Err(GgufError::WrongType { .. })));
/// assert!(matches!(metadata.u32("absent"), Err(GgufError::MissingKey { .. })));
/// # Ok::<(), GgufError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    pairs: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

macro_rules! integer_accessor {
    ($(#[$doc:meta])* $name:ident, $ty:ty) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<$ty> {
            let value = self.require(key)?;
            let wide = value
                .as_integer()
                .ok_or_else(|| GgufError::wrong_type(key, stringify!($ty), value.value_type()))?;
            <$ty>::try_from(wide).map_err(|_| GgufError::OutOfRange {
                key: key.to_owned(),
                value: wide.to_string(),
                expected: stringify!($ty),
            })
        }
    };
}

macro_rules! array_accessor {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $ty:ty) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<&[$ty]> {
            match self.require(key)? {
                MetadataValue::Array(MetadataArray::$variant(values)) => Ok(values),
                other => Err(GgufError::WrongType {
                    key: key.to_owned(),
                    expected: concat!("array of ", stringify!($ty)),
                    found: other.describe(),
                }),
            }
        }
    };
}

impl Metadata {
    /// Builds a map from pairs, refusing duplicate keys.
    pub fn from_pairs(pairs: Vec<(String, MetadataValue)>) -> Result<Self> {
        let mut index = HashMap::with_capacity(pairs.len());
        for (i, (key, _)) in pairs.iter().enumerate() {
            if index.insert(key.clone(), i).is_some() {
                return Err(GgufError::DuplicateKey { key: key.clone() });
            }
        }
        Ok(Metadata { pairs, index })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.pairs[i].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The value of `key`, or `MissingKey`.
    pub fn require(&self, key: &str) -> Result<&MetadataValue> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    integer_accessor!(
        /// An integer value that fits in `u8`.
        u8, u8
    );
    integer_accessor!(
        /// An integer value that fits in `i8`.
        i8, i8
    );
    integer_accessor!(
        /// An integer value that fits in `u16`.
        u16, u16
    );
    integer_accessor!(
        /// An integer value that fits in `i16`.
        i16, i16
    );
    integer_accessor!(
        /// An integer value that fits in `u32`.
        u32, u32
    );
    integer_accessor!(
        /// An integer value that fits in `i32`.
        i32, i32
    );
    integer_accessor!(
        /// An integer value that fits in `u64`.
        u64, u64
    );
    integer_accessor!(
        /// An integer value that fits in `i64`.
        i64, i64
    );

    /// An `f32` value (stored as f32 exactly; an f64 is not narrowed silently).
    pub fn f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            MetadataValue::F32(v) => Ok(*v),
            other => Err(GgufError::wrong_type(key, "f32", other.value_type())),
        }
    }

    /// A floating-point value of either width, widened to f64.
    pub fn f64(&self, key: &str) -> Result<f64> {
        match self.require(key)? {
            MetadataValue::F32(v) => Ok(f64::from(*v)),
            MetadataValue::F64(v) => Ok(*v),
            other => Err(GgufError::wrong_type(key, "f64", other.value_type())),
        }
    }

    /// A boolean value.
    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            MetadataValue::Bool(v) => Ok(*v),
            other => Err(GgufError::wrong_type(key, "bool", other.value_type())),
        }
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            MetadataValue::String(v) => Ok(v),
            other => Err(GgufError::wrong_type(key, "string", other.value_type())),
        }
    }

    /// An array value of any element type.
    pub fn array(&self, key: &str) -> Result<&MetadataArray> {
        match self.require(key)? {
            MetadataValue::Array(v) => Ok(v),
            other => Err(GgufError::wrong_type(key, "array", other.value_type())),
        }
    }

    /// An array of strings.
    pub fn array_str(&self, key: &str) -> Result<&StringArray> {
        match self.require(key)? {
            MetadataValue::Array(MetadataArray::String(values)) => Ok(values),
            other => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: "array of String",
                found: other.describe(),
            }),
        }
    }
    array_accessor!(
        /// An array of `u8`.
        array_u8, U8, u8
    );
    array_accessor!(
        /// An array of `i32`.
        array_i32, I32, i32
    );
    array_accessor!(
        /// An array of `u32`.
        array_u32, U32, u32
    );
    array_accessor!(
        /// An array of `i64`.
        array_i64, I64, i64
    );
    array_accessor!(
        /// An array of `u64`.
        array_u64, U64, u64
    );
    array_accessor!(
        /// An array of `f32`.
        array_f32, F32, f32
    );
    array_accessor!(
        /// An array of `bool`.
        array_bool, Bool, bool
    );
}
