//! Heavy hitters: tokens that drew much attention while in a stream's recent window keep their
//! window copy when they leave it.
//!
//! Why: a recent window reads its tokens from 8-bit (or f16) copies and every older token from
//! its codes. Some old tokens matter far more than the rest — in a needle-in-a-haystack prompt,
//! the needle's own tokens — and their codes' error is what loses the answer
//! (`docs/results.md`, "What keeping the needle's own tokens exact would buy"). Which tokens
//! those are shows already while they are in the window: the queries of the tokens that follow
//! give them much more than the uniform share of attention. A stream with a policy
//! ([`StreamLayout::heavy_hitters`](crate::stream::StreamLayout::heavy_hitters), factor `f`)
//! adds up, for each token in its window, the attention `p_r(t)` each query row `r` that reads
//! it there gives it (the mean over the KV head's query heads) and the uniform share `1/|V_r|`
//! (`V_r` the tokens row `r` sees). Once no later query can read the token in its window, it
//! is decided: kept when `Σ_r p_r(t) ≥ f · Σ_r 1/|V_r|`. A kept token's window copy moves to a
//! store beside the body, and every kernel reads it there instead of its codes; its codes stay
//! written (the body stays indexed by token), so a kept token costs its copy's bytes on top.
//!
//! The decision is causal and made by the write-then-attend entry point
//! ([`KvCache::forward`](crate::kv_cache::KvCache::forward)): the fused and reference kernels
//! hand back each window token's share of the softmax they computed ([`ReceivedWeights`]),
//! the streams add it up and settle the tokens that left. In decode, a token is read from its
//! kept copy from the first row after its window; in a prefill batch the rows of the batch
//! read tokens that left the window within the batch from their codes (the decision needs the
//! batch's rows), so the result depends on the chunk size there, not on the thread count. A
//! stream filled by [`append`](crate::kv_cache::KvCache::append) alone (no queries) receives
//! no attention and keeps nothing. A rewind drops the kept tokens and counts past the new
//! length but keeps decisions and counts the dropped rows contributed to: a heuristic's inputs,
//! not the stored vectors, which stay exactly those of the tokens kept.
//!
//! [`KeepTally`] is the rule and its counts alone: the GPU backend (`tq-attention-wgpu`) keeps
//! one per stream on the host and the kept copies on the device, and decides at the same points
//! from the weights its own kernels hand back.

use std::collections::VecDeque;

use half::f16;

use crate::error::CacheError;
use crate::kv_cache::KvCache;
use crate::token_codec::TokenCodec;
use crate::token_store::{Growth, RunRecords, TokenStore};

/// Tokens in the first page of the kept copies (the store doubles from there).
const FIRST_PAGE: usize = 64;

/// The counts behind the keep decisions of one stream: for every token still in the window,
/// the attention it received there and the uniform share of the same rows — what a stream
/// holds of [`HeavyHitters`] apart from the kept copies (the GPU backend keeps those on the
/// device and this tally on the host).
#[derive(Clone, Debug, PartialEq)]
pub struct KeepTally {
    factor: f32,
    /// The token of `pending[0]`.
    first_pending: usize,
    /// Per token from `first_pending` on: the attention it received in the window, and the
    /// uniform share summed over the same rows.
    pending: VecDeque<[f32; 2]>,
}

