//! Metadata parsing: every value type round-trips, arrays (of strings, nested, empty), the
//! typed accessors and their errors, versions, and the alignment.

mod gguf_common;

use gguf_common::*;
use tq_models::gguf::{Gguf, GgufError, MetadataArray, MetadataValue, ValueType};

fn parse(builder: &GgufBuilder) -> Gguf {
    Gguf::from_bytes(builder.build()).expect("fixture parses")
}

#[test]
fn every_scalar_type_round_trips_exactly() {
    let gguf = parse(&rich_fixture());
    let m = gguf.metadata();
    assert_eq!(m.get("t.u8"), Some(&MetadataValue::U8(200)));
    assert_eq!(m.get("t.i8"), Some(&MetadataValue::I8(-100)));
    assert_eq!(m.get("t.u16"), Some(&MetadataValue::U16(60_000)));
    assert_eq!(m.get("t.i16"), Some(&MetadataValue::I16(-30_000)));
    assert_eq!(m.get("t.u32"), Some(&MetadataValue::U32(4_000_000_000)));
    assert_eq!(m.get("t.i32"), Some(&MetadataValue::I32(-2_000_000_000)));
    assert_eq!(m.get("t.f32"), Some(&MetadataValue::F32(1e-5)));
    assert_eq!(m.get("t.bool"), Some(&MetadataValue::Bool(true)));
    assert_eq!(
        m.get("t.string"),
        Some(&MetadataValue::String("naïve 🙂".into()))
    );
    assert_eq!(m.get("t.u64"), Some(&MetadataValue::U64(u64::MAX - 1)));
    assert_eq!(m.get("t.i64"), Some(&MetadataValue::I64(i64::MIN + 1)));
    assert_eq!(m.get("t.f64"), Some(&MetadataValue::F64(-2.5e300)));
    // File order is kept.
    let keys: Vec<&str> = m.iter().map(|(k, _)| k).take(3).collect();
    assert_eq!(keys, ["t.u8", "t.i8", "t.u16"]);
    assert_eq!(m.len(), 14);
}

#[test]
fn arrays_of_every_element_type_round_trip() {
    let builder = GgufBuilder::new()
        .pair(
            "a.u8",
            array_value(GGUF_TYPE_U8, &[u8_value(1), u8_value(255)]),
        )
        .pair("a.i8", array_value(GGUF_TYPE_I8, &[i8_value(-1)]))
        .pair(
            "a.u16",
            array_value(GGUF_TYPE_U16, &[u16_value(7), u16_value(65_535)]),
        )
        .pair("a.i16", array_value(GGUF_TYPE_I16, &[i16_value(-7)]))
        .pair("a.u32", array_value(GGUF_TYPE_U32, &[u32_value(9)]))
        .pair("a.i32", i32_array(&[-9, 10]))
        .pair(
            "a.f32",
            array_value(GGUF_TYPE_F32, &[f32_value(0.5), f32_value(-0.0)]),
        )
        .pair(
            "a.bool",
            array_value(GGUF_TYPE_BOOL, &[bool_value(false), bool_value(true)]),
        )
        .pair("a.str", string_array(&["<|im_start|>", "Ġthe", ""]))
        .pair("a.u64", array_value(GGUF_TYPE_U64, &[u64_value(u64::MAX)]))
        .pair("a.i64", array_value(GGUF_TYPE_I64, &[i64_value(i64::MIN)]))
        .pair("a.f64", array_value(GGUF_TYPE_F64, &[f64_value(1e-300)]))
        .pair("a.empty", array_value(GGUF_TYPE_F32, &[]));
    let gguf = parse(&builder);
    let m = gguf.metadata();
    assert_eq!(m.array_u8("a.u8").unwrap(), [1, 255]);
    assert_eq!(m.array("a.i8").unwrap(), &MetadataArray::I8(vec![-1]));
    assert_eq!(
        m.array("a.u16").unwrap(),
        &MetadataArray::U16(vec![7, 65_535])
    );
    assert_eq!(m.array("a.i16").unwrap(), &MetadataArray::I16(vec![-7]));
    assert_eq!(m.array_u32("a.u32").unwrap(), [9]);
    assert_eq!(m.array_i32("a.i32").unwrap(), [-9, 10]);
    let f = m.array_f32("a.f32").unwrap();
    assert_eq!(f[0], 0.5);
    assert!(f[1] == 0.0 && f[1].is_sign_negative());
    assert_eq!(m.array_bool("a.bool").unwrap(), [false, true]);
    assert_eq!(
        m.array_str("a.str").unwrap().iter().collect::<Vec<_>>(),
        ["<|im_start|>", "Ġthe", ""]
    );
    let strings = m.array_str("a.str").unwrap();
    assert_eq!(
        (strings.len(), strings.get(2), strings.get(3)),
        (3, Some(""), None)
    );
    assert_eq!(m.array_u64("a.u64").unwrap(), [u64::MAX]);
    assert_eq!(m.array_i64("a.i64").unwrap(), [i64::MIN]);
    assert_eq!(m.array("a.f64").unwrap(), &MetadataArray::F64(vec![1e-300]));
    let empty = m.array("a.empty").unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.element_type(), ValueType::F32);
}

