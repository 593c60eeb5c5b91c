//! Pack/unpack round trips of the b-bit code layout, for every width and odd lengths.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::codec::CodecError;
use tq_cache::codec::packing::{code_at, pack, unpack, words_for};

fn config() -> Config {
    Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x7a11_c0de),
        failure_persistence: None,
        ..Config::default()
    }
}

fn codes_and_bits() -> impl Strategy<Value = (u8, Vec<u8>)> {
    (1u8..=8).prop_flat_map(|bits| {
        let max = ((1u16 << bits) - 1) as u8;
        (Just(bits), prop::collection::vec(0..=max, 0..300))
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn round_trip_every_width_and_length((bits, codes) in codes_and_bits()) {
        let mut words = vec![0u32; words_for(codes.len(), bits)];
        pack(&codes, bits, &mut words).unwrap();
        let mut back = vec![0u8; codes.len()];
        unpack(&words, bits, &mut back).unwrap();
        prop_assert_eq!(&back, &codes);
        for (i, &c) in codes.iter().enumerate() {
            prop_assert_eq!(code_at(&words, bits, i), Some(c));
        }
        // The bits past the last code stay zero, so equal codes always give equal words.
        let used = codes.len() * bits as usize;
        if !used.is_multiple_of(32) {
            let last = *words.last().unwrap();
            prop_assert_eq!(last >> (used % 32), 0);
        }
    }

    #[test]
    fn layout_is_little_endian_bit_stream((bits, codes) in codes_and_bits()) {
        let mut words = vec![0u32; words_for(codes.len(), bits)];
        pack(&codes, bits, &mut words).unwrap();
        // Rebuild the stream bit by bit: bit k of the stream is bit k % 32 of word k / 32.
        for (j, &c) in codes.iter().enumerate() {
            for i in 0..bits as usize {
                let k = j * bits as usize + i;
                let bit = (words[k / 32] >> (k % 32)) & 1;
                prop_assert_eq!(bit, u32::from((c >> i) & 1));
            }
        }
    }
}

#[test]
fn rejects_bad_widths_lengths_and_codes() {
    let mut words = vec![0u32; 1];
    assert!(matches!(
        pack(&[0], 0, &mut words),
        Err(CodecError::UnsupportedBits { bits: 0, .. })
    ));
    assert!(matches!(
        pack(&[0], 9, &mut words),
        Err(CodecError::UnsupportedBits { bits: 9, .. })
    ));
    assert!(matches!(
        pack(&[8], 3, &mut words),
        Err(CodecError::CodeOutOfRange { code: 8, bits: 3 })
    ));
    assert!(matches!(
        pack(&[1; 40], 1, &mut words),
        Err(CodecError::LengthMismatch { .. })
    ));
    let mut codes = [0u8; 40];
    assert!(matches!(
        unpack(&words, 1, &mut codes),
        Err(CodecError::LengthMismatch { .. })
    ));
    assert_eq!(code_at(&words, 4, 8), None);
    assert_eq!(code_at(&words, 0, 0), None);
}
