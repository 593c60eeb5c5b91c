//! Paged storage of fixed-size token records for one stream (keys or values of one KV head).
//!
//! A page holds `tokens` records of `record_words` `u32` words plus `scales_per_token` f16
//! scales, contiguous, in the packed layout of [`TokenCodec`](crate::TokenCodec): a GPU can
//! upload a page as is. Two growth policies:
//! - [`Growth::Static`]: every page is allocated up front for `capacity` tokens, in one buffer
//!   (the pages are consecutive views of it); appending past it is
//!   [`CacheError::ContextOverflow`]. Nothing is allocated while decoding.
//! - [`Growth::Doubling`]: the first page holds `initial` tokens and each new page doubles the
//!   previous one (up to [`MAX_PAGE_TOKENS`]), so memory follows the context within a factor of
//!   two and growing never copies what is stored.
//!
//! Why one buffer for a static store rather than one per page: a page's buffer is a whole
//! number of memory pages (1024 records of 512 or 192 bytes), and the system allocator puts
//! its bookkeeping in front of a large block, so every such buffer took one more resident
//! memory page than its records — 4 KiB per 1024 tokens per stream, resident memory no buffer
//! accounted for (`tq bench e2e`'s "other" column: 0.8 MiB at 32K tokens on Gemma 3, 4.9 MiB
//! at 8K on SmolLM2's f16 cache).
//! One buffer per store pays that once. The page boundaries, and with them the runs the
//! kernels walk and every result, are the same either way.

use std::borrow::Cow;

use half::f16;
use serde::{Deserialize, Serialize};

use crate::error::CacheError;
use crate::record_order::{self, BitPlanes, FAST_SCAN_BLOCK, RecordOrder};

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

/// One page of records: `tokens` records from record `offset` of buffer `buffer`.
#[derive(Clone, Debug, PartialEq)]
struct Page {
    first_token: usize,
    tokens: usize,
    buffer: usize,
    offset: usize,
}

/// Memory holding the records of one or more consecutive pages: `words` in
/// [`RecordOrder::Rows`], `codes` (whole blocks of 32 records) in [`RecordOrder::FastScan`].
#[derive(Clone, Debug, PartialEq)]
struct Buffer {
    words: Vec<u32>,
    codes: Vec<u8>,
    scales: Vec<f16>,
}

/// Consecutive records as a store holds them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RunRecords<'a> {
    /// [`RecordOrder::Rows`]: `tokens · record_words` words, record after record.
    Rows(&'a [u32]),
    /// [`RecordOrder::FastScan`]: the whole blocks of 32 records that cover the run
    /// ([`crate::record_order`]); the run's first record is slot `lead` of the
    /// first block. Slots outside the run hold other (or stale) records.
    FastScan {
        /// The blocks' bytes.
        codes: &'a [u8],
        /// The slot of the run's first record in its block.
        lead: usize,
    },
}

/// A read-only view of the filled part of one page.
#[derive(Clone, Copy, Debug)]
pub struct PageView<'a> {
    /// Index of the page's first token in the stream.
    pub first_token: usize,
    /// Filled tokens in this page.
    pub len: usize,
    /// The `len` records, in the store's order.
    pub records: RunRecords<'a>,
    /// `len · scales_per_token` scales.
    pub scales: &'a [f16],
}

/// Paged records of one stream.
///
/// ```
/// use tq_cache::token_store::{Growth, TokenStore};
/// let mut store = TokenStore::new(4, 1, Growth::Doubling { initial: 2 })?;
/// for t in 0..5u32 {
///     let (words, scales) = store.push().unwrap();
///     words.fill(t);
///     scales[0] = half::f16::from_f32(t as f32);
/// }
/// assert_eq!(store.len(), 5);
/// assert_eq!(store.record(3).unwrap().0, &[3, 3, 3, 3]);
/// assert_eq!(store.capacity(), 2 + 4); // pages of 2 and 4 tokens
/// # Ok::<(), tq_cache::CacheError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TokenStore {
    record_words: usize,
    scales_per_token: usize,
    order: RecordOrder,
    /// Records allocated in whole blocks of 32 in either order ([`in_blocks`](Self::in_blocks)),
    /// always in the fast-scan order.
    whole_blocks: bool,
    growth: Growth,
    buffers: Vec<Buffer>,
    pages: Vec<Page>,
    len: usize,
    /// The bit planes of a fast-scan store whose records hold codes of other widths than 1, 2
    /// and 4 bits ([`set_planes`](Self::set_planes)); `None`: records are their own nibbles.
    planes: Option<std::sync::Arc<BitPlanes>>,
}

