//! Parsing and validating a whole GGUF header: magic, version, metadata, tensor infos, the
//! alignment and the data section, with every tensor's bytes checked against the file length.

use std::collections::HashMap;

use super::error::{GgufError, Result};
use super::metadata::Metadata;
use super::metadata_reader::{read_value, read_value_type};
use super::reader::Reader;
use super::tensor::{GgmlType, MAX_DIMS, TensorInfo};

/// The four magic bytes that open every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that overrides the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The fewest bytes one tensor info occupies: name length, dimension count, type and offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// The fewest bytes one key-value pair occupies: key length, value type, a one-byte value.
const MIN_PAIR_SIZE: u64 = 8 + 4 + 1;

/// Everything the header says, validated against the file it came from.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) metadata: Metadata,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
}

/// Parses and validates the header of the GGUF file whose bytes are `bytes`.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header> {
    let mut reader = Reader::new(bytes);
    let magic = reader.take(4, "magic").map_err(|_| GgufError::BadMagic {
        found: bytes.iter().take(4).copied().collect(),
    })?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = check_version(reader.u32("version")?)?;

    let tensor_count_offset = reader.position();
    let tensor_count = reader.u64("tensor count")?;
    let pair_count_offset = reader.position();
    let pair_count = reader.u64("metadata pair count")?;
    // Both counts are checked against the bytes left before anything is reserved for them.
    let pair_count = reader.check_count(
        pair_count,
        MIN_PAIR_SIZE,
        "metadata pair",
        pair_count_offset,
    )?;
    let mut pairs = Vec::with_capacity(pair_count);
    for _ in 0..pair_count {
        let key = reader.string("metadata key")?;
        let value_type = read_value_type(&mut reader, "metadata value type")?;
        let value = read_value(&mut reader, value_type, 0)?;
        pairs.push((key, value));
    }
    let metadata = Metadata::from_pairs(pairs)?;
    let alignment = alignment(&metadata)?;

    let tensor_count = reader.check_count(
        tensor_count,
        MIN_TENSOR_INFO_SIZE,
        "tensor info",
        tensor_count_offset,
    )?;
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let info = read_tensor_info(&mut reader)?;
        if tensor_index.insert(info.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensors.push(info);
    }

    let file_len = bytes.len() as u64;
    let data_offset = align_up(reader.position(), alignment).ok_or(GgufError::OutOfBounds {
        what: "data section".to_owned(),
        start: reader.position(),
        end: u64::MAX,
        file_len,
    })?;
    // Writers pad the data section to the alignment even when there are no tensors, so a file
    // that ends inside the padding was cut short.
    if data_offset > file_len {
        return Err(GgufError::OutOfBounds {
            what: "data section".to_owned(),
            start: data_offset,
            end: data_offset,
            file_len,
        });
    }
    for info in &tensors {
        check_tensor_bounds(info, alignment, data_offset, file_len)?;
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// Accepts versions 2 and 3 (identical little-endian layouts; 3 only added big-endian files).
fn check_version(version: u32) -> Result<u32> {
    match version {
        2 | 3 => Ok(version),
        1 => Err(GgufError::UnsupportedVersion {
            version,
            reason: "GGUF v1 (32-bit counts and lengths) is obsolete; convert the file with a current llama.cpp",
        }),
        // A big-endian file stores its version big-endian, which reads as 2 or 3 swapped.
        v if matches!(v.swap_bytes(), 2 | 3) => Err(GgufError::UnsupportedVersion {
            version,
            reason: "big-endian GGUF files are not supported",
        }),
        _ => Err(GgufError::UnsupportedVersion {
            version,
            reason: "only versions 2 and 3 are supported",
        }),
    }
}

/// The file's alignment: `general.alignment` (a non-zero power of two) or 32.
fn alignment(metadata: &Metadata) -> Result<u64> {
    if !metadata.contains_key(ALIGNMENT_KEY) {
        return Ok(DEFAULT_ALIGNMENT);
    }
    let value = u64::from(metadata.u32(ALIGNMENT_KEY)?);
    if !value.is_power_of_two() {
        return Err(GgufError::BadAlignment { value });
    }
    Ok(value)
}

fn read_tensor_info(reader: &mut Reader<'_>) -> Result<TensorInfo> {
    let name = reader.string("tensor name")?;
    let n_dims = reader.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let dims = (0..n_dims)
        .map(|_| reader.u64("tensor dimension"))
        .collect::<Result<Vec<_>>>()?;
    let id = reader.u32("tensor type")?;
    let ggml_type = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        id,
    })?;
    let offset = reader.u64("tensor offset")?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
    })
}

/// Checks a tensor's shape, alignment and extent; afterwards `TensorInfo::byte_size` cannot
/// overflow and the data lies inside the file.
fn check_tensor_bounds(
    info: &TensorInfo,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<()> {
    let bad_shape = |reason| GgufError::BadShape {
        name: info.name.clone(),
        dims: info.dims.clone(),
        ggml_type: info.ggml_type,
        reason,
    };
    // ggml stores dimensions as i64, so larger values cannot come from a real tensor.
    if info.dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err(bad_shape("a dimension exceeds i64::MAX"));
    }
    let elements = info
        .dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad_shape("the element count overflows"))?;
    if !info.offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            name: info.name.clone(),
            offset: info.offset,
            alignment,
        });
    }
    let start = data_offset.checked_add(info.offset);
    let size = match info.ggml_type.layout() {
        Some(layout) => {
            // Blocks never straddle rows, so the innermost dimension holds whole blocks.
            let row = info.dims.first().copied().unwrap_or(1);
            if row % layout.block_size != 0 {
                return Err(bad_shape(
                    "the row length is not a multiple of the block size",
                ));
            }
            (elements / layout.block_size)
                .checked_mul(layout.bytes_per_block)
                .ok_or_else(|| bad_shape("the byte size overflows"))?
        }
        // Unknown layout: at least the start must be inside the file.
        None => 0,
    };
    let end = start.and_then(|s| s.checked_add(size));
    match end {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(GgufError::OutOfBounds {
            what: format!("tensor {:?}", info.name),
            start: start.unwrap_or(u64::MAX),
            end: end.unwrap_or(u64::MAX),
            file_len,
        }),
    }
}

/// `value` rounded up to a multiple of `alignment` (a power of two), `None` on overflow.
pub(crate) fn align_up(value: u64, alignment: u64) -> Option<u64> {
    Some(value.checked_add(alignment - 1)? & !(alignment - 1))
}
