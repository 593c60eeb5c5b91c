//! A prompt cache: the cache after a prompt's prefill, saved with what it is a cache *of* (the
//! model file's SHA-256, the allocation, the token ids), so a later run whose prompt starts
//! with those tokens prefills only the rest.
//!
//! # File
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `TQPROMPT` |
//! | 4 | version ([`PROMPT_CACHE_VERSION`]) |
//! | 8 | length `H` of the JSON header |
//! | H | [`PromptCacheHeader`]: model hash, allocation name, token ids |
//! | … | the cache, as [`tq_cache::persist::to_bytes`] writes it (its own version and CRC-32) |
//!
//! Written crash-safe ([`tq_cache::persist::write_atomically`]): a killed save leaves the
//! previous file. Read back, nothing is trusted: another model (hash), another allocation (name
//! or any stream layout: [`tq_cache::persist::check_matches`]), another format version, or a
//! damaged file is a typed [`PromptCacheError`], and the caller recomputes.
//!
//! # Exactness
//!
//! A warm run rewinds the loaded cache to the common prefix of its tokens and the new prompt and
//! prefills the rest, so it computes what a cold run computes as long as the stored records do
//! not depend on the chunking. They do not, except for streams that calibrate on their first
//! batch (two-tier outlier channels, means, bases): [`reusable_prefix`] reuses a cache only
//! when its first batch is the one a cold run would calibrate on, so a warm run gives the cold
//! run's tokens exactly (tested on the reference model with a centered allocation).
//!
//! Heavy hitters ([`tq_cache::heavy_hitters`]) make the cache depend on where prefill chunks
//! end and survive a rewind, so a cache that keeps them is saved at a chunk boundary — the last
//! multiple of the prefill chunk before the prompt's last token, after the chunks a cold run
//! runs, the rest of the prompt then running as the cold run's last chunk — and reused only
//! whole, when its tokens start the new prompt and end on a boundary of its chunks
//! ([`reusable_boundary`]): the warm run then runs the cold run's chunks from there.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tq_cache::persist::{PersistError, check_matches, from_bytes, to_bytes, write_atomically};
use tq_cache::states::ModelCache;

/// The first bytes of a prompt-cache file.
pub const PROMPT_CACHE_MAGIC: &[u8; 8] = b"TQPROMPT";

/// The version this build writes and reads.
pub const PROMPT_CACHE_VERSION: u32 = 1;

/// What a prompt cache is a cache of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptCacheHeader {
    /// Lowercase hex SHA-256 of the model file.
    pub model_sha256: String,
    /// The allocation's name (its layouts are checked too).
    pub allocation: String,
    /// The token ids the cache holds, in order.
    pub tokens: Vec<u32>,
}

/// Why a prompt cache was not used.
#[derive(Debug, thiserror::Error)]
pub enum PromptCacheError {
    /// Reading or writing the file failed.
    #[error("prompt cache I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Not a prompt-cache file, or a damaged one.
    #[error("not a prompt cache (or a damaged one): {0}")]
    Format(String),
    /// Written by another version of this format.
    #[error("prompt cache version {found} (this build reads {PROMPT_CACHE_VERSION})")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// Made with another model file.
    #[error("prompt cache is for another model (SHA-256 {found}, this model {expected})")]
    OtherModel {
        /// The model hash in the file.
        found: String,
        /// This run's model hash.
        expected: String,
    },
    /// Made with another allocation.
    #[error("prompt cache is for allocation `{found}`, this run uses `{expected}`")]
    OtherAllocation {
        /// The allocation in the file.
        found: String,
        /// This run's allocation.
        expected: String,
    },
    /// The saved cache itself is damaged, of another version, or of other layouts.
    #[error(transparent)]
    Cache(#[from] PersistError),
    /// The header says one thing and the cache another.
    #[error(
        "prompt cache is inconsistent: the header lists {tokens} tokens, the cache holds {cached}"
    )]
    Inconsistent {
        /// Tokens in the header.
        tokens: usize,
        /// Tokens in the cache.
        cached: usize,
    },
}

/// Writes `cache` (holding `header.tokens`) to `path`, crash-safe.
pub fn save_prompt_cache(
    path: &Path,
    header: &PromptCacheHeader,
    cache: &ModelCache,
) -> Result<(), PromptCacheError> {
    if cache.len() != header.tokens.len() {
        return Err(PromptCacheError::Inconsistent {
            tokens: header.tokens.len(),
            cached: cache.len(),
        });
    }
    let json = serde_json::to_vec(header).map_err(|e| PromptCacheError::Format(e.to_string()))?;
    let body = to_bytes(cache)?;
    write_atomically(path, |file| {
        use std::io::Write;
        file.write_all(PROMPT_CACHE_MAGIC)?;
        file.write_all(&PROMPT_CACHE_VERSION.to_le_bytes())?;
        file.write_all(&(json.len() as u64).to_le_bytes())?;
        file.write_all(&json)?;
        file.write_all(&body)
    })?;
    Ok(())
}