/// Record words permuted on the stack when written through bit planes (longer records use the
/// heap).
const PERMUTED_ON_STACK: usize = 64;

/// `growth` for a store of whole blocks: a doubling store's first page rounded up to a
/// multiple of 32 tokens, so every page (each its own buffer) is whole blocks.
fn block_growth(growth: Growth) -> Growth {
    match growth {
        Growth::Doubling { initial } => Growth::Doubling {
            initial: initial.max(1).next_multiple_of(FAST_SCAN_BLOCK),
        },
        growth => growth,
    }
}

impl TokenStore {
    /// An empty store of records in [`RecordOrder::Rows`]; [`Growth::Static`] allocates all
    /// its pages now.
    ///
    /// Fails with [`CacheError::StorageTooLarge`] when a static store's bytes overflow `usize`
    /// or the allocator cannot provide them (a model file or allocation asking for billions
    /// of records gets that error, not an aborted process).
    pub fn new(
        record_words: usize,
        scales_per_token: usize,
        growth: Growth,
    ) -> Result<Self, CacheError> {
        Self::with_order(record_words, scales_per_token, growth, RecordOrder::Rows)
    }

    /// An empty store of records in `order`. A [`RecordOrder::FastScan`] store allocates
    /// whole blocks of 32 records: a static capacity is rounded up to a multiple of 32 in
    /// memory (not in [`capacity`](Self::capacity)), and a doubling store's first page to a
    /// multiple of 32 tokens, so every page starts at a block.
    ///
    /// ```
    /// use tq_cache::record_order::RecordOrder;
    /// use tq_cache::token_store::{Growth, RunRecords, TokenStore};
    /// let mut store = TokenStore::with_order(1, 1, Growth::Doubling { initial: 8 }, RecordOrder::FastScan)?;
    /// for t in 0..40u32 {
    ///     store.push_record(&[t.wrapping_mul(0x0101_0101)], &[half::f16::ONE])?;
    /// }
    /// assert_eq!(&*store.record_copy(33).unwrap().0, &[0x2121_2121]);
    /// let (records, _, n) = store.records(20, 100).unwrap();
    /// assert_eq!(n, 12); // to the end of the first page (32 tokens)
    /// assert!(matches!(records, RunRecords::FastScan { lead: 20, .. }));
    /// # Ok::<(), tq_cache::CacheError>(())
    /// ```
    pub fn with_order(
        record_words: usize,
        scales_per_token: usize,
        growth: Growth,
        order: RecordOrder,
    ) -> Result<Self, CacheError> {
        Self::build(record_words, scales_per_token, growth, order, false)
    }

    /// An empty store of records in `order` whose memory is whole blocks of 32 records in
    /// either order, as a fast-scan store's is: its bytes stay the same when it changes order
    /// ([`reorder`](Self::reorder)), which a stream that may change order with its codec needs
    /// for a memory formula that does not depend on the codec it was fitted with.
    ///
    /// ```
    /// use tq_cache::record_order::RecordOrder;
    /// use tq_cache::token_store::{Growth, TokenStore};
    /// let rows = TokenStore::in_blocks(1, 1, Growth::Static { capacity: 40 }, RecordOrder::Rows)?;
    /// let mut fast = rows.clone();
    /// fast.reorder(RecordOrder::FastScan)?;
    /// assert_eq!((rows.record_slots(), rows.allocated_bytes()), (64, fast.allocated_bytes()));
    /// # Ok::<(), tq_cache::CacheError>(())
    /// ```
    pub fn in_blocks(
        record_words: usize,
        scales_per_token: usize,
        growth: Growth,
        order: RecordOrder,
    ) -> Result<Self, CacheError> {
        Self::build(record_words, scales_per_token, growth, order, true)
    }

    fn build(
        record_words: usize,
        scales_per_token: usize,
        growth: Growth,
        order: RecordOrder,
        whole_blocks: bool,
    ) -> Result<Self, CacheError> {
        let whole_blocks = whole_blocks || order == RecordOrder::FastScan;
        let growth = if whole_blocks {
            block_growth(growth)
        } else {
            growth
        };
        let mut store = Self {
            record_words,
            scales_per_token,
            whole_blocks,
            order,
            growth,
            buffers: Vec::new(),
            pages: Vec::new(),
            len: 0,
            planes: None,
        };
        if let Growth::Static { capacity } = growth
            && capacity > 0
        {
            store.check_fits(capacity)?;
            store.add_buffer(capacity);
            let mut first_token = 0;
            while first_token < capacity {
                let tokens = STATIC_PAGE_TOKENS.min(capacity - first_token);
                store.pages.push(Page {
                    first_token,
                    tokens,
                    buffer: 0,
                    offset: first_token,
                });
                first_token += tokens;
            }
        }
        Ok(store)
    }

