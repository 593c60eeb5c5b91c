//! The SentencePiece-style encoder, as llama.cpp computes it (`llama-vocab.cpp`:
//! `tokenizer_st_partition`, then `llm_tokenizer_spm_session` per text fragment).
//!
//! 1. **Special tokens first.** Control, unknown and user-defined tokens, longest text first,
//!    are cut out of the text in turn: for each one, every text fragment left so far is split
//!    at its non-overlapping occurrences, scanned left to right. Control and unknown tokens only
//!    when parsing specials; user-defined ones (Gemma's runs of newlines, spaces and tabs, HTML
//!    tags) always.
//! 2. **Each remaining fragment**: a space first when [`add_space_prefix`] is set and the
//!    fragment starts the text or follows a special token; every `' '` becomes `▁` (U+2581);
//!    the text is split into UTF-8 characters.
//! 3. **Merging.** Every adjacent pair whose concatenation is a vocabulary token goes into a
//!    priority queue keyed by that token's score (ties: leftmost first). The best pair is
//!    merged if both sides are still what they were when it was queued (checked by length),
//!    and the new symbol's pairs with its neighbours are queued, until the queue is empty.
//! 4. **Output.** Each final symbol is its token if its text is one, else the byte tokens of
//!    its UTF-8 bytes (`<0xHH>`, or a token spelled as the single byte). llama.cpp's
//!    `rev_merge` re-segmentation never applies here: a merged symbol is always a token, and an
//!    unmerged one is a single character, which no pair of symbols can spell.
//!
//! [`add_space_prefix`]: super::SpmVocab::add_space_prefix

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::error::{Result, TokenizerError};
use super::spm_vocab::{SpmVocab, byte_of_token};
use super::vocab::TokenType;