impl KeepTally {
    /// An empty tally keeping tokens that draw `factor` times the uniform share.
    ///
    /// ```
    /// use tq_cache::heavy_hitters::KeepTally;
    ///
    /// let mut tally = KeepTally::new(4.0)?;
    /// for t in 0..3 {
    ///     tally.track(t);
    /// }
    /// tally.add(1, 0.5, 0.1); // 5× the uniform share
    /// let mut kept = Vec::new();
    /// tally.settle(3, |t| -> Result<(), ()> { kept.push(t); Ok(()) }).unwrap();
    /// assert_eq!(kept, [1]);
    /// # Ok::<(), tq_cache::CacheError>(())
    /// ```
    pub fn new(factor: f32) -> Result<Self, CacheError> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(CacheError::InvalidConfig(format!(
                "heavy_hitters must be a positive finite factor, got {factor}"
            )));
        }
        Ok(Self {
            factor,
            first_pending: 0,
            pending: VecDeque::new(),
        })
    }

    /// The factor of the uniform share a token must draw to be kept.
    pub fn factor(&self) -> f32 {
        self.factor
    }

    /// An empty tally with this one's factor.
    pub fn emptied(&self) -> Self {
        Self {
            factor: self.factor,
            first_pending: 0,
            pending: VecDeque::new(),
        }
    }

    /// Tokens still counted (not yet decided).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Starts counting for token `t` (the next token the stream stores outside its sinks).
    pub fn track(&mut self, t: usize) {
        if self.pending.is_empty() {
            self.first_pending = t;
        }
        if t == self.first_pending + self.pending.len() {
            self.pending.push_back([0.0; 2]);
        }
    }

    /// Adds one row's attention `weight` and uniform share to token `t` (ignored when `t` is
    /// not pending).
    pub fn add(&mut self, t: usize, weight: f32, uniform: f32) {
        if let Some(counts) = t
            .checked_sub(self.first_pending)
            .and_then(|i| self.pending.get_mut(i))
        {
            counts[0] += weight;
            counts[1] += uniform;
        }
    }

    /// [`add`](Self::add) of `weights[i]` to token `first + i` for every `i`, the tokens not
    /// pending ignored: the same additions, the pending range found once (a decode step adds
    /// a row per window token, thousands per stream and layer).
    pub fn add_run(&mut self, first: usize, weights: &[f32], uniform: f32) {
        let start = first.max(self.first_pending);
        let end = (first + weights.len()).min(self.first_pending + self.pending.len());
        if start >= end {
            return;
        }
        let at = start - self.first_pending;
        let counts = self.pending.range_mut(at..at + (end - start));
        for (counts, &weight) in counts.zip(&weights[start - first..end - first]) {
            counts[0] += weight;
            counts[1] += uniform;
        }
    }

    /// Decides every pending token before `end`, in token order: `keep(t)` is called for each
    /// token that drew `factor` times its uniform share (it stores the copy, or declines by
    /// storing nothing); its error stops the settling there.
    pub fn settle<E>(
        &mut self,
        end: usize,
        mut keep: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<(), E> {
        while self.first_pending < end {
            let Some([received, uniform]) = self.pending.pop_front() else {
                break;
            };
            let t = self.first_pending;
            self.first_pending += 1;
            if uniform > 0.0 && received >= self.factor * uniform {
                keep(t)?;
            }
        }
        if self.pending.is_empty() {
            self.first_pending = self.first_pending.max(end);
        }
        Ok(())
    }

    /// Drops the counts from `new_len` on.
    pub fn truncate(&mut self, new_len: usize) {
        let pending = new_len.saturating_sub(self.first_pending);
        self.pending.truncate(pending);
        // Tokens decided past the new end are gone: counting resumes at most there (a saved
        // stream holds no counts past its length).
        self.first_pending = self.first_pending.min(new_len);
    }

    /// Forgets every count.
    pub fn clear(&mut self) {
        self.first_pending = 0;
        self.pending.clear();
    }

    /// Appends the counts to a saved-cache body as f32 bit patterns, so a reloaded stream
    /// decides exactly as the saved one would have.
    pub(crate) fn write_to(&self, out: &mut crate::persist::ByteWriter) {
        out.u64(self.first_pending as u64);
        out.u64(self.pending.len() as u64);
        for [received, uniform] in &self.pending {
            out.u32(received.to_bits());
            out.u32(uniform.to_bits());
        }
    }

    /// Restores what [`write_to`](Self::write_to) wrote into an empty tally; `len` is the
    /// stream's length.
    pub(crate) fn read_from(
        &mut self,
        input: &mut crate::persist::ByteReader<'_>,
        len: usize,
    ) -> Result<(), crate::persist::PersistError> {
        self.first_pending = input.usize()?;
        let pending = input.usize()?;
        if pending > len || self.first_pending > len {
            return Err(crate::persist::PersistError::Inconsistent(
                "heavy-hitter counts past the stream's tokens",
            ));
        }
        for _ in 0..pending {
            let received = f32::from_bits(input.u32()?);
            let uniform = f32::from_bits(input.u32()?);
            self.pending.push_back([received, uniform]);
        }
        Ok(())
    }
}

