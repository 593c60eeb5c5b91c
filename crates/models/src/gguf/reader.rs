//! A bounds-checked little-endian cursor over the bytes of a GGUF file.
//!
//! Every read checks the remaining length first and reports what it was reading, so the parser
//! above never indexes the buffer itself.

use super::error::{GgufError, Result};

/// A position in a byte slice; reads advance it.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `bytes`.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// The current offset from the start of the buffer.
    pub(crate) fn position(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the current position.
    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// The next `n` bytes, or `Truncated` naming `what` if fewer remain.
    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                what,
                offset: self.position(),
                needed: n,
                available,
            });
        }
        // `n <= remaining`, which fits in usize, so the cast and the slice are in bounds.
        let n = n as usize;
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    /// The next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: a u64 byte length, then that many UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String> {
        self.str(what).map(str::to_owned)
    }

    /// A length-prefixed UTF-8 string, borrowed from the buffer.
    pub(crate) fn str(&mut self, what: &'static str) -> Result<&'a str> {
        let len = self.u64(what)?;
        let start = self.position();
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what,
            offset: start,
        })
    }

    /// Checks that `count` elements of at least `min_size` bytes each can fit in what remains,
    /// before anything is allocated for them.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &'static str,
        count_offset: u64,
    ) -> Result<usize> {
        let min_bytes = count.saturating_mul(min_size);
        let available = self.remaining();
        if min_bytes > available {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset: count_offset,
                min_bytes,
                available,
            });
        }
        // `count <= remaining bytes` (every element takes at least one byte), so it fits usize.
        Ok(count as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_are_typed_errors() {
        let mut reader = Reader::new(&[1, 0, 0]);
        assert!(matches!(
            reader.u32("field"),
            Err(GgufError::Truncated {
                what: "field",
                offset: 0,
                needed: 4,
                available: 3
            })
        ));
        assert_eq!(reader.u8("byte").unwrap(), 1);
        assert_eq!(reader.position(), 1);
    }

    #[test]
    fn a_huge_string_length_is_refused_without_allocating() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"abc");
        let mut reader = Reader::new(&bytes);
        assert!(matches!(
            reader.string("key"),
            Err(GgufError::Truncated {
                needed: u64::MAX,
                ..
            })
        ));
    }

    #[test]
    fn counts_are_checked_against_the_remaining_bytes() {
        let reader = Reader::new(&[0; 16]);
        assert_eq!(reader.check_count(4, 4, "x", 0).unwrap(), 4);
        assert!(matches!(
            reader.check_count(5, 4, "x", 0),
            Err(GgufError::CountTooLarge { min_bytes: 20, .. })
        ));
        assert!(matches!(
            reader.check_count(u64::MAX, 8, "x", 0),
            Err(GgufError::CountTooLarge {
                min_bytes: u64::MAX,
                ..
            })
        ));
    }
}
