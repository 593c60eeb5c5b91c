//! [`RecentWindows`]: the recent window of every stream of a layer's GPU copy (keys and values,
//! per KV head, as an allocation's per-stream `recent_fp_tokens` and `recent_fraction` give
//! them), which copies each still holds, and where each query's window starts — the CPU
//! stream's rules (`Stream::window_start`, `check_rewind`), one stream at a time.
//!
//! A window may grow with the context (a fraction of the tokens held,
//! [`window_tokens`]): every start is computed from the tokens held at that query.
//!
//! The copies themselves share one ring per layer, as long as the longest window (plus the
//! rewind margin and one chunk of `forward`); a stream reads only its own window's part of it.

use tq_cache::stream::window_tokens;

/// One stream's window: a floor of `tokens` and a `fraction` of the tokens held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct WindowRule {
    pub(crate) tokens: usize,
    pub(crate) fraction: Option<f64>,
}

impl WindowRule {
    /// A window of `tokens` tokens, whatever the length.
    pub(crate) fn fixed(tokens: usize) -> Self {
        Self {
            tokens,
            fraction: None,
        }
    }

    /// Whether the stream keeps a window at all.
    pub(crate) fn is_some(&self) -> bool {
        self.tokens > 0 || self.fraction.is_some_and(|f| f > 0.0)
    }

    /// The window's tokens with `held` tokens held.
    pub(crate) fn at(&self, held: usize) -> usize {
        if self.is_some() {
            window_tokens(self.tokens, self.fraction, held)
        } else {
            0
        }
    }
}

/// Windows and the oldest readable copy of each stream, indexed `stream·kv_heads + head`
/// (stream 0 the keys, 1 the values).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RecentWindows {
    kv_heads: usize,
    /// Window per stream.
    rules: Vec<WindowRule>,
    /// The slots of the CPU stream's ring of copies when the copy was built (its window at the
    /// template's capacity plus the rewind margin; 0 without a window).
    slots: Vec<usize>,
    max_rewind: usize,
    /// The CPU stream's `oldest_recent`: tokens before it lost their copies in the CPU's ring
    /// (at least `window(len) + max_rewind` slots), or were never shown to this copy (mirrored
    /// so rewinds are refused where the CPU refuses them).
    oldest: Vec<usize>,
}

impl RecentWindows {
    /// Windows `[keys per head.., values per head..]`, with the CPU rings' slots the same way.
    pub(crate) fn new(
        kv_heads: usize,
        rules: Vec<WindowRule>,
        slots: Vec<usize>,
        max_rewind: usize,
    ) -> Self {
        debug_assert_eq!(rules.len(), 2 * kv_heads);
        debug_assert_eq!(slots.len(), 2 * kv_heads);
        let oldest = vec![0; rules.len()];
        Self {
            kv_heads,
            rules,
            slots,
            max_rewind,
            oldest,
        }
    }

    /// Fixed windows of `tokens` (each `0` for none) in rings of `window + max_rewind` slots.
    #[cfg(test)]
    pub(crate) fn fixed(kv_heads: usize, tokens: Vec<usize>, max_rewind: usize) -> Self {
        let slots = tokens
            .iter()
            .map(|&w| if w > 0 { w + max_rewind } else { 0 })
            .collect();
        let rules = tokens.into_iter().map(WindowRule::fixed).collect();
        Self::new(kv_heads, rules, slots, max_rewind)
    }

    /// No windows (a sliding layer, or an allocation without them).
    pub(crate) fn none(kv_heads: usize) -> Self {
        let n = 2 * kv_heads;
        Self::new(kv_heads, vec![WindowRule::fixed(0); n], vec![0; n], 0)
    }

    /// The window rule of stream `stream` (0 keys, 1 values) of KV head `head`.
    pub(crate) fn rule(&self, stream: usize, head: usize) -> WindowRule {
        self.rules[stream * self.kv_heads + head]
    }

    /// Whether some stream keeps a window.
    pub(crate) fn any(&self) -> bool {
        self.rules.iter().any(WindowRule::is_some)
    }