    /// Changes an empty store's record order, keeping its pages: each buffer is allocated
    /// again, zeroed, for the same tokens in `order` (whole blocks of 32 records in
    /// [`RecordOrder::FastScan`]). A cleared stream whose codec changes order with its
    /// calibration keeps the memory it grew this way, as a stream that keeps its order does.
    ///
    /// A store built [`in_blocks`](Self::in_blocks) (or in the fast-scan order) keeps the same
    /// bytes either way; another one allocates whole blocks from its first change to the
    /// fast-scan order on.
    ///
    /// Fails with [`CacheError::InvalidConfig`] when the store holds tokens, and with
    /// [`CacheError::StorageTooLarge`] when the memory cannot be had; on error nothing
    /// changes.
    ///
    /// ```
    /// use tq_cache::record_order::RecordOrder;
    /// use tq_cache::token_store::{Growth, TokenStore};
    /// let mut store = TokenStore::new(2, 1, Growth::Doubling { initial: 32 })?;
    /// for _ in 0..40 {
    ///     store.push_record(&[7, 7], &[half::f16::ONE])?;
    /// }
    /// store.truncate(0);
    /// store.reorder(RecordOrder::FastScan)?;
    /// assert_eq!((store.order(), store.capacity()), (RecordOrder::FastScan, 32 + 64));
    /// # Ok::<(), tq_cache::CacheError>(())
    /// ```
    pub fn reorder(&mut self, order: RecordOrder) -> Result<(), CacheError> {
        if !self.is_empty() {
            return Err(CacheError::InvalidConfig(
                "only an empty token store changes its record order".into(),
            ));
        }
        if order == self.order {
            return Ok(());
        }
        let mut tokens = vec![0usize; self.buffers.len()];
        for page in &self.pages {
            tokens[page.buffer] = tokens[page.buffer].max(page.offset + page.tokens);
        }
        let whole_blocks = self.whole_blocks || order == RecordOrder::FastScan;
        let mut reordered = Self {
            buffers: Vec::with_capacity(tokens.len()),
            pages: Vec::new(),
            ..Self::build(
                self.record_words,
                self.scales_per_token,
                Growth::Doubling { initial: 1 },
                order,
                whole_blocks,
            )?
        };
        for &n in &tokens {
            reordered.check_fits(n)?;
        }
        for &n in &tokens {
            reordered.add_buffer(n);
        }
        self.order = order;
        self.whole_blocks = whole_blocks;
        if whole_blocks {
            self.growth = block_growth(self.growth);
        }
        self.buffers = reordered.buffers;
        Ok(())
    }

    /// Stores the records of this (empty) store as `planes` permutes them in the fast-scan
    /// order ([`BitPlanes`]: codes of 3 and 5 to 8 bits as bit planes), or as their own
    /// nibbles (`None`). Records read back as written either way (padding bits of the planes'
    /// runs as zero, as codecs write them); rows stores ignore it. Planes for records of
    /// another length, or new planes on a store that holds tokens, are an error.
    ///
    /// ```
    /// use tq_cache::record_order::{BitPlanes, CodeRun, RecordOrder};
    /// use tq_cache::token_store::{Growth, TokenStore};
    /// let run = CodeRun { bits: 3, dim: 8, first_word: 0, words: 1 };
    /// let planes = BitPlanes::new(1, &[run]).unwrap();
    /// let mut store = TokenStore::with_order(1, 1, Growth::Static { capacity: 32 }, RecordOrder::FastScan)?;
    /// store.set_planes(planes)?;
    /// store.push_record(&[0x00AB_CDEF], &[half::f16::ONE])?;
    /// assert_eq!(&*store.record_copy(0).unwrap().0, &[0x00AB_CDEF]);
    /// // Planes of two-word records do not fit this store's one-word records.
    /// let wide = CodeRun { bits: 3, dim: 16, first_word: 0, words: 2 };
    /// assert!(store.set_planes(BitPlanes::new(2, &[wide]).unwrap()).is_err());
    /// # Ok::<(), tq_cache::CacheError>(())
    /// ```
    pub fn set_planes(&mut self, planes: Option<BitPlanes>) -> Result<(), CacheError> {
        if let Some(p) = &planes
            && p.record_words() != self.record_words
        {
            return Err(CacheError::ShapeMismatch {
                what: "bit planes' record words",
                expected: self.record_words,
                actual: p.record_words(),
            });
        }
        if !self.is_empty() && planes.as_ref() != self.planes.as_deref() {
            return Err(CacheError::InvalidConfig(
                "only an empty token store changes its bit planes".into(),
            ));
        }
        self.planes = planes.map(std::sync::Arc::new);
        Ok(())
    }

