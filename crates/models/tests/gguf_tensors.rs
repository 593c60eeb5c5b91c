//! Tensor descriptions and tensor data: names, shapes, types, offsets, exact bytes for every
//! supported type, and the errors for absent and unsupported tensors.

mod gguf_common;

use gguf_common::*;
use tq_models::gguf::{BlockLayout, GgmlType, Gguf, GgufError};

#[test]
fn tensor_infos_are_read_in_file_order() {
    let builder = rich_fixture();
    let gguf = Gguf::from_bytes(builder.build()).unwrap();
    let names: Vec<&str> = gguf.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["f32", "f16", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k"]
    );
    let offsets: Vec<u64> = gguf.tensors().iter().map(|t| t.offset).collect();
    assert_eq!(offsets, builder.offsets());
    let q8 = gguf.tensor_info("q8_0").unwrap();
    assert_eq!(q8.dims, [32, 1, 1, 2]);
    assert_eq!(q8.ggml_type, GgmlType::Q8_0);
    assert_eq!(q8.element_count(), 64);
    assert_eq!(q8.byte_size(), Some(68));
    assert!(gguf.tensor_info("absent").is_none());
}

#[test]
fn tensor_data_is_exactly_each_tensors_bytes() {
    let builder = rich_fixture();
    let gguf = Gguf::from_bytes(builder.build()).unwrap();
    for spec in &builder.tensors {
        let view = gguf.tensor_data(&spec.name).unwrap();
        assert_eq!(view.name(), spec.name);
        assert_eq!(view.dims(), spec.dims.as_slice());
        assert_eq!(view.ggml_type().id(), spec.type_id);
        assert_eq!(view.data, spec.data.as_slice(), "bytes of {}", spec.name);
    }
}

#[test]
fn block_layouts_match_ggml() {
    let expected = [
        (GgmlType::F32, 1, 4),
        (GgmlType::F16, 1, 2),
        (GgmlType::Q4_0, 32, 18),
        (GgmlType::Q4_1, 32, 20),
        (GgmlType::Q8_0, 32, 34),
        (GgmlType::Q4_K, 256, 144),
        (GgmlType::Q6_K, 256, 210),
    ];
    for (ty, block_size, bytes_per_block) in expected {
        assert_eq!(
            ty.layout(),
            Some(BlockLayout {
                block_size,
                bytes_per_block
            }),
            "{ty}"
        );
    }
    for id in 0..64 {
        if let Some(ty) = GgmlType::from_id(id) {
            assert_eq!(ty.id(), id);
        }
    }
    // Removed from the format, so unknown.
    for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, u32::MAX] {
        assert_eq!(GgmlType::from_id(id), None, "id {id}");
    }
    assert_eq!(GgmlType::from_id(39), Some(GgmlType::MXFP4));
    assert_eq!(GgmlType::Q4_K.to_string(), "Q4_K");
}

#[test]
fn known_types_without_a_layout_parse_but_their_data_is_unsupported() {
    // IQ2_XXS (16): known by name, layout not implemented.
    let bytes = GgufBuilder::new()
        .tensor("iq", &[256], 16, pattern(66, 1))
        .tensor("ok", &[4], 0, pattern(16, 2))
        .build();
    let gguf = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(gguf.tensor_info("iq").unwrap().ggml_type, GgmlType::IQ2_XXS);
    assert_eq!(gguf.tensor_info("iq").unwrap().byte_size(), None);
    let err = gguf.tensor_data("iq").unwrap_err();
    assert!(
        matches!(&err, GgufError::UnsupportedTensorType { name, ggml_type: GgmlType::IQ2_XXS } if name == "iq"),
        "{err}"
    );
    assert_eq!(gguf.tensor_data("ok").unwrap().data, pattern(16, 2));
}

#[test]
fn an_absent_tensor_is_a_typed_error() {
    let gguf = Gguf::from_bytes(rich_fixture().build()).unwrap();
    let err = gguf.tensor_data("output.weight").unwrap_err();
    assert!(matches!(&err, GgufError::TensorNotFound { name } if name == "output.weight"));
}

#[test]
fn zero_dimensional_and_empty_tensors_are_accepted() {
    let bytes = GgufBuilder::new()
        .tensor("scalar", &[], 0, pattern(4, 1))
        .tensor("empty", &[0, 7], 0, Vec::new())
        .build();
    let gguf = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(gguf.tensor_data("scalar").unwrap().data, pattern(4, 1));
    assert!(gguf.tensor_data("empty").unwrap().data.is_empty());
}
