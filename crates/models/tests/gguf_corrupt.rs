//! Corrupted and hostile headers: each field, broken, gives its own typed error (never a panic,
//! an out-of-bounds read or a huge allocation).

mod gguf_common;

use gguf_common::*;
use tq_models::gguf::{GgmlType, Gguf, GgufError, MAX_ARRAY_NESTING};

fn parse_err(bytes: Vec<u8>) -> GgufError {
    Gguf::from_bytes(bytes).expect_err("corrupt file must not parse")
}

/// The 24-byte file header: magic, version 3, counts.
fn header(tensors: u64, pairs: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(tensors.to_le_bytes());
    out.extend(pairs.to_le_bytes());
    out
}

fn pad_to_32(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.resize(bytes.len().next_multiple_of(32), 0);
    bytes
}

#[test]
fn a_wrong_or_missing_magic_is_refused() {
    assert!(matches!(parse_err(Vec::new()), GgufError::BadMagic { found } if found.is_empty()));
    assert!(matches!(
        parse_err(b"GG".to_vec()),
        GgufError::BadMagic { .. }
    ));
    let mut bytes = rich_fixture().build();
    bytes[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse_err(bytes), GgufError::BadMagic { found } if found == b"GGML"));
}

#[test]
fn a_string_length_past_the_end_is_truncation() {
    let mut bytes = header(0, 1);
    bytes.extend(1000u64.to_le_bytes()); // key length
    bytes.extend(b"short");
    let err = parse_err(bytes);
    assert!(
        matches!(
            err,
            GgufError::Truncated {
                what: "metadata key",
                offset: 32,
                needed: 1000,
                available: 5
            }
        ),
        "{err}"
    );
    // A value string, with a length near u64::MAX.
    let mut bytes = header(0, 1);
    bytes.extend(string_bytes("k"));
    bytes.extend(GGUF_TYPE_STRING.to_le_bytes());
    bytes.extend((u64::MAX - 3).to_le_bytes());
    assert!(matches!(
        parse_err(bytes),
        GgufError::Truncated {
            what: "metadata string",
            ..
        }
    ));
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    // 2^60 pairs in a 24-byte file.
    let err = parse_err(header(0, 1 << 60));
    assert!(
        matches!(
            err,
            GgufError::CountTooLarge {
                what: "metadata pair",
                ..
            }
        ),
        "{err}"
    );
    // u64::MAX tensors.
    let err = parse_err(pad_to_32(header(u64::MAX, 0)));
    assert!(
        matches!(
            err,
            GgufError::CountTooLarge {
                what: "tensor info",
                ..
            }
        ),
        "{err}"
    );
    // An array claiming 2^62 u64 elements (the product overflows: saturates, still refused).
    let mut bytes = header(0, 1);
    bytes.extend(string_bytes("a"));
    bytes.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    bytes.extend(GGUF_TYPE_U64.to_le_bytes());
    bytes.extend((1u64 << 62).to_le_bytes());
    bytes.extend([0; 64]);
    let err = parse_err(bytes);
    assert!(
        matches!(err, GgufError::CountTooLarge { what: "array element", count, min_bytes: u64::MAX, .. } if count == 1 << 62),
        "{err}"
    );
    // An array of strings whose count fits the bytes only if strings were one byte each.
    let mut bytes = header(0, 1);
    bytes.extend(string_bytes("a"));
    bytes.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    bytes.extend(GGUF_TYPE_STRING.to_le_bytes());
    bytes.extend(100u64.to_le_bytes());
    bytes.extend([0; 100]);
    assert!(matches!(
        parse_err(bytes),
        GgufError::CountTooLarge { min_bytes: 800, .. }
    ));
}