    /// The bit planes of the records ([`set_planes`](Self::set_planes)).
    pub fn planes(&self) -> Option<&BitPlanes> {
        self.planes.as_deref()
    }

    /// Whether `tokens` records can be allocated: their word and scale counts fit `usize`
    /// and the allocator grants that many bytes. The probe allocation is returned at once;
    /// [`add_buffer`](Self::add_buffer) then allocates zeroed memory, which the system maps
    /// lazily (a static store's untouched pages cost no resident memory, which a probe that
    /// wrote zeros would lose).
    fn check_fits(&self, tokens: usize) -> Result<(), CacheError> {
        let too_large = || CacheError::StorageTooLarge {
            tokens,
            // Saturating: this reports sizes that overflow, and must not overflow itself.
            bytes_per_record: self
                .record_words
                .saturating_mul(4)
                .saturating_add(self.scales_per_token.saturating_mul(2)),
        };
        // A fast-scan buffer holds whole blocks (and a rows buffer of a store in blocks).
        let blocks = if self.whole_blocks {
            tokens
                .checked_next_multiple_of(FAST_SCAN_BLOCK)
                .ok_or_else(too_large)?
        } else {
            tokens
        };
        let words = blocks
            .checked_mul(self.record_words)
            .ok_or_else(too_large)?;
        let scales = tokens
            .checked_mul(self.scales_per_token)
            .ok_or_else(too_large)?;
        Vec::<u32>::new()
            .try_reserve_exact(words)
            .map_err(|_| too_large())?;
        Vec::<f16>::new()
            .try_reserve_exact(scales)
            .map_err(|_| too_large())?;
        Ok(())
    }

    /// Allocates a zeroed buffer of `tokens` records (whole blocks of them in the fast-scan
    /// order); returns its index.
    fn add_buffer(&mut self, tokens: usize) -> usize {
        let slots = if self.whole_blocks {
            tokens.next_multiple_of(FAST_SCAN_BLOCK)
        } else {
            tokens
        };
        let (words, codes) = match self.order {
            RecordOrder::Rows => (vec![0; slots * self.record_words], Vec::new()),
            RecordOrder::FastScan => (
                Vec::new(),
                vec![
                    0;
                    tokens.div_ceil(FAST_SCAN_BLOCK) * record_order::block_bytes(self.record_words)
                ],
            ),
        };
        self.buffers.push(Buffer {
            words,
            codes,
            scales: vec![f16::ZERO; tokens * self.scales_per_token],
        });
        self.buffers.len() - 1
    }

    /// Appends a page of `tokens` records with a buffer of its own.
    fn add_page(&mut self, tokens: usize) {
        let first_token = self.capacity();
        let buffer = self.add_buffer(tokens);
        self.pages.push(Page {
            first_token,
            tokens,
            buffer,
            offset: 0,
        });
    }

