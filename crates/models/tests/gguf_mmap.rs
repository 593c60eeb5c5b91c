//! Opening files through the memory map: the same result as parsing the bytes, a typed error
//! for a missing file, and (when the reference model is present) the model's own header.

mod gguf_common;

use gguf_common::*;
use tq_models::gguf::{GgmlType, Gguf, GgufError, WeightMemory};

#[test]
fn a_missing_or_empty_file_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.gguf");
    let err = Gguf::open(&missing).unwrap_err();
    assert!(
        matches!(&err, GgufError::Io { path, .. } if path == &missing),
        "{err}"
    );
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        Gguf::open(&empty),
        Err(GgufError::BadMagic { .. })
    ));
}

/// The reference model's header, as the brief's metadata facts state it. Skipped when the
/// model has not been fetched.
#[test]
fn the_reference_model_header_matches_its_documented_facts() {
    let Some(path) = reference_model_or_skip() else {
        return;
    };
    let gguf = Gguf::open(&path).unwrap();
    let m = gguf.metadata();
    assert_eq!(gguf.version(), 3);
    assert_eq!(m.str("general.architecture").unwrap(), "llama");
    assert_eq!(m.u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(m.u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(m.u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(m.u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(m.u32("llama.context_length").unwrap(), 8192);
    assert_eq!(m.f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(
        m.f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    assert_eq!(m.array_str("tokenizer.ggml.tokens").unwrap().len(), 49_152);
    assert_eq!(m.array_str("tokenizer.ggml.merges").unwrap().len(), 48_900);
    assert_eq!(gguf.tensors().len(), 272);
    let count = |ty| gguf.tensors().iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::F32), 61);
    let embedding = gguf.tensor_data("token_embd.weight").unwrap();
    assert_eq!(embedding.ggml_type(), GgmlType::Q8_0);
    assert_eq!(embedding.dims(), [576, 49_152]);
    assert_eq!(embedding.data.len(), 576 * 49_152 / 32 * 34);
    assert!(
        gguf.tensor_info("output.weight").is_none(),
        "embeddings are tied"
    );
    let mut total = 0;
    for info in gguf.tensors() {
        total += gguf.tensor_data(&info.name).unwrap().data.len() as u64;
    }
    assert!(gguf.data_offset() + total <= gguf.file_len());
}

#[test]
fn a_file_reads_like_its_bytes_in_every_weight_memory() {
    // Mapped, copied onto huge pages (where the kernel has them; small pages otherwise) or read
    // into a buffer: the same header, tensors, length and bytes as parsing the bytes, and the
    // form is reported.
    let bytes = rich_fixture().build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fixture.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let in_memory = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(in_memory.memory(), WeightMemory::Buffer);
    let every = [
        WeightMemory::Mapped,
        WeightMemory::HugePages,
        WeightMemory::Buffer,
    ];
    for memory in every {
        let file = Gguf::open_with(&path, memory).unwrap();
        assert_eq!(file.memory(), memory);
        assert_eq!(file.metadata(), in_memory.metadata());
        assert_eq!(file.tensors(), in_memory.tensors());
        assert_eq!(file.file_len(), in_memory.file_len());
        for info in file.tensors() {
            assert_eq!(
                file.tensor_data(&info.name).unwrap().data,
                in_memory.tensor_data(&info.name).unwrap().data,
                "{memory:?} {}",
                info.name
            );
        }
    }
    // An empty or missing file is the same typed error in every form.
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let missing = dir.path().join("absent.gguf");
    for memory in every {
        assert!(
            matches!(
                Gguf::open_with(&empty, memory),
                Err(GgufError::BadMagic { .. })
            ),
            "{memory:?}"
        );
        assert!(
            matches!(Gguf::open_with(&missing, memory), Err(GgufError::Io { .. })),
            "{memory:?}"
        );
    }
}