/// Reads a prompt cache and checks it against this run: the model hash, the allocation's name,
/// and every stream layout against `fresh` (an empty cache of this run's model and allocation).
pub fn load_prompt_cache(
    path: &Path,
    model_sha256: &str,
    allocation: &str,
    fresh: &ModelCache,
) -> Result<(PromptCacheHeader, ModelCache), PromptCacheError> {
    let bytes = std::fs::read(path)?;
    let bad = |what: &str| PromptCacheError::Format(what.to_owned());
    if bytes.len() < 20 || &bytes[..8] != PROMPT_CACHE_MAGIC {
        return Err(bad("bad magic"));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().map_err(|_| bad("version"))?);
    if version != PROMPT_CACHE_VERSION {
        return Err(PromptCacheError::Version { found: version });
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().map_err(|_| bad("length"))?);
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(20))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("the header runs past the end of the file"))?;
    let header: PromptCacheHeader =
        serde_json::from_slice(&bytes[20..end]).map_err(|e| bad(&e.to_string()))?;
    if header.model_sha256 != model_sha256 {
        return Err(PromptCacheError::OtherModel {
            found: header.model_sha256,
            expected: model_sha256.to_owned(),
        });
    }
    if header.allocation != allocation {
        return Err(PromptCacheError::OtherAllocation {
            found: header.allocation,
            expected: allocation.to_owned(),
        });
    }
    let cache = from_bytes(&bytes[end..])?;
    check_matches(&cache, fresh)?;
    if cache.len() != header.tokens.len() {
        return Err(PromptCacheError::Inconsistent {
            tokens: header.tokens.len(),
            cached: cache.len(),
        });
    }
    Ok((header, cache))
}

/// For a cache whose contents depend on where prefill chunks end (heavy hitters): how many
/// of `cached` tokens a run of `prompt` can keep — all of them when they start `prompt`, leave
/// at least its last token to run, and end on a boundary of `chunk`-token chunks from the
/// start (the cache was saved there, after the chunks a cold run runs), else 0 (a rewind would
/// keep decisions a cold run does not make).
///
/// ```
/// use tq_models::prompt_cache::reusable_boundary;
/// assert_eq!(reusable_boundary(&[1, 2, 3, 4], &[1, 2, 3, 4, 5], 2), 4);
/// assert_eq!(reusable_boundary(&[1, 2, 3, 4], &[1, 2, 3, 4], 2), 0); // its last token must run
/// assert_eq!(reusable_boundary(&[1, 2, 3, 4], &[1, 2, 3, 9, 5], 2), 0); // would rewind
/// assert_eq!(reusable_boundary(&[1, 2, 3], &[1, 2, 3, 4], 2), 0); // not a chunk boundary
/// ```
pub fn reusable_boundary(cached: &[u32], prompt: &[u32], chunk: usize) -> usize {
    let whole = !cached.is_empty() && cached.len() < prompt.len() && prompt.starts_with(cached);
    if whole && chunk > 0 && cached.len().is_multiple_of(chunk) {
        cached.len()
    } else {
        0
    }
}

/// Where a `--prompt-cache` run of an `n`-token prompt saves its cache: after all but the last
/// prompt token (`n − 1`), or — for a cache that keeps heavy hitters (`aligned`) — after the
/// last whole `chunk`-token chunk before it (0: nothing to save).
///
/// ```
/// use tq_models::prompt_cache::save_point;
/// assert_eq!(save_point(330, 256, false), 329);
/// assert_eq!(save_point(330, 256, true), 256);
/// assert_eq!(save_point(257, 256, true), 256);
/// assert_eq!(save_point(256, 256, true), 0);
/// ```
pub fn save_point(n: usize, chunk: usize, aligned: bool) -> usize {
    let last = n.saturating_sub(1);
    if aligned {
        last / chunk.max(1) * chunk.max(1)
    } else {
        last
    }
}

/// How many of `cached` tokens a run of `prompt` can keep: their common prefix, less one when
/// it covers the whole prompt (the last prompt token must run to give the next token's
/// logits) — or 0 when the cache's first batch is not the one a cold run of `prompt` would
/// calibrate on. A `--prompt-cache` run prefills all but the last prompt token in chunks of
/// `first_chunk` and saves that, so its first batch is `prompt[..min(first_chunk, n − 1)]`;
/// a warm run is the cold run exactly when it keeps at least that batch: `keep ≥ first_chunk`,
/// or the cache *is* that batch.
///
/// ```
/// use tq_models::prompt_cache::reusable_prefix;
/// assert_eq!(reusable_prefix(&[1, 2, 3, 4], &[1, 2, 3, 9, 9], 2), 3);
/// assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 3, 4], 8), 3); // the same first batch
/// assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 3, 4, 5], 8), 0); // a cold run batches 4
/// assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 7, 3], 2), 0);
/// ```
pub fn reusable_prefix(cached: &[u32], prompt: &[u32], first_chunk: usize) -> usize {
    let common = cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let keep = common.min(prompt.len().saturating_sub(1));
    let cold_batch = first_chunk.min(prompt.len().saturating_sub(1));
    if keep >= first_chunk || (keep == cached.len() && cached.len() == cold_batch && keep > 0) {
        keep
    } else {
        0
    }
}