#[test]
fn unknown_value_types_are_refused() {
    let mut bytes = header(0, 1);
    bytes.extend(string_bytes("k"));
    bytes.extend(13u32.to_le_bytes());
    bytes.extend([0; 8]);
    assert!(matches!(
        parse_err(bytes),
        GgufError::UnknownValueType { id: 13, offset: 33 }
    ));
    // As an array element type.
    let mut bytes = header(0, 1);
    bytes.extend(string_bytes("k"));
    bytes.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    bytes.extend(0xFFFF_FFFFu32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    assert!(matches!(
        parse_err(bytes),
        GgufError::UnknownValueType {
            id: 0xFFFF_FFFF,
            ..
        }
    ));
}

#[test]
fn invalid_booleans_and_strings_are_refused() {
    let mut bytes = GgufBuilder::new().pair("b", bool_value(true)).build();
    let at = bytes.iter().rposition(|&b| b == 1).unwrap();
    bytes[at] = 2;
    assert!(matches!(
        parse_err(bytes),
        GgufError::InvalidBool { value: 2, .. }
    ));

    let mut bytes = header(0, 1);
    bytes.extend(2u64.to_le_bytes());
    bytes.extend([0xC3, 0x28]); // An invalid two-byte sequence.
    bytes.extend(GGUF_TYPE_U8.to_le_bytes());
    bytes.push(0);
    let err = parse_err(bytes);
    assert!(
        matches!(
            err,
            GgufError::InvalidUtf8 {
                what: "metadata key",
                offset: 32
            }
        ),
        "{err}"
    );
}

#[test]
fn arrays_nested_too_deep_are_refused() {
    let mut value = array_value(GGUF_TYPE_U8, &[]);
    for _ in 0..MAX_ARRAY_NESTING {
        value = array_value(GGUF_TYPE_ARRAY, &[value]);
    }
    let err = parse_err(GgufBuilder::new().pair("deep", value).build());
    assert!(matches!(err, GgufError::NestingTooDeep { .. }), "{err}");

    // One level less parses.
    let mut value = array_value(GGUF_TYPE_U8, &[]);
    for _ in 1..MAX_ARRAY_NESTING {
        value = array_value(GGUF_TYPE_ARRAY, &[value]);
    }
    Gguf::from_bytes(GgufBuilder::new().pair("deep", value).build()).unwrap();

    // A hostile chain far deeper than the limit (a stack overflow without it).
    let mut bytes = header(0, 1);
    bytes.extend(string_bytes("k"));
    bytes.extend(GGUF_TYPE_ARRAY.to_le_bytes());
    for _ in 0..100_000 {
        bytes.extend(GGUF_TYPE_ARRAY.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
    }
    assert!(matches!(parse_err(bytes), GgufError::NestingTooDeep { .. }));
}

#[test]
fn duplicate_keys_and_tensor_names_are_refused() {
    let bytes = GgufBuilder::new()
        .pair("k", u8_value(1))
        .pair("k", u8_value(2))
        .build();
    assert!(matches!(parse_err(bytes), GgufError::DuplicateKey { key } if key == "k"));
    let bytes = GgufBuilder::new()
        .tensor("w", &[4], 0, pattern(16, 1))
        .tensor("w", &[4], 0, pattern(16, 2))
        .build();
    assert!(matches!(parse_err(bytes), GgufError::DuplicateTensor { name } if name == "w"));
}

#[test]
fn more_than_four_dimensions_are_refused() {
    let bytes = GgufBuilder::new()
        .tensor("t", &[1, 1, 1, 1, 2], 0, pattern(8, 1))
        .build();
    let err = parse_err(bytes);
    assert!(
        matches!(
            err,
            GgufError::TooManyDims {
                n_dims: 5,
                max: 4,
                ..
            }
        ),
        "{err}"
    );
    // A huge dimension count is refused before reading the dimensions.
    let mut bytes = header(1, 0);
    bytes.extend(string_bytes("t"));
    bytes.extend(u32::MAX.to_le_bytes());
    bytes.extend([0; 32]);
    assert!(matches!(
        parse_err(bytes),
        GgufError::TooManyDims {
            n_dims: u32::MAX,
            ..
        }
    ));
}

#[test]
fn unknown_tensor_types_are_refused() {
    for id in [4u32, 5, 31, 40, 1000] {
        let bytes = GgufBuilder::new()
            .tensor("t", &[4], id, pattern(16, 1))
            .build();
        let err = parse_err(bytes);
        assert!(
            matches!(err, GgufError::UnknownTensorType { id: i, .. } if i == id),
            "{err}"
        );
    }
}

#[test]
fn tensor_offsets_past_the_end_are_refused() {
    let builder = GgufBuilder::new().tensor("t", &[8], 0, pattern(32, 1));
    let bytes = builder.build_with_offsets(&[1 << 40]);
    let err = parse_err(bytes);
    assert!(
        matches!(&err, GgufError::OutOfBounds { what, .. } if what.contains("\"t\"")),
        "{err}"
    );
    // An offset that overflows when added to the data section's start.
    let bytes = builder.build_with_offsets(&[u64::MAX - 31]);
    assert!(matches!(
        parse_err(bytes),
        GgufError::OutOfBounds { end: u64::MAX, .. }
    ));
    // In bounds to start, but the data runs past the end.
    let bytes = builder.build_with_offsets(&[32]);
    assert!(matches!(parse_err(bytes), GgufError::OutOfBounds { .. }));
    // A type without a known layout: only its start is checked, and it is past the end.
    let bytes = GgufBuilder::new()
        .tensor("iq", &[256], 16, pattern(66, 1))
        .build_with_offsets(&[1 << 20]);
    assert!(matches!(parse_err(bytes), GgufError::OutOfBounds { .. }));
}

#[test]
fn misaligned_tensor_offsets_are_refused() {
    let bytes = GgufBuilder::new()
        .tensor("a", &[8], 0, pattern(32, 1))
        .tensor("b", &[8], 0, pattern(32, 2))
        .build_with_offsets(&[0, 4]);
    let err = parse_err(bytes);
    assert!(
        matches!(&err, GgufError::MisalignedTensor { name, offset: 4, alignment: 32 } if name == "b"),
        "{err}"
    );
}

#[test]
fn impossible_shapes_are_refused() {
    // A Q4_0 row of 48 elements is not a whole number of 32-element blocks.
    let bytes = GgufBuilder::new()
        .tensor("q", &[48], 2, pattern(36, 1))
        .build();
    let err = parse_err(bytes);
    assert!(
        matches!(
            &err,
            GgufError::BadShape {
                ggml_type: GgmlType::Q4_0,
                ..
            }
        ),
        "{err}"
    );
    // The element count overflows u64.
    let bytes = GgufBuilder::new()
        .tensor("big", &[1 << 32, 1 << 32, 2], 0, Vec::new())
        .build();
    assert!(matches!(parse_err(bytes), GgufError::BadShape { .. }));
    // A dimension above i64::MAX.
    let bytes = GgufBuilder::new()
        .tensor("neg", &[u64::MAX], 1, Vec::new())
        .build();
    assert!(matches!(parse_err(bytes), GgufError::BadShape { .. }));
    // The byte count overflows even though the element count does not.
    let bytes = GgufBuilder::new()
        .tensor("wide", &[1 << 62, 2], 0, Vec::new())
        .build();
    assert!(matches!(parse_err(bytes), GgufError::BadShape { .. }));
}

#[test]
fn a_file_cut_inside_the_data_section_padding_is_refused() {
    let bytes = GgufBuilder::new().pair("k", u8_value(1)).build();
    assert_eq!(bytes.len() % 32, 0);
    let err = parse_err(bytes[..bytes.len() - 1].to_vec());
    assert!(
        matches!(&err, GgufError::OutOfBounds { what, .. } if what == "data section"),
        "{err}"
    );
}
