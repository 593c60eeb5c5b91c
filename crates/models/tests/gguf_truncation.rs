//! Robustness: every prefix of a valid file is refused with an error, and random corruption
//! never panics.

mod gguf_common;

use gguf_common::*;
use proptest::prelude::*;
use tq_models::gguf::Gguf;

/// Cutting the rich fixture (every metadata type, nested arrays, seven tensors) at every
/// length short of the whole file: the file ends exactly where the last tensor's data ends, so
/// every cut removes something the header promises and must be an error, never a panic.
#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let bytes = rich_fixture().build();
    Gguf::from_bytes(bytes.clone()).expect("the whole file parses");
    for len in 0..bytes.len() {
        let result = Gguf::from_bytes(bytes[..len].to_vec());
        assert!(
            result.is_err(),
            "a file cut to {len} of {} bytes parsed",
            bytes.len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Overwriting a few bytes anywhere (counts, lengths, type ids, offsets alike) and cutting
    /// the file anywhere: parsing returns `Ok` or `Err`, and whatever parses serves every tensor
    /// access without panicking.
    #[test]
    fn corrupted_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = rich_fixture().build();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep.max(bytes.len() / 2));
        if let Ok(gguf) = Gguf::from_bytes(bytes) {
            for info in gguf.tensors() {
                if let Ok(view) = gguf.tensor_data(&info.name) {
                    prop_assert_eq!(Some(view.data.len() as u64), info.byte_size());
                }
            }
        }
    }

    /// Arbitrary bytes behind a valid magic and version never panic.
    #[test]
    fn random_headers_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(tail);
        let _ = Gguf::from_bytes(bytes);
    }
}
