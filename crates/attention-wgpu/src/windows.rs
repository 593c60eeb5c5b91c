//! [`RecentWindows`]: the recent window of every stream of a layer's GPU copy (keys and values,
//! per KV head, as an allocation's per-stream `recent_fp_tokens` gives them), which copies each
//! still holds, and where each query's window starts — the CPU stream's rules
//! (`Stream::window_start`, `check_rewind`), one stream at a time.
//!
//! The copies themselves share one ring per layer, as long as the longest window (plus the
//! rewind margin and one chunk of `forward`); a stream reads only its own window's part of it.

/// Windows and the oldest readable copy of each stream, indexed `stream·kv_heads + head`
/// (stream 0 the keys, 1 the values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecentWindows {
    kv_heads: usize,
    /// Window length per stream (0: no window).
    tokens: Vec<usize>,
    /// The CPU stream's `oldest_recent`: tokens before it lost their copies in the CPU's ring
    /// of `window + max_rewind` slots, or were never shown to this copy (mirrored so rewinds
    /// are refused exactly where the CPU refuses them).
    oldest: Vec<usize>,
}

impl RecentWindows {
    /// Windows `[keys per head.., values per head..]` (each `0` for none).
    pub(crate) fn new(kv_heads: usize, tokens: Vec<usize>) -> Self {
        debug_assert_eq!(tokens.len(), 2 * kv_heads);
        let oldest = vec![0; tokens.len()];
        Self {
            kv_heads,
            tokens,
            oldest,
        }
    }

    /// No windows (a sliding layer, or an allocation without them).
    pub(crate) fn none(kv_heads: usize) -> Self {
        Self::new(kv_heads, vec![0; 2 * kv_heads])
    }

    /// The window of stream `stream` (0 keys, 1 values) of KV head `head`.
    pub(crate) fn of(&self, stream: usize, head: usize) -> usize {
        self.tokens[stream * self.kv_heads + head]
    }

    /// The longest window (0: none).
    pub(crate) fn longest(&self) -> usize {
        self.tokens.iter().copied().max().unwrap_or(0)
    }

    /// Where attention over the stored cache of `len` tokens reads copies from, per stream
    /// (`len − window`; `len` without a window): `[2, kv_heads]`.
    pub(crate) fn stored_starts(&self, len: usize) -> Vec<u32> {
        self.tokens
            .iter()
            .map(|&w| len.saturating_sub(w) as u32)
            .collect()
    }

    /// The window starts of `count` queries appended as one chunk after `before` tokens (query
    /// `i` at token `before + i`, the cache now `len` long): each reads its own newest `window`
    /// tokens from copies, as a decode step at it would, where the copies are still held, and
    /// at least the stream's window of the stored cache (`Stream::window_start` in a step):
    /// `[count, 2, kv_heads]`.
    pub(crate) fn chunk_starts(&self, before: usize, count: usize, len: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(count * self.tokens.len());
        for i in 0..count {
            for (&w, &oldest) in self.tokens.iter().zip(&self.oldest) {
                let recent = len.saturating_sub(w);
                let covered = (before + 1).saturating_sub(w).max(oldest).min(recent);
                out.push((before + i + 1).saturating_sub(w).max(covered).min(recent) as u32);
            }
        }
        out
    }

    /// The cache grew to `len` tokens: a stream's CPU ring of `window + max_rewind` copies
    /// forgets the oldest.
    pub(crate) fn appended(&mut self, len: usize, max_rewind: usize) {
        for (&w, oldest) in self.tokens.iter().zip(&mut self.oldest) {
            if w > 0 {
                *oldest = (*oldest).max(len.saturating_sub(w + max_rewind));
            }
        }
    }

    /// The copy took the CPU cache's copies when it was `len` long (`upload_all`): the CPU
    /// shows each stream's window only, so nothing older can be read again.
    pub(crate) fn uploaded(&mut self, len: usize) {
        for (&w, oldest) in self.tokens.iter().zip(&mut self.oldest) {
            *oldest = len.saturating_sub(w);
        }
    }

    /// The copy, `had` tokens long, follows a CPU cache now `len` long (`sync_from`): tokens
    /// that left a stream's window in between were never shown with their copies.
    pub(crate) fn followed(&mut self, had: usize, len: usize) {
        for (&w, oldest) in self.tokens.iter().zip(&mut self.oldest) {
            if w > 0 && had + w < len {
                *oldest = (*oldest).max(len - w);
            }
        }
    }

    /// Whether dropping tokens from `new_len` on would make some stream read a copy it no
    /// longer holds (`Stream::check_rewind`).
    pub(crate) fn rewind_blocked(&self, new_len: usize) -> bool {
        self.tokens
            .iter()
            .zip(&self.oldest)
            .any(|(&w, &oldest)| w > 0 && oldest > new_len.saturating_sub(w))
    }

    /// Tokens from `new_len` on were dropped.
    pub(crate) fn truncated(&mut self, new_len: usize) {
        for oldest in &mut self.oldest {
            *oldest = (*oldest).min(new_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One window per stream reads like the single window it generalizes, and streams of other
    /// lengths each read their own newest tokens.
    #[test]
    fn chunk_starts_follow_each_streams_window() {
        let w = RecentWindows::new(1, vec![4, 2]);
        // Queries at tokens 10, 11 after 10 tokens, cache now 12 long.
        let starts = w.chunk_starts(10, 2, 12);
        // Each query reads its own window from copies (keys: 7.., 8..; values: 9.., 10..),
        // never less than the stored window (keys 8.., values 10..).
        assert_eq!(starts, vec![7, 9, 8, 10]);
        // The first query of a chunk whose copies before it are gone reads what is held.
        let mut gone = w.clone();
        gone.oldest = vec![9, 9];
        assert_eq!(gone.chunk_starts(10, 2, 12), vec![8, 9, 8, 10]);
        assert_eq!(w.stored_starts(12), vec![8, 10]);
        assert_eq!(RecentWindows::none(1).stored_starts(5), vec![5, 5]);
    }

    /// Rewinds are refused once a stream's ring has forgotten the copies the rewound window
    /// would need, each stream by its own window.
    #[test]
    fn rewinds_follow_each_streams_ring() {
        let mut w = RecentWindows::new(1, vec![4, 0]);
        w.appended(20, 2);
        assert!(!w.rewind_blocked(18));
        assert!(w.rewind_blocked(17));
        w.truncated(18);
        assert!(!w.rewind_blocked(18));
        let mut up = RecentWindows::new(1, vec![4, 2]);
        up.uploaded(20);
        assert!(
            up.rewind_blocked(19),
            "an uploaded copy holds only the windows"
        );
        let mut follower = RecentWindows::new(1, vec![4, 2]);
        follower.followed(0, 20);
        assert_eq!(follower, up);
    }
}
