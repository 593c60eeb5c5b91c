//! Paged storage of fixed-size token records for one stream (keys or values of one KV head).
//!
//! A page holds `tokens` records of `record_words` `u32` words plus `scales_per_token` f16
//! scales, contiguous, in the packed layout of [`TokenCodec`](crate::TokenCodec): a GPU can
//! upload a page as is. Two growth policies:
//! - [`Growth::Static`]: every page is allocated up front for `capacity` tokens; appending past
//!   it is [`CacheError::ContextOverflow`]. Nothing is allocated while decoding.
//! - [`Growth::Doubling`]: the first page holds `initial` tokens and each new page doubles the
//!   previous one (up to [`MAX_PAGE_TOKENS`]), so memory follows the context within a factor of
//!   two and growing never copies what is stored.

use half::f16;
use serde::{Deserialize, Serialize};

use crate::error::CacheError;

/// Pages never grow past this many tokens under [`Growth::Doubling`].
pub const MAX_PAGE_TOKENS: usize = 4096;

/// Page size used for statically allocated stores.
pub const STATIC_PAGE_TOKENS: usize = 1024;

/// How a store obtains memory as tokens arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Growth {
    /// Allocate for `capacity` tokens at creation; more is a context overflow.
    Static {
        /// Maximum tokens.
        capacity: usize,
    },
    /// Start with a page of `initial` tokens, double the page size with each new page.
    Doubling {
        /// Tokens in the first page (at least 1).
        initial: usize,
    },
}

/// One page of records.
#[derive(Clone, Debug, PartialEq)]
struct Page {
    first_token: usize,
    tokens: usize,
    words: Vec<u32>,
    scales: Vec<f16>,
}

/// A read-only view of the filled part of one page.
#[derive(Clone, Copy, Debug)]
pub struct PageView<'a> {
    /// Index of the page's first token in the stream.
    pub first_token: usize,
    /// Filled tokens in this page.
    pub len: usize,
    /// `len · record_words` words.
    pub words: &'a [u32],
    /// `len · scales_per_token` scales.
    pub scales: &'a [f16],
}

/// Paged records of one stream.
///
/// ```
/// use tq_cache::token_store::{Growth, TokenStore};
/// let mut store = TokenStore::new(4, 1, Growth::Doubling { initial: 2 });
/// for t in 0..5u32 {
///     let (words, scales) = store.push().unwrap();
///     words.fill(t);
///     scales[0] = half::f16::from_f32(t as f32);
/// }
/// assert_eq!(store.len(), 5);
/// assert_eq!(store.record(3).unwrap().0, &[3, 3, 3, 3]);
/// assert_eq!(store.capacity(), 2 + 4); // pages of 2 and 4 tokens
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TokenStore {
    record_words: usize,
    scales_per_token: usize,
    growth: Growth,
    pages: Vec<Page>,
    len: usize,
}

impl TokenStore {
    /// An empty store; [`Growth::Static`] allocates all its pages now.
    pub fn new(record_words: usize, scales_per_token: usize, growth: Growth) -> Self {
        let mut store = Self {
            record_words,
            scales_per_token,
            growth,
            pages: Vec::new(),
            len: 0,
        };
        if let Growth::Static { capacity } = growth {
            while store.capacity() < capacity {
                let tokens = STATIC_PAGE_TOKENS.min(capacity - store.capacity());
                store.add_page(tokens);
            }
        }
        store
    }