    /// Records `from..from + n` of page `page` (in that page's buffer). Fast-scan pages start
    /// at a block (`offset` a multiple of 32), so a record's slot is its index mod 32.
    fn slices(&self, page: usize, from: usize, n: usize) -> (RunRecords<'_>, &[f16]) {
        let p = &self.pages[page];
        let b = &self.buffers[p.buffer];
        let (w, s) = (self.record_words, self.scales_per_token);
        let first = p.offset + from;
        let records = match self.order {
            RecordOrder::Rows => RunRecords::Rows(&b.words[first * w..(first + n) * w]),
            RecordOrder::FastScan => {
                let bytes = record_order::block_bytes(w);
                let blocks = first / FAST_SCAN_BLOCK..(first + n).div_ceil(FAST_SCAN_BLOCK);
                RunRecords::FastScan {
                    codes: &b.codes[blocks.start * bytes..blocks.end * bytes],
                    lead: first % FAST_SCAN_BLOCK,
                }
            }
        };
        (records, &b.scales[first * s..(first + n) * s])
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

    /// Record slots the buffers hold: the [`capacity`](Self::capacity), each buffer rounded
    /// up to whole blocks of 32 records in the [`RecordOrder::FastScan`] order or in a store
    /// [`in_blocks`](Self::in_blocks) (a static store's one buffer, or each page of a doubling
    /// one), from the pages.
    ///
    /// ```
    /// use tq_cache::record_order::RecordOrder;
    /// use tq_cache::token_store::{Growth, TokenStore};
    /// let store = TokenStore::with_order(1, 1, Growth::Static { capacity: 40 }, RecordOrder::FastScan)?;
    /// assert_eq!((store.capacity(), store.record_slots()), (40, 64));
    /// # Ok::<(), tq_cache::CacheError>(())
    /// ```
    pub fn record_slots(&self) -> usize {
        if !self.whole_blocks {
            return self.capacity();
        }
        let mut slots = 0;
        let mut buffer = (usize::MAX, 0usize);
        for page in &self.pages {
            if page.buffer != buffer.0 {
                slots += buffer.1.next_multiple_of(FAST_SCAN_BLOCK);
                buffer = (page.buffer, 0);
            }
            buffer.1 += page.tokens;
        }
        slots + buffer.1.next_multiple_of(FAST_SCAN_BLOCK)
    }

    /// `u32` words per record.
    pub fn record_words(&self) -> usize {
        self.record_words
    }

    /// f16 scales per record.
    pub fn scales_per_token(&self) -> usize {
        self.scales_per_token
    }

    /// The memory order of the records.
    pub fn order(&self) -> RecordOrder {
        self.order
    }

    /// The growth policy.
    pub fn growth(&self) -> Growth {
        self.growth
    }

    /// Bytes held by the pages, measured from the buffers themselves (not from a formula).
    pub fn allocated_bytes(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| 4 * b.words.capacity() + b.codes.capacity() + 2 * b.scales.capacity())
            .sum()
    }

    /// Appends a zeroed record and returns it for the encoder to fill in place
    /// ([`RecordOrder::Rows`] only: a fast-scan store takes whole records, [`push_record`](Self::push_record)).
    pub fn push(&mut self) -> Result<(&mut [u32], &mut [f16]), CacheError> {
        self.rows_only()?;
        self.grow()?;
        self.len += 1;
        self.record_mut(self.len - 1)
    }

    /// Appends a copy of `words` (`record_words`) and `scales` (`scales_per_token`).
    pub fn push_record(&mut self, words: &[u32], scales: &[f16]) -> Result<(), CacheError> {
        self.check_record(words, scales)?;
        self.grow()?;
        self.len += 1;
        self.write_record(self.len - 1, words, scales)
    }

    /// Overwrites the record of token `token` (< len) with `words` and `scales`.
    pub fn write_record(
        &mut self,
        token: usize,
        words: &[u32],
        scales: &[f16],
    ) -> Result<(), CacheError> {
        self.check_record(words, scales)?;
        if self.order == RecordOrder::Rows {
            let (w, s) = self.record_mut(token)?;
            w.copy_from_slice(words);
            s.copy_from_slice(scales);
            return Ok(());
        }
        let (buffer, first) = self.buffer_slot(token)?;
        let (rw, spt) = (self.record_words, self.scales_per_token);
        let b = &mut self.buffers[buffer];
        let bytes = record_order::block_bytes(rw);
        let block = first / FAST_SCAN_BLOCK;
        let block = &mut b.codes[block * bytes..(block + 1) * bytes];
        match &self.planes {
            None => record_order::scatter(words, first % FAST_SCAN_BLOCK, block),
            Some(planes) => {
                let mut stack = [0u32; PERMUTED_ON_STACK];
                let mut heap = Vec::new();
                let permuted = if rw <= PERMUTED_ON_STACK {
                    &mut stack[..rw]
                } else {
                    heap.resize(rw, 0);
                    &mut heap[..]
                };
                planes.permute(words, permuted);
                record_order::scatter(permuted, first % FAST_SCAN_BLOCK, block);
            }
        }
        b.scales[first * spt..(first + 1) * spt].copy_from_slice(scales);
        Ok(())
    }