#[test]
fn nested_arrays_keep_each_inner_type() {
    let gguf = parse(&rich_fixture());
    let nested = gguf.metadata().array("t.nested").unwrap();
    assert_eq!(
        nested,
        &MetadataArray::Array(vec![
            MetadataArray::I32(vec![1, -2, 3]),
            MetadataArray::String(["x"].into_iter().collect()),
            MetadataArray::U8(vec![]),
        ])
    );
    // Three levels deep, with strings at the bottom.
    let deep = array_value(
        GGUF_TYPE_ARRAY,
        &[array_value(GGUF_TYPE_ARRAY, &[string_array(&["deep"])])],
    );
    let gguf = parse(&GgufBuilder::new().pair("deep", deep));
    let MetadataArray::Array(level1) = gguf.metadata().array("deep").unwrap() else {
        panic!("outer array of arrays expected")
    };
    let MetadataArray::Array(level2) = &level1[0] else {
        panic!("inner array of arrays")
    };
    assert_eq!(
        level2[0],
        MetadataArray::String(["deep"].into_iter().collect())
    );
}

#[test]
fn integer_accessors_convert_between_widths_with_range_checks() {
    let gguf = parse(&rich_fixture());
    let m = gguf.metadata();
    assert_eq!(m.u32("t.u8").unwrap(), 200);
    assert_eq!(m.u64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(m.i64("t.i8").unwrap(), -100);
    assert_eq!(m.i16("t.i16").unwrap(), -30_000);
    assert_eq!(m.u16("t.u16").unwrap(), 60_000);
    assert_eq!(m.i8("t.i8").unwrap(), -100);
    assert_eq!(m.u8("t.u8").unwrap(), 200);
    assert_eq!(m.f32("t.f32").unwrap(), 1e-5);
    assert_eq!(m.f64("t.f32").unwrap(), f64::from(1e-5f32));
    assert_eq!(m.f64("t.f64").unwrap(), -2.5e300);
    assert!(m.bool("t.bool").unwrap());
    assert_eq!(m.str("t.string").unwrap(), "naïve 🙂");
    // The shortcuts on the file are the same accessors.
    assert_eq!(gguf.metadata_u32("t.u8").unwrap(), 200);
    assert_eq!(gguf.metadata_u64("t.u64").unwrap(), u64::MAX - 1);
    assert_eq!(gguf.metadata_f32("t.f32").unwrap(), 1e-5);
    assert!(gguf.metadata_bool("t.bool").unwrap());
    assert_eq!(gguf.metadata_str("t.string").unwrap(), "naïve 🙂");
    assert_eq!(
        gguf.metadata_array_str("t.strings")
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        ["a", "", "ĠĊ"]
    );
    assert!(matches!(
        gguf.metadata_array_i32("t.strings"),
        Err(GgufError::WrongType { .. })
    ));

    let err = m.u32("t.i8").unwrap_err();
    assert!(matches!(&err, GgufError::OutOfRange { key, expected: "u32", .. } if key == "t.i8"));
    assert!(err.to_string().contains("t.i8"), "{err}");
    assert!(matches!(m.i32("t.u32"), Err(GgufError::OutOfRange { .. })));
}

#[test]
fn accessor_errors_name_the_key_and_the_types() {
    let gguf = parse(&rich_fixture());
    let m = gguf.metadata();
    let missing = m.u32("llama.block_count").unwrap_err();
    assert!(matches!(&missing, GgufError::MissingKey { key } if key == "llama.block_count"));
    assert!(missing.to_string().contains("llama.block_count"));

    let wrong = m.u32("t.string").unwrap_err();
    assert_eq!(
        wrong.to_string(),
        "GGUF metadata key \"t.string\" holds string, expected u32"
    );
    let wrong = m.array_str("t.nested").unwrap_err();
    assert_eq!(
        wrong.to_string(),
        "GGUF metadata key \"t.nested\" holds array of array, expected array of String"
    );
    assert!(matches!(m.f32("t.f64"), Err(GgufError::WrongType { .. })));
    assert!(matches!(m.str("t.u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(m.bool("t.u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(m.array("t.u8"), Err(GgufError::WrongType { .. })));
}

#[test]
fn versions_2_and_3_share_one_layout_and_1_is_refused() {
    let v3 = parse(&rich_fixture());
    let v2 = parse(&rich_fixture().version(2));
    assert_eq!(v2.version(), 2);
    assert_eq!(v3.version(), 3);
    assert_eq!(v2.metadata(), v3.metadata());
    assert_eq!(v2.tensors(), v3.tensors());

    for (version, reason) in [(1, "v1"), (4, "versions 2 and 3"), (0, "versions 2 and 3")] {
        let err = Gguf::from_bytes(rich_fixture().version(version).build()).unwrap_err();
        assert!(
            matches!(err, GgufError::UnsupportedVersion { version: v, .. } if v == version),
            "{err}"
        );
        assert!(err.to_string().contains(reason), "{err}");
    }
    // A big-endian v3 file stores its version as 03 00 00 00 read big-endian.
    let err = Gguf::from_bytes(rich_fixture().version(3u32.swap_bytes()).build()).unwrap_err();
    assert!(err.to_string().contains("big-endian"), "{err}");
}

#[test]
fn the_data_section_follows_the_default_or_the_declared_alignment() {
    let gguf = parse(&rich_fixture());
    assert_eq!(gguf.alignment(), 32);
    assert_eq!(gguf.data_offset() % 32, 0);

    let builder = GgufBuilder::new()
        .alignment(256)
        .tensor("a", &[3], 0, pattern(12, 1))
        .tensor("b", &[5], 0, pattern(20, 2));
    let gguf = parse(&builder);
    assert_eq!(gguf.alignment(), 256);
    assert_eq!(gguf.data_offset() % 256, 0);
    assert_eq!(gguf.tensor_info("b").unwrap().offset, 256);
    assert_eq!(gguf.tensor_data("b").unwrap().data, pattern(20, 2));

    // The header ends exactly at an alignment boundary (24 + 8 + 27 + 4 + 1 = 64 bytes): no
    // padding at all, and the data section starts at the end of the file.
    let bytes = GgufBuilder::new()
        .pair(&"k".repeat(27), u8_value(1))
        .build();
    assert_eq!(bytes.len(), 64);
    let gguf = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(gguf.data_offset(), 64);
}

#[test]
fn alignments_that_are_not_powers_of_two_are_refused() {
    for alignment in [0u32, 3, 48] {
        let bytes = GgufBuilder::new()
            .pair("general.alignment", u32_value(alignment))
            .build();
        let err = Gguf::from_bytes(bytes).unwrap_err();
        assert!(
            matches!(err, GgufError::BadAlignment { value } if value == u64::from(alignment)),
            "{err}"
        );
    }
    let bytes = GgufBuilder::new()
        .pair("general.alignment", string_value("32"))
        .build();
    assert!(matches!(
        Gguf::from_bytes(bytes),
        Err(GgufError::WrongType { key, .. }) if key == "general.alignment"
    ));
}