/// Token texts llama.cpp marks as control tokens whatever the file says (its end-of-turn,
/// end-of-generation and fill-in-the-middle detection in `llama_vocab::impl::load`), so they
/// are cut out of text as special tokens. (For the end-of-turn and fill-in-the-middle names
/// llama.cpp marks only the first match its hash map yields per kind when the file names no
/// such id; that only differs from marking all of them for a vocabulary holding several of
/// those names as ordinary tokens.)
pub(crate) const CONTROL_LOOKING: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
    "<|eom_id|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "[e~[",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// The encoder built from an [`SpmVocab`].
pub(crate) struct SpmEncoder {
    /// Token text → id (every token; with repeated texts the last id wins).
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// The token of each byte for the fallback, if the vocabulary has one.
    byte_ids: [Option<u32>; 256],
    /// Special tokens in the order llama.cpp cuts them out: longest text first, then by id.
    /// (llama.cpp sorts by length with `std::sort`, which leaves equal lengths in an
    /// unspecified order; that order only matters for two equally long special texts that
    /// overlap in some string, which Gemma's tags and whitespace runs never do.)
    specials: Vec<Special>,
    /// For each first byte of a special text, the distinct lengths of those texts: a cheap way
    /// to find which special texts occur in a string at all.
    lengths_by_first_byte: Vec<Vec<usize>>,
    /// Special text → index in `specials`.
    special_index: HashMap<String, usize>,
    add_space_prefix: bool,
}

/// A special token: its id, text, and whether it is cut out only when parsing specials.
struct Special {
    id: u32,
    text: String,
    control: bool,
}

/// A text fragment (a byte range of the input) or a special token already cut out.
#[derive(Debug, Clone, PartialEq)]
enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

impl SpmEncoder {
    /// Builds the encoder (`vocab` already validated).
    pub(crate) fn new(vocab: &SpmVocab) -> Self {
        let ids: HashMap<String, u32> = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(id, text)| (text.clone(), id as u32))
            .collect();
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                // llama.cpp falls back to a token spelled as the byte itself (ASCII only:
                // other single bytes are not UTF-8 text).
                let byte = u8::try_from(b).ok().filter(u8::is_ascii)?;
                ids.get(&char::from(byte).to_string()).copied()
            });
        }
        // Byte tokens whose text is lowercase hex (`<0x0a>`) serve the fallback too.
        for (id, (text, kind)) in vocab.tokens.iter().zip(&vocab.token_types).enumerate() {
            if *kind == TokenType::Byte
                && let Some(b) = byte_of_token(text)
                && byte_ids[usize::from(b)].is_none()
            {
                byte_ids[usize::from(b)] = Some(id as u32);
            }
        }

        let mut specials: Vec<Special> = vocab
            .tokens
            .iter()
            .zip(&vocab.token_types)
            .enumerate()
            .filter_map(|(id, (text, kind))| {
                let control = matches!(kind, TokenType::Control | TokenType::Unknown)
                    || CONTROL_LOOKING.contains(&text.as_str());
                // A user-defined token that is also control (forced) is, as in llama.cpp, cut
                // out only when parsing specials.
                (control || *kind == TokenType::UserDefined).then(|| Special {
                    id: id as u32,
                    text: text.clone(),
                    control,
                })
            })
            .collect();
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let mut lengths_by_first_byte = vec![Vec::new(); 256];
        let mut special_index = HashMap::with_capacity(specials.len());
        for (i, special) in specials.iter().enumerate() {
            let first = usize::from(special.text.as_bytes()[0]);
            if !lengths_by_first_byte[first].contains(&special.text.len()) {
                lengths_by_first_byte[first].push(special.text.len());
            }
            special_index.entry(special.text.clone()).or_insert(i);
        }
        SpmEncoder {
            ids,
            scores: vocab.scores.clone(),
            byte_ids,
            specials,
            lengths_by_first_byte,
            special_index,
            add_space_prefix: vocab.add_space_prefix,
        }
    }

    /// The id of the token whose text is exactly `text`.
    pub(crate) fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token ids of `text` (no BOS/EOS): special tokens cut out first (control and unknown
    /// ones only when `parse_special`), then each fragment merged by score.
    pub(crate) fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut output = Vec::with_capacity(text.len() / 3 + 1);
        // "prefix with space if first token" (llama.cpp's `is_prev_special` starts true).
        let mut prev_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    output.push(id);
                    prev_special = true;
                }
                Fragment::Text(range) => {
                    let mut piece = String::with_capacity(range.len() + 3);
                    if self.add_space_prefix && prev_special {
                        piece.push(' ');
                    }
                    piece.push_str(&text[range]);
                    let escaped = piece.replace(' ', "\u{2581}");
                    self.merge(&escaped, &mut output)?;
                    prev_special = false;
                }
            }
        }
        Ok(output)
    }

    /// Cuts the special tokens out of `text`, in the order of `self.specials`.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(0..text.len())];
        // Only specials that occur somewhere in the text can occur in a fragment of it.
        for index in self.specials_in(text) {
            let special = &self.specials[index];
            if special.control && !parse_special {
                continue;
            }
            let pattern = special.text.as_str();
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(range) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut start = range.start;
                while let Some(at) = text[start..range.end].find(pattern) {
                    let at = start + at;
                    if at > start {
                        next.push(Fragment::Text(start..at));
                    }
                    next.push(Fragment::Token(special.id));
                    start = at + pattern.len();
                }
                if start < range.end {
                    next.push(Fragment::Text(start..range.end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Indices into `self.specials` of the special texts that occur in `text`, ascending (so
    /// in cutting order).
    fn specials_in(&self, text: &str) -> Vec<usize> {
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        for (at, &first) in bytes.iter().enumerate() {
            for &len in &self.lengths_by_first_byte[usize::from(first)] {
                let end = at + len;
                if end <= bytes.len()
                    && text.is_char_boundary(end)
                    && let Some(&index) = self.special_index.get(&text[at..end])
                {
                    found.push(index);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// The SentencePiece merge loop on one escaped fragment, appending its tokens to `output`.
    fn merge(&self, text: &str, output: &mut Vec<u32>) -> Result<()> {
        // Symbols: byte ranges of `text`, linked to their neighbours; a merged-away symbol has
        // length 0.
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        for right in 1..symbols.len() {
            self.push_pair(text, &symbols, right - 1, Some(right), &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (left, right) = (symbols[pair.left], symbols[pair.right]);
            // Skip a pair one of whose sides has changed since it was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
                continue;
            }
            symbols[pair.left].len += right.len;
            symbols[pair.right].len = 0;
            symbols[pair.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(pair.left);
            }
            if let Some(prev) = left.prev {
                self.push_pair(text, &symbols, prev, Some(pair.left), &mut queue);
            }
            self.push_pair(text, &symbols, pair.left, right.next, &mut queue);
        }
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let symbol = symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match self.ids.get(piece) {
                Some(&id) => output.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        let id = self.byte_ids[usize::from(byte)]
                            .ok_or(TokenizerError::NoByteToken { byte })?;
                        output.push(id);
                    }
                }
            }
            at = symbol.next;
        }
        Ok(())
    }

    /// Queues the pair `(left, right)` if their concatenation is a token.
    fn push_pair(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: Option<usize>,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let Some(right) = right else { return };
        let start = symbols[left].start;
        let len = symbols[left].len + symbols[right].len;
        if let Some(&id) = self.ids.get(&text[start..start + len]) {
            queue.push(Pair {
                left,
                right,
                score: self.scores[id as usize],
                len,
            });
        }
    }
}

/// A symbol of the merge loop: `text[start..start + len]`, with its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: the token `left ++ right` would form, with its score and byte length.
#[derive(Debug, Clone, Copy)]
struct Pair {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl Ord for Pair {
    /// The queue's top is the highest score, then the leftmost pair (llama.cpp's
    /// `llm_bigram_spm::comparator`). Scores are never NaN (checked when the vocabulary is
    /// validated), so the comparison is total; `-0.0` and `0.0` compare equal, as in C++.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then(other.left.cmp(&self.left))
            .then(self.len.cmp(&other.len))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoder(tokens: &[(&str, f32, TokenType)], add_space_prefix: bool) -> SpmEncoder {
        let vocab = SpmVocab {
            tokens: tokens.iter().map(|t| t.0.to_owned()).collect(),
            scores: tokens.iter().map(|t| t.1).collect(),
            token_types: tokens.iter().map(|t| t.2).collect(),
            bos_id: None,
            eos_id: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix,
        };
        vocab.validate().unwrap();
        SpmEncoder::new(&vocab)
    }

    #[test]
    fn longer_specials_are_cut_first_and_control_only_when_parsing_specials() {
        use TokenType::*;
        let e = encoder(
            &[
                ("\n", 0.0, UserDefined),
                ("\n\n", 0.0, UserDefined),
                ("<b>", 0.0, Control),
                ("x", 0.0, Normal),
            ],
            false,
        );
        // "\n\n\n": the two-newline token first, then the single one.
        assert_eq!(
            e.partition("\n\n\nx", true),
            [Fragment::Token(1), Fragment::Token(0), Fragment::Text(3..4)]
        );
        assert_eq!(e.encode("x<b>x", true).unwrap(), [3, 2, 3]);
        // Without parsing specials the control token stays text (here: no byte tokens for
        // '<', so that is an error naming the byte).
        assert!(matches!(
            e.encode("x<b>x", false),
            Err(TokenizerError::NoByteToken { byte: b'<' })
        ));
        assert_eq!(e.encode("", true).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        use TokenType::*;
        // "aaa": pairs (0,1) and (1,2) both spell "aa" with the same score; the left one wins,
        // leaving "aa" + "a".
        let e = encoder(&[("a", 0.0, Normal), ("aa", -1.0, Normal)], false);
        assert_eq!(e.encode("aaa", true).unwrap(), [1, 0]);
        assert_eq!(e.encode("aaaa", true).unwrap(), [1, 1]);
    }

    #[test]
    fn the_space_prefix_follows_specials_only_when_asked() {
        use TokenType::*;
        let tokens = [
            ("▁", 0.0, Normal),
            ("a", 0.0, Normal),
            ("▁a", 1.0, Normal),
            ("<s>", 0.0, Control),
        ];
        let with = encoder(&tokens, true);
        assert_eq!(with.encode("a<s>a", true).unwrap(), [2, 3, 2]);
        let without = encoder(&tokens, false);
        assert_eq!(without.encode("a<s>a", true).unwrap(), [1, 3, 1]);
        assert_eq!(without.encode(" a", true).unwrap(), [2]);
    }
}
