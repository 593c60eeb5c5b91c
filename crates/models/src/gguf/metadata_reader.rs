//! Reading metadata values from the file: scalars, strings and (nested) arrays, with every
//! count checked against the remaining bytes before anything is allocated.

use super::error::{GgufError, Result};
use super::metadata::{MAX_ARRAY_NESTING, MetadataArray, MetadataValue, ValueType};
use super::reader::Reader;
use super::string_array::StringArray;

/// Reads a value type id, refusing unknown ids.
pub(crate) fn read_value_type(reader: &mut Reader<'_>, what: &'static str) -> Result<ValueType> {
    let offset = reader.position();
    let id = reader.u32(what)?;
    ValueType::from_id(id).ok_or(GgufError::UnknownValueType { id, offset })
}

/// Reads one value of type `value_type`; `depth` counts the arrays around it.
pub(crate) fn read_value(
    reader: &mut Reader<'_>,
    value_type: ValueType,
    depth: usize,
) -> Result<MetadataValue> {
    const WHAT: &str = "metadata value";
    Ok(match value_type {
        ValueType::U8 => MetadataValue::U8(reader.u8(WHAT)?),
        ValueType::I8 => MetadataValue::I8(i8::from_le_bytes(reader.array(WHAT)?)),
        ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(reader.array(WHAT)?)),
        ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(reader.array(WHAT)?)),
        ValueType::U32 => MetadataValue::U32(reader.u32(WHAT)?),
        ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(reader.array(WHAT)?)),
        ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(reader.array(WHAT)?)),
        ValueType::Bool => MetadataValue::Bool(read_bool(reader)?),
        ValueType::String => MetadataValue::String(reader.string("metadata string")?),
        ValueType::Array => MetadataValue::Array(read_array(reader, depth + 1)?),
        ValueType::U64 => MetadataValue::U64(reader.u64(WHAT)?),
        ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(reader.array(WHAT)?)),
        ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(reader.array(WHAT)?)),
    })
}

fn read_bool(reader: &mut Reader<'_>) -> Result<bool> {
    let offset = reader.position();
    match reader.u8("metadata bool")? {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(GgufError::InvalidBool { value, offset }),
    }
}

/// Reads fixed-size numbers in one bounds check: `count` elements of `N` bytes each.
fn read_numbers<T, const N: usize>(
    reader: &mut Reader<'_>,
    count: usize,
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    // `count` was checked against the remaining bytes with the element size, so this cannot
    // overflow.
    let bytes = reader.take((count * N) as u64, "metadata array")?;
    Ok(bytes
        .chunks_exact(N)
        .map(|chunk| {
            let mut raw = [0u8; N];
            raw.copy_from_slice(chunk);
            decode(raw)
        })
        .collect())
}

/// Reads an array (element type, count, elements) at nesting level `depth` (1 = outermost).
pub(crate) fn read_array(reader: &mut Reader<'_>, depth: usize) -> Result<MetadataArray> {
    let start = reader.position();
    if depth > MAX_ARRAY_NESTING {
        return Err(GgufError::NestingTooDeep {
            max: MAX_ARRAY_NESTING,
            offset: start,
        });
    }
    let element_type = read_value_type(reader, "array element type")?;
    let count_offset = reader.position();
    let count = reader.u64("array length")?;
    let count = reader.check_count(
        count,
        element_type.min_encoded_size(),
        "array element",
        count_offset,
    )?;
    Ok(match element_type {
        ValueType::U8 => MetadataArray::U8(read_numbers(reader, count, u8::from_le_bytes)?),
        ValueType::I8 => MetadataArray::I8(read_numbers(reader, count, i8::from_le_bytes)?),
        ValueType::U16 => MetadataArray::U16(read_numbers(reader, count, u16::from_le_bytes)?),
        ValueType::I16 => MetadataArray::I16(read_numbers(reader, count, i16::from_le_bytes)?),
        ValueType::U32 => MetadataArray::U32(read_numbers(reader, count, u32::from_le_bytes)?),
        ValueType::I32 => MetadataArray::I32(read_numbers(reader, count, i32::from_le_bytes)?),
        ValueType::F32 => MetadataArray::F32(read_numbers(reader, count, f32::from_le_bytes)?),
        ValueType::U64 => MetadataArray::U64(read_numbers(reader, count, u64::from_le_bytes)?),
        ValueType::I64 => MetadataArray::I64(read_numbers(reader, count, i64::from_le_bytes)?),
        ValueType::F64 => MetadataArray::F64(read_numbers(reader, count, f64::from_le_bytes)?),
        ValueType::Bool => MetadataArray::Bool(
            (0..count)
                .map(|_| read_bool(reader))
                .collect::<Result<_>>()?,
        ),
        ValueType::String => {
            let mut strings = StringArray::with_capacity(count, 0);
            for _ in 0..count {
                strings.push(reader.str("metadata string")?);
            }
            strings.shrink_to_fit();
            MetadataArray::String(strings)
        }
        ValueType::Array => MetadataArray::Array(
            (0..count)
                .map(|_| read_array(reader, depth + 1))
                .collect::<Result<_>>()?,
        ),
    })
}