    /// The ring slots the copies need with `held` tokens held: the longest CPU ring, and the
    /// longest window at `held` plus the rewind margin (0: no window).
    pub(crate) fn slots_at(&self, held: usize) -> usize {
        self.rules
            .iter()
            .zip(&self.slots)
            .map(|(r, &s)| {
                if r.is_some() {
                    s.max(r.at(held) + self.max_rewind)
                } else {
                    0
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// The longest window with `held` tokens held (0: none).
    pub(crate) fn longest_at(&self, held: usize) -> usize {
        self.rules.iter().map(|r| r.at(held)).max().unwrap_or(0)
    }

    /// Where attention over the stored cache of `len` tokens reads copies from, per stream
    /// (`len − window(len)`; `len` without a window): `[2, kv_heads]`.
    pub(crate) fn stored_starts(&self, len: usize) -> Vec<u32> {
        self.rules
            .iter()
            .map(|r| len.saturating_sub(r.at(len)) as u32)
            .collect()
    }

    /// The window starts of `count` queries appended as one chunk after `before` tokens (query
    /// `i` at token `before + i`, the cache now `len` long): each reads its own newest
    /// `window(before + i + 1)` tokens from copies, as a decode step at it would, where the
    /// copies are still held, and at least the stream's window of the stored cache
    /// (`Stream::window_start` in a step): `[count, 2, kv_heads]`.
    pub(crate) fn chunk_starts(&self, before: usize, count: usize, len: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(count * self.rules.len());
        for i in 0..count {
            for (r, &oldest) in self.rules.iter().zip(&self.oldest) {
                let recent = len.saturating_sub(r.at(len));
                let covered = before.saturating_sub(r.at(before)).max(oldest).min(recent);
                let end = before + i + 1;
                out.push(end.saturating_sub(r.at(end)).max(covered).min(recent) as u32);
            }
        }
        out
    }

    /// The cache grew to `len` tokens: a stream's CPU ring (its slots, at least its window at
    /// `len` plus the rewind margin) forgets the oldest.
    pub(crate) fn appended(&mut self, len: usize) {
        for ((r, &s), oldest) in self.rules.iter().zip(&self.slots).zip(&mut self.oldest) {
            if r.is_some() {
                let slots = s.max(r.at(len) + self.max_rewind);
                *oldest = (*oldest).max(len.saturating_sub(slots));
            }
        }
    }

    /// The copy took the CPU cache's copies when it was `len` long (`upload_all`): the CPU
    /// shows each stream's window only, so nothing older can be read again.
    pub(crate) fn uploaded(&mut self, len: usize) {
        for (r, oldest) in self.rules.iter().zip(&mut self.oldest) {
            *oldest = len.saturating_sub(r.at(len));
        }
    }

    /// The copy, `had` tokens long, follows a CPU cache now `len` long (`sync_from`): tokens
    /// that left a stream's window in between were never shown with their copies.
    pub(crate) fn followed(&mut self, had: usize, len: usize) {
        for (r, oldest) in self.rules.iter().zip(&mut self.oldest) {
            let w = r.at(len);
            if r.is_some() && had + w < len {
                *oldest = (*oldest).max(len - w);
            }
        }
    }

    /// Whether dropping tokens from `new_len` on would make some stream read a copy it no
    /// longer holds (`Stream::check_rewind`).
    pub(crate) fn rewind_blocked(&self, new_len: usize) -> bool {
        self.rules
            .iter()
            .zip(&self.oldest)
            .any(|(r, &oldest)| r.is_some() && oldest > new_len.saturating_sub(r.at(new_len)))
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
        let w = RecentWindows::fixed(1, vec![4, 2], 2);
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
        let mut w = RecentWindows::fixed(1, vec![4, 0], 2);
        w.appended(20);
        assert!(!w.rewind_blocked(18));
        assert!(w.rewind_blocked(17));
        w.truncated(18);
        assert!(!w.rewind_blocked(18));
        let mut up = RecentWindows::fixed(1, vec![4, 2], 2);
        up.uploaded(20);
        assert!(
            up.rewind_blocked(19),
            "an uploaded copy holds only the windows"
        );
        let mut follower = RecentWindows::fixed(1, vec![4, 2], 2);
        follower.followed(0, 20);
        assert_eq!(follower, up);
    }

    /// A window that grows with the tokens held (keys: a quarter over a floor of 2; values: a
    /// fixed 3): each query of a chunk starts its window at its own length, the stored window
    /// at the cache's, and the ring the copies need grows with the window.
    #[test]
    fn growing_windows_start_at_each_querys_length() {
        let keys = WindowRule {
            tokens: 2,
            fraction: Some(0.25),
        };
        let w = RecentWindows::new(1, vec![keys, WindowRule::fixed(3)], vec![4, 5], 2);
        assert_eq!((keys.at(4), keys.at(20), keys.at(22)), (2, 5, 6));
        // Queries at tokens 20, 21 after 20 tokens, cache now 22 long: keys from 21 − 5 and
        // 22 − 6, values from 21 − 3 and 22 − 3 (`[query, stream]`).
        assert_eq!(w.chunk_starts(20, 2, 22), vec![16, 18, 16, 19]);
        assert_eq!(w.stored_starts(22), vec![16, 19]);
        // The CPU ring was built with 4 slots; at 40 tokens the keys' window (10) and the
        // margin need 12.
        assert_eq!((w.slots_at(0), w.slots_at(40)), (5, 12));
        assert_eq!(w.longest_at(40), 10);
        let mut grown = w.clone();
        grown.appended(40);
        assert_eq!(grown.oldest, vec![28, 35]);
        assert!(!grown.rewind_blocked(38) && grown.rewind_blocked(36));
    }
}