    fn add_page(&mut self, tokens: usize) {
        let first_token = self.capacity();
        self.pages.push(Page {
            first_token,
            tokens,
            words: vec![0; tokens * self.record_words],
            scales: vec![f16::ZERO; tokens * self.scales_per_token],
        });
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens the allocated pages can hold.
    pub fn capacity(&self) -> usize {
        self.pages.last().map_or(0, |p| p.first_token + p.tokens)
    }

    /// `u32` words per record.
    pub fn record_words(&self) -> usize {
        self.record_words
    }

    /// f16 scales per record.
    pub fn scales_per_token(&self) -> usize {
        self.scales_per_token
    }

    /// The growth policy.
    pub fn growth(&self) -> Growth {
        self.growth
    }

    /// Bytes held by the pages, measured from the buffers themselves (not from a formula).
    pub fn allocated_bytes(&self) -> usize {
        self.pages
            .iter()
            .map(|p| 4 * p.words.capacity() + 2 * p.scales.capacity())
            .sum()
    }

    /// Appends a zeroed record and returns it for the encoder to fill in place.
    pub fn push(&mut self) -> Result<(&mut [u32], &mut [f16]), CacheError> {
        if self.len == self.capacity() {
            match self.growth {
                Growth::Static { capacity } => {
                    return Err(CacheError::ContextOverflow { capacity });
                }
                Growth::Doubling { initial } => {
                    let tokens = self
                        .pages
                        .last()
                        .map_or(initial.max(1), |p| (2 * p.tokens).min(MAX_PAGE_TOKENS));
                    self.add_page(tokens);
                }
            }
        }
        self.len += 1;
        self.record_mut(self.len - 1)
    }

    fn locate(&self, token: usize) -> (usize, usize) {
        let page = self
            .pages
            .partition_point(|p| p.first_token + p.tokens <= token);
        (page, token - self.pages[page].first_token)
    }

    /// The record of token `token`, or `None` past the end.
    pub fn record(&self, token: usize) -> Option<(&[u32], &[f16])> {
        if token >= self.len {
            return None;
        }
        let (page, offset) = self.locate(token);
        let p = &self.pages[page];
        let w = self.record_words;
        let s = self.scales_per_token;
        Some((
            &p.words[offset * w..(offset + 1) * w],
            &p.scales[offset * s..(offset + 1) * s],
        ))
    }

    /// The record of token `token` for overwriting (ring buffers write slots again).
    pub fn record_mut(&mut self, token: usize) -> Result<(&mut [u32], &mut [f16]), CacheError> {
        if token >= self.len {
            return Err(CacheError::ShapeMismatch {
                what: "token index",
                expected: self.len,
                actual: token,
            });
        }
        let (page, offset) = self.locate(token);
        let w = self.record_words;
        let s = self.scales_per_token;
        let p = &mut self.pages[page];
        Ok((
            &mut p.words[offset * w..(offset + 1) * w],
            &mut p.scales[offset * s..(offset + 1) * s],
        ))
    }

    /// The longest run of consecutive records starting at token `start`, at most `max_len` long,
    /// that lies in one page: `(words, scales, tokens)`. Kernels walk the store run by run.
    pub fn run(&self, start: usize, max_len: usize) -> Option<(&[u32], &[f16], usize)> {
        if start >= self.len || max_len == 0 {
            return None;
        }
        let (page, offset) = self.locate(start);
        let p = &self.pages[page];
        let n = max_len.min(p.tokens - offset).min(self.len - start);
        let w = self.record_words;
        let s = self.scales_per_token;
        Some((
            &p.words[offset * w..(offset + n) * w],
            &p.scales[offset * s..(offset + n) * s],
            n,
        ))
    }

    /// Drops every token from `len` on. Pages stay allocated for reuse.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
        }
    }

    /// The filled part of each page, in token order.
    pub fn pages(&self) -> impl Iterator<Item = PageView<'_>> {
        let len = self.len;
        let w = self.record_words;
        let s = self.scales_per_token;
        self.pages
            .iter()
            .take_while(move |p| p.first_token < len)
            .map(move |p| {
                let filled = (len - p.first_token).min(p.tokens);
                PageView {
                    first_token: p.first_token,
                    len: filled,
                    words: &p.words[..filled * w],
                    scales: &p.scales[..filled * s],
                }
            })
    }
}