    fn check_record(&self, words: &[u32], scales: &[f16]) -> Result<(), CacheError> {
        for (what, expected, actual) in [
            ("record words", self.record_words, words.len()),
            ("record scales", self.scales_per_token, scales.len()),
        ] {
            if expected != actual {
                return Err(CacheError::ShapeMismatch {
                    what,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }

    fn rows_only(&self) -> Result<(), CacheError> {
        match self.order {
            RecordOrder::Rows => Ok(()),
            RecordOrder::FastScan => Err(CacheError::InvalidConfig(
                "a fast-scan store has no record to borrow in place: write whole records".into(),
            )),
        }
    }

    /// `(buffer, record index within it)` of token `token` (< len).
    fn buffer_slot(&self, token: usize) -> Result<(usize, usize), CacheError> {
        if token >= self.len {
            return Err(CacheError::ShapeMismatch {
                what: "token index",
                expected: self.len,
                actual: token,
            });
        }
        let (page, offset) = self.locate(token);
        let p = &self.pages[page];
        Ok((p.buffer, p.offset + offset))
    }

    /// Makes room for one more record.
    fn grow(&mut self) -> Result<(), CacheError> {
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
        Ok(())
    }

    fn locate(&self, token: usize) -> (usize, usize) {
        let page = self
            .pages
            .partition_point(|p| p.first_token + p.tokens <= token);
        (page, token - self.pages[page].first_token)
    }

    /// The record of token `token` ([`RecordOrder::Rows`]), or `None` past the end or in a
    /// fast-scan store, whose records are read with [`record_copy`](Self::record_copy).
    pub fn record(&self, token: usize) -> Option<(&[u32], &[f16])> {
        match self.record_copy(token)? {
            (Cow::Borrowed(words), scales) => Some((words, scales)),
            (Cow::Owned(_), _) => None,
        }
    }

    /// The record of token `token`, or `None` past the end: borrowed in
    /// [`RecordOrder::Rows`], gathered from its block in [`RecordOrder::FastScan`].
    pub fn record_copy(&self, token: usize) -> Option<(Cow<'_, [u32]>, &[f16])> {
        if token >= self.len {
            return None;
        }
        let (page, offset) = self.locate(token);
        match self.slices(page, offset, 1) {
            (RunRecords::Rows(words), scales) => Some((Cow::Borrowed(words), scales)),
            (RunRecords::FastScan { codes, lead }, scales) => {
                let mut words = vec![0u32; self.record_words];
                record_order::gather(codes, lead, &mut words);
                if let Some(planes) = &self.planes {
                    let permuted = words.clone();
                    planes.restore(&permuted, &mut words);
                }
                Some((Cow::Owned(words), scales))
            }
        }
    }

    /// The record of token `token` for overwriting in place (ring buffers write slots again;
    /// [`RecordOrder::Rows`] only, see [`write_record`](Self::write_record)).
    pub fn record_mut(&mut self, token: usize) -> Result<(&mut [u32], &mut [f16]), CacheError> {
        self.rows_only()?;
        let (buffer, first) = self.buffer_slot(token)?;
        let (w, s) = (self.record_words, self.scales_per_token);
        let b = &mut self.buffers[buffer];
        Ok((
            &mut b.words[first * w..(first + 1) * w],
            &mut b.scales[first * s..(first + 1) * s],
        ))
    }

    /// [`records`](Self::records) of a [`RecordOrder::Rows`] store, as words (`None` in a
    /// fast-scan store).
    pub fn run(&self, start: usize, max_len: usize) -> Option<(&[u32], &[f16], usize)> {
        match self.records(start, max_len)? {
            (RunRecords::Rows(words), scales, n) => Some((words, scales, n)),
            (RunRecords::FastScan { .. }, ..) => None,
        }
    }

    /// The longest run of consecutive records starting at token `start`, at most `max_len` long,
    /// that lies in one page: `(records, scales, tokens)`. Kernels walk the store run by run.
    pub fn records(&self, start: usize, max_len: usize) -> Option<(RunRecords<'_>, &[f16], usize)> {
        if start >= self.len || max_len == 0 {
            return None;
        }
        let (page, offset) = self.locate(start);
        let n = max_len
            .min(self.pages[page].tokens - offset)
            .min(self.len - start);
        let (records, scales) = self.slices(page, offset, n);
        Some((records, scales, n))
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
        self.pages
            .iter()
            .enumerate()
            .take_while(move |(_, p)| p.first_token < len)
            .map(move |(i, p)| {
                let filled = (len - p.first_token).min(p.tokens);
                let (records, scales) = self.slices(i, 0, filled);
                PageView {
                    first_token: p.first_token,
                    len: filled,
                    records,
                    scales,
                }
            })
    }
}
