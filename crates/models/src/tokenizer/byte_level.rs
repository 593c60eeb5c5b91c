//! GPT-2's byte-to-character map.
//!
//! Byte-level BPE vocabularies spell every byte as a printable character so that token strings
//! never contain spaces or control characters: the 188 printable bytes (`!`..`~`, `¡`..`¬`,
//! `®`..`ÿ`) stand for themselves, and the other 68 bytes take the characters U+0100.. in byte
//! order (so a space is `Ġ` U+0120 and a newline `Ċ` U+010A).

/// Whether GPT-2 spells byte `b` as the character with the same code point.
fn is_printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character that stands for each byte.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[usize::from(b)] = if is_printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
    }
    table
}

/// The byte a character stands for, `None` for characters outside the map. All mapped
/// characters are below U+0144, so a small array serves as the inverse.
pub(crate) struct CharToByte([Option<u8>; 0x144]);

impl CharToByte {
    pub(crate) fn new() -> Self {
        let mut inverse = [None; 0x144];
        for (b, c) in byte_to_char_table().iter().enumerate() {
            inverse[*c as usize] = u8::try_from(b).ok();
        }
        CharToByte(inverse)
    }

    pub(crate) fn get(&self, c: char) -> Option<u8> {
        self.0.get(c as usize).copied().flatten()
    }

    /// The bytes a byte-level token string stands for. A character outside the map (which only
    /// a hand-made vocabulary would contain) contributes its own UTF-8 bytes, so every token
    /// still has a piece.
    pub(crate) fn decode_token(&self, token: &str) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(token.len());
        for c in token.chars() {
            match self.get(c) {
                Some(b) => bytes.push(b),
                None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_a_bijection_with_gpt2_landmarks() {
        let table = byte_to_char_table();
        let inverse = CharToByte::new();
        for b in 0..=255u8 {
            assert_eq!(inverse.get(table[usize::from(b)]), Some(b));
        }
        let distinct: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
        assert_eq!(table[usize::from(b'\t')], 'ĉ');
        assert_eq!(table[0], 'Ā');
        assert_eq!(table[0xAD], 'Ń');
        assert_eq!(table[usize::from(b'A')], 'A');
    }

    #[test]
    fn tokens_decode_to_their_bytes() {
        let inverse = CharToByte::new();
        assert_eq!(inverse.decode_token("Ġhello"), b" hello");
        // "é" is the two bytes C3 A9, spelled "Ã©".
        assert_eq!(inverse.decode_token("Ã©"), "é".as_bytes());
        // Outside the map: the character's own UTF-8.
        assert_eq!(inverse.decode_token("€"), "€".as_bytes());
    }
}
