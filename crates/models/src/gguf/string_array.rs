//! [`StringArray`]: a metadata array of strings packed into one buffer.

use std::fmt;

/// An array of strings stored as one UTF-8 buffer and the end offset of each string.
///
/// A model's vocabulary and merges are two arrays of about 50 000 short strings each. As a
/// `Vec<String>` every one of them is a heap allocation of its own (24 bytes of header plus the
/// allocator's rounding and bookkeeping for a string of 6 bytes on average): about 6 MiB
/// resident for SmolLM2's 98 000 strings, more than half of the program's fixed footprint. Packed,
/// they take their bytes plus 8 bytes of offset each (about 1.4 MiB), in two allocations.
///
/// ```
/// use tq_models::gguf::StringArray;
///
/// let merges: StringArray = ["Ġ t", "Ġ a", "h e"].into_iter().collect();
/// assert_eq!(merges.len(), 3);
/// assert_eq!(merges.get(1), Some("Ġ a"));
/// assert_eq!(merges.iter().collect::<Vec<_>>(), ["Ġ t", "Ġ a", "h e"]);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StringArray {
    bytes: String,
    ends: Vec<usize>,
}

impl StringArray {
    /// An empty array with room for `count` strings of `bytes` bytes in all.
    pub fn with_capacity(count: usize, bytes: usize) -> Self {
        Self {
            bytes: String::with_capacity(bytes),
            ends: Vec::with_capacity(count),
        }
    }

    /// Appends a string.
    pub fn push(&mut self, value: &str) {
        self.bytes.push_str(value);
        self.ends.push(self.bytes.len());
    }

    /// Frees the spare capacity of the buffer and the offsets.
    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the array holds no string.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `index`, if in range.
    pub fn get(&self, index: usize) -> Option<&str> {
        let end = *self.ends.get(index)?;
        let start = match index {
            0 => 0,
            i => self.ends[i - 1],
        };
        // Ends are pushed after whole strings, so both lie on character boundaries.
        Some(&self.bytes[start..end])
    }

    /// The strings in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Owned copies of the strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }

    /// Bytes held on the heap (buffer and offsets, by capacity).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * size_of::<usize>()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut array = Self::default();
        for s in iter {
            array.push(s.as_ref());
        }
        array
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