/// The heavy-hitter state of one stream: counts of the tokens still in the window, the kept
/// tokens and their copies.
#[derive(Clone, Debug)]
pub struct HeavyHitters {
    tally: KeepTally,
    /// Kept tokens, ascending.
    kept: Vec<u32>,
    /// Their copies, in `kept`'s order, in the window's codec.
    copies: TokenStore,
}

impl HeavyHitters {
    /// An empty state for a stream whose window copies are in `codec`, keeping tokens that
    /// draw `factor` times the uniform share.
    pub fn new(factor: f32, codec: &TokenCodec) -> Result<Self, CacheError> {
        Ok(Self {
            tally: KeepTally::new(factor)?,
            kept: Vec::new(),
            copies: TokenStore::new(
                codec.record_words(),
                codec.scales_per_token(),
                Growth::Doubling {
                    initial: FIRST_PAGE,
                },
            )?,
        })
    }

    /// The factor of the uniform share a token must draw to be kept.
    pub fn factor(&self) -> f32 {
        self.tally.factor()
    }

    /// The counts of the tokens not yet decided.
    pub fn tally(&self) -> &KeepTally {
        &self.tally
    }

    /// The kept tokens, ascending.
    pub fn kept(&self) -> &[u32] {
        &self.kept
    }

    /// Bytes held: the kept copies' pages, their token indices and the counts of the pending
    /// tokens (those two by length: their spare capacity depends on the history, and a
    /// reloaded cache must report the memory the saved one did).
    pub fn allocated_bytes(&self) -> usize {
        self.copies.allocated_bytes() + 4 * self.kept.len() + 8 * self.tally.pending()
    }

    /// Bytes held by formula: the kept copies' store at its capacity, the kept tokens'
    /// indices and the counts of the tokens not yet decided (what
    /// [`allocated_bytes`](Self::allocated_bytes) measures).
    pub fn formula_bytes(&self) -> usize {
        self.copies.capacity() * self.copy_bytes() + 4 * self.kept.len() + 8 * self.tally.pending()
    }

    /// Bytes the kept tokens cost by formula: their copies and indices.
    pub fn kept_bytes(&self) -> usize {
        self.kept.len() * (self.copy_bytes() + 4)
    }

    /// Bytes of one kept copy: its words and scales.
    fn copy_bytes(&self) -> usize {
        4 * self.copies.record_words() + 2 * self.copies.scales_per_token()
    }

    /// Starts counting for token `t` (the next token the stream stores outside its sinks).
    pub(crate) fn track(&mut self, t: usize) {
        self.tally.track(t);
    }

    /// [`KeepTally::add_run`]: `weights[i]` and `uniform` to token `first + i`.
    pub(crate) fn add_run(&mut self, first: usize, weights: &[f32], uniform: f32) {
        self.tally.add_run(first, weights, uniform);
    }

    /// Decides every pending token before `end`: a token that drew `factor` times its uniform
    /// share keeps the copy `copy(t)` gives (a token without one is not kept).
    pub(crate) fn settle<'a>(
        &mut self,
        end: usize,
        copy: impl Fn(usize) -> Option<(&'a [u32], &'a [f16])>,
    ) -> Result<(), CacheError> {
        let (kept, copies) = (&mut self.kept, &mut self.copies);
        self.tally.settle(end, |t| {
            if let Some((words, scales)) = copy(t) {
                copies.push_record(words, scales)?;
                kept.push(t as u32);
            }
            Ok(())
        })
    }

    /// The first kept token at or after `t`.
    pub fn next_kept(&self, t: usize) -> Option<usize> {
        let i = self.kept.partition_point(|&k| (k as usize) < t);
        self.kept.get(i).map(|&k| k as usize)
    }

    /// The indices into `kept` of the kept tokens within `range`.
    fn kept_span(&self, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let from = self.kept.partition_point(|&k| (k as usize) < range.start);
        from..from + self.kept[from..].partition_point(|&k| (k as usize) < range.end)
    }

    /// The kept tokens within `range`, ascending.
    pub fn kept_within(&self, range: std::ops::Range<usize>) -> &[u32] {
        &self.kept[self.kept_span(range)]
    }

    /// The first kept tokens within `range` whose copies lie together (one page of the
    /// copies' store), with those copies' words and scales: `None` when none is kept there.
    pub fn copies_within(&self, range: std::ops::Range<usize>) -> Option<(&[u32], &[u32], &[f16])> {
        let span = self.kept_span(range);
        let tokens = &self.kept[span.clone()];
        match self.copies.records(span.start, tokens.len())? {
            (RunRecords::Rows(words), scales, n) => Some((&tokens[..n], words, scales)),
            // The copies are stored in rows (`new`).
            (RunRecords::FastScan { .. }, ..) => None,
        }
    }

    /// The kept copy of token `t` (words, scales), if `t` is kept.
    pub fn copy(&self, t: usize) -> Option<(&[u32], &[f16])> {
        let t = u32::try_from(t).ok()?;
        let i = self.kept.binary_search(&t).ok()?;
        self.copies.record(i)
    }

    /// Drops the kept tokens and counts from `new_len` on.
    pub(crate) fn truncate(&mut self, new_len: usize) {
        let keep = self.kept.partition_point(|&k| (k as usize) < new_len);
        self.kept.truncate(keep);
        self.copies.truncate(keep);
        self.tally.truncate(new_len);
    }

    /// Forgets everything (allocations are kept).
    pub(crate) fn clear(&mut self) {
        self.tally.clear();
        self.kept.clear();
        self.copies.truncate(0);
    }

    /// Appends the state to a saved-cache body: the pending counts as f32 bit patterns, so a
    /// reloaded stream decides exactly as the saved one would have.
    pub(crate) fn write_to(&self, out: &mut crate::persist::ByteWriter) {
        self.tally.write_to(out);
        out.u64(self.kept.len() as u64);
        for &k in &self.kept {
            out.u32(k);
        }
        out.store(&self.copies);
    }

    /// Restores what [`write_to`](Self::write_to) wrote into an empty state; `len` is the
    /// stream's length.
    pub(crate) fn read_from(
        &mut self,
        input: &mut crate::persist::ByteReader<'_>,
        len: usize,
    ) -> Result<(), crate::persist::PersistError> {
        use crate::persist::PersistError;
        self.tally.read_from(input, len)?;
        let kept = input.usize()?;
        if kept > len {
            return Err(PersistError::Inconsistent(
                "more kept tokens than the stream holds",
            ));
        }
        for _ in 0..kept {
            self.kept.push(input.u32()?);
        }
        let ascending = self.kept.windows(2).all(|w| w[0] < w[1]);
        if !ascending || self.kept.last().is_some_and(|&k| k as usize >= len) {
            return Err(PersistError::Inconsistent(
                "kept tokens out of order or past the stream's tokens",
            ));
        }
        input.store(&mut self.copies)?;
        if self.copies.len() != self.kept.len() {
            return Err(PersistError::Inconsistent(
                "kept tokens and their copies disagree",
            ));
        }
        Ok(())
    }
}

/// What one attention call gave the window tokens of its queries: per item (query row `i`, KV
/// head `g`, item `i·kv_heads + g`), the attention each token from the item's `first` to its
/// `end` received, the mean over `g`'s query heads — filled by the kernels for
/// [`KvCache::forward`](crate::kv_cache::KvCache::forward) to add to the streams' counts.
#[derive(Clone, Debug, Default)]
pub struct ReceivedWeights {
    /// Per item: the first token gathered, the end of the row's visible range (exclusive) and
    /// the number of tokens it sees.
    pub items: Vec<GatheredRow>,
    /// Weights per item, `stride` each (the item's `end − first` first).
    pub weights: Vec<f32>,
    /// Weights per item.
    pub stride: usize,
}

/// The tokens one (query row, KV head) item gathers weights for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatheredRow {
    /// The first token gathered.
    pub first: usize,
    /// One past the last visible token.
    pub end: usize,
    /// Tokens the row sees.
    pub visible: usize,
}

impl GatheredRow {
    /// The tokens item `k` (query `k / kv_heads` at `positions[k / kv_heads]`, KV head
    /// `k % kv_heads`) gathers weights for: those its windows read (the earlier of the key and
    /// value window starts, sinks aside; `in_step`: each query its own window, as in
    /// [`Stream::window_start`](crate::stream::Stream::window_start)) up to the end of its
    /// visible range. What every kernel that gathers uses, so they gather the same tokens.
    pub fn of(cache: &KvCache, positions: &[u32], k: usize, in_step: bool) -> Self {
        let kv_heads = cache.layout().kv_heads;
        let range = cache.visible(positions[k / kv_heads]);
        let (keys, values) = (cache.keys(k % kv_heads), cache.values(k % kv_heads));
        let first = keys
            .window_start(range.end, in_step)
            .min(values.window_start(range.end, in_step))
            .max(keys.sink_end())
            .clamp(range.start, range.end);
        Self {
            first,
            end: range.end,
            visible: range.len(),
        }
    }
}

impl ReceivedWeights {
    /// Sizes the buffer for `items` (zeroed weights, `stride` the longest item).
    pub fn reset(&mut self, items: impl IntoIterator<Item = GatheredRow>) {
        self.items.clear();
        self.items.extend(items);
        self.stride = self
            .items
            .iter()
            .map(|r| r.end.saturating_sub(r.first))
            .max()
            .unwrap_or(0);
        self.weights.clear();
        self.weights.resize(self.items.len() * self.stride, 0.0);
    }

    /// Item `k`'s row and weights (`end − first` of them).
    pub fn item(&self, k: usize) -> (GatheredRow, &[f32]) {
        let row = self.items[k];
        let n = row.end.saturating_sub(row.first);
        (row, &self.weights[k * self.stride..][..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Q8Window;

    fn state(factor: f32) -> HeavyHitters {
        let codec = TokenCodec::Q8(Box::new(Q8Window::new(8).unwrap()));
        HeavyHitters::new(factor, &codec).unwrap()
    }

    /// A token is kept exactly when its received attention reaches the factor times its
    /// uniform share, and only once it is settled.
    #[test]
    fn tokens_drawing_the_factor_times_the_uniform_share_are_kept() {
        let mut h = state(4.0);
        for t in 2..6 {
            h.track(t);
        }
        // Token 2: 4× uniform (kept), 3: just under, 4: no rows, 5: still pending.
        h.add_run(2, &[0.4, 0.39], 0.1);
        h.add_run(5, &[1.0], 0.1);
        h.add_run(9, &[1.0], 0.1);
        let words = [7u32, 8];
        let scales = [f16::ONE];
        h.settle(5, |_| Some((&words[..], &scales[..]))).unwrap();
        assert_eq!(h.kept(), &[2]);
        assert_eq!(h.copy(2), Some((&words[..], &scales[..])));
        assert_eq!(h.copy(3), None);
        assert_eq!(h.next_kept(0), Some(2));
        assert_eq!(h.next_kept(3), None);
        h.settle(6, |_| Some((&words[..], &scales[..]))).unwrap();
        assert_eq!(h.kept(), &[2, 5]);
        h.truncate(5);
        assert_eq!(h.kept(), &[2]);
    }

    /// A run of weights adds what adding them token by token adds, whatever part of the run
    /// is pending (before, across, inside, after the pending tokens; the deque wrapped).
    #[test]
    fn a_run_adds_what_its_tokens_add_one_by_one() {
        let mut base = KeepTally::new(2.0).unwrap();
        for t in 0..40 {
            base.track(t);
        }
        // Wrap the deque's storage: settle some from the front, track more at the back.
        base.settle(13, |_| -> Result<(), ()> { Ok(()) }).unwrap();
        for t in 40..50 {
            base.track(t);
        }
        for (first, len) in [
            (0, 5),
            (0, 20),
            (10, 10),
            (13, 37),
            (20, 5),
            (45, 10),
            (60, 3),
            (12, 0),
        ] {
            let weights: Vec<f32> = (0..len)
                .map(|i| 0.01 * (i * 7 % 11) as f32 + 0.003)
                .collect();
            let (mut run, mut one) = (base.clone(), base.clone());
            run.add_run(first, &weights, 0.02);
            for (i, &w) in weights.iter().enumerate() {
                one.add(first + i, w, 0.02);
            }
            assert_eq!(run, one, "run {first}..{}", first + len);
        }
    }

    #[test]
    fn a_factor_that_is_not_positive_and_finite_is_refused() {
        let codec = TokenCodec::Q8(Box::new(Q8Window::new(8).unwrap()));
        for f in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(HeavyHitters::new(f, &codec).is_err());
        }
    }
}
