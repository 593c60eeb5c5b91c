//! Saving a [`ModelCache`] to a file and loading it back bit-identical.
//!
//! File layout (all integers little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `TQCACHE\0` |
//! | 4 | format version ([`FORMAT_VERSION`]) |
//! | 8 | header length `H` |
//! | H | JSON header: the state specs, every stream's layout (codec parameters and seeds, chosen outlier channels, centering policy and chosen mean as f32 bit patterns, basis policy and fitted basis as integers), and the identity of every codebook (distribution, bits, and a hash of its centroids) |
//! | … | body: per state, lengths and the raw pages (packed codes, f16 scales, positions) |
//! | 4 | CRC-32 of everything before it |
//!
//! Rotations and sketches are not stored: they are pure functions of the seeds in the header.
//! A centered stream's mean is stored as the `u32` bit patterns of its f32 values
//! (`mean_bits`), since JSON numbers need not round-trip an f32 bit for bit.
//!
//! Versions: 2 added the centering fields to the stream layouts, 3 the data-aware basis
//! (`basis` policy and `basis_fit`: the f16 rows, groups and f32 scales as integer bit
//! patterns, one codebook identity per group), 4 the plane basis (`basis = "planes"`: a fit
//! whose `components` list its coordinates) and the layouts' `rope_pairs`, 5 the RoPE-aware
//! key center (`center = "rope"`, its `m` in `mean_bits`) and the layouts' `rope_base`. This
//! build writes version 5 and reads 1 to 5 (older headers lack the newer fields, which default
//! to "not centered", "no basis", adjacent RoPE pairs and no RoPE base, exactly what those
//! writers stored); an older build refuses a newer file by its version rather than silently
//! decoding a basis stream as a plain one or a RoPE-centered one as first-chunk centered.
//! [`save`] is crash-safe ([`write_atomically`]): a save that fails or is killed leaves the
//! previous file intact. [`load_matching`] also checks that the file is a cache of the expected
//! model and allocation ([`PersistError::Mismatch`] otherwise).
//!
//! The codebook identity guards against a future solver producing different centroids for the
//! same parameters: such a file is refused rather than decoded with the wrong levels. A file
//! that is truncated, corrupted (checksum), of another version, or internally inconsistent is
//! a typed [`PersistError`], never a panic or an oversized allocation: every length is checked
//! against the bytes that remain before anything is allocated.

use serde::{Deserialize, Serialize};

use crate::error::CacheError;
use crate::states::{ModelCache, StateSpec};
use crate::stream::StreamLayout;
use crate::token_codec::TokenCodec;
use crate::token_store::TokenStore;

/// The first bytes of every saved cache.
pub const MAGIC: &[u8; 8] = b"TQCACHE\0";

/// The version this build writes (and the newest it reads).
pub const FORMAT_VERSION: u32 = 5;

/// The oldest version this build reads.
pub const MIN_FORMAT_VERSION: u32 = 1;

/// Why a saved cache could not be read (or written).
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading or writing the file failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Not a saved cache.
    #[error("not a turboquant cache file (bad magic)")]
    BadMagic,
    /// Written by another format version.
    #[error(
        "unsupported cache file version {found} \
         (this build reads versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
    },
    /// The file ends early.
    #[error("cache file is truncated: needed {needed} more bytes at offset {offset}")]
    Truncated {
        /// Where reading stopped.
        offset: usize,
        /// Bytes that were missing.
        needed: usize,
    },
    /// The checksum does not match the contents.
    #[error(
        "cache file is corrupted: CRC-32 {found:08x} does not match the contents ({computed:08x})"
    )]
    Corrupted {
        /// Stored checksum.
        found: u32,
        /// Checksum of the contents.
        computed: u32,
    },
    /// The header is not valid JSON of the expected shape.
    #[error("cache file header is invalid: {0}")]
    Header(#[from] serde_json::Error),
    /// The codebook this build computes differs from the one the file was written with.
    #[error("codebook mismatch for {0}: the file was written with different centroids")]
    CodebookMismatch(String),
    /// The contents contradict the header.
    #[error("cache file is inconsistent: {0}")]
    Inconsistent(&'static str),
    /// A valid cache, but not of the model or allocation it was loaded for
    /// ([`load_matching`]).
    #[error("cache file is for another model or allocation: {0}")]
    Mismatch(String),
    /// Rebuilding the states from the header failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// Codebook identity recorded per coded stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct CodebookIdentity {
    distribution: String,
    bits: u8,
    centroid_hash: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    specs: Vec<StateSpec>,
    /// Per state: key and value stream layouts of KV states.
    streams: Vec<Option<(Vec<StreamLayout>, Vec<StreamLayout>)>>,
    /// Per state, per stream (keys then values), per tier: codebook identities of coded streams.
    codebooks: CodebookTable,
}

fn codebook_identities(layout: &StreamLayout) -> Result<Vec<Option<CodebookIdentity>>, CacheError> {
    match layout.build_codec()? {
        TokenCodec::TwoTier(c) => Ok(vec![
            codebook_identity(c.outlier())?,
            codebook_identity(c.rest())?,
        ]),
        TokenCodec::Basis(c) => Ok(c
            .groups()
            .iter()
            .map(|g| Some(identity_of(&g.codebook)))
            .collect()),
        single => Ok(vec![codebook_identity(&single)?]),
    }
}

fn codebook_identity(codec: &TokenCodec) -> Result<Option<CodebookIdentity>, CacheError> {
    let mse = match codec {
        TokenCodec::Mse(c) => c,
        TokenCodec::DebiasedMse(c) => c.codec(),
        TokenCodec::Prod(c) => c.mse(),
        TokenCodec::F32 { .. }
        | TokenCodec::F16 { .. }
        | TokenCodec::Q8(_)
        | TokenCodec::TwoTier(_)
        | TokenCodec::Basis(_) => {
            return Ok(None);
        }
    };
    Ok(Some(identity_of(mse.codebook())))
}

fn identity_of(book: &tq_lloyd_max::LloydMaxCodebook) -> CodebookIdentity {
    let mut hasher = crc32fast::Hasher::new();
    for c in book.centroids() {
        hasher.update(&c.to_bits().to_le_bytes());
    }
    CodebookIdentity {
        distribution: format!("{:?}", book.distribution()),
        bits: book.bits(),
        centroid_hash: format!("{:08x}", hasher.finalize()),
    }
}

/// Per state, per stream (keys then values), per tier.
type CodebookTable = Vec<Vec<Vec<Option<CodebookIdentity>>>>;

fn codebooks(
    streams: &[Option<(Vec<StreamLayout>, Vec<StreamLayout>)>],
) -> Result<CodebookTable, CacheError> {
    streams
        .iter()
        .map(|s| match s {
            None => Ok(Vec::new()),
            Some((k, v)) => k.iter().chain(v).map(codebook_identities).collect(),
        })
        .collect()
}

/// Serializes the whole cache.
///
/// ```
/// use tq_cache::kv_cache::{uniform_streams, KvKind, KvLayout};
/// use tq_cache::persist::{from_bytes, to_bytes};
/// use tq_cache::states::{ModelCache, StateKind, StateSpec};
/// use tq_cache::token_store::Growth;
/// use tq_cache::CodecSpec;
/// let layout = KvLayout { kv_heads: 1, head_dim: 8, kind: KvKind::Growing { growth: Growth::Doubling { initial: 4 } }, max_rewind: 0, rope_pairs: Default::default(), rope_base: Default::default() };
/// let specs = vec![StateSpec { name: "l0".into(), kind: StateKind::Kv { layer: 0, layout } }];
/// let cache = ModelCache::new(specs, |_, l| {
///     let c = CodecSpec::F16 { dim: 8 };
///     Ok((uniform_streams(l, c), uniform_streams(l, c)))
/// }).unwrap();
/// let bytes = to_bytes(&cache).unwrap();
/// assert_eq!(to_bytes(&from_bytes(&bytes).unwrap()).unwrap(), bytes);
/// ```
pub fn to_bytes(cache: &ModelCache) -> Result<Vec<u8>, PersistError> {
    let streams = cache.kv_stream_layouts();
    let header = Header {
        specs: cache.specs().to_vec(),
        codebooks: codebooks(&streams)?,
        streams,
    };
    let header = serde_json::to_vec(&header)?;
    let mut out = ByteWriter(Vec::with_capacity(header.len() + 1024));
    out.0.extend_from_slice(MAGIC);
    out.u32(FORMAT_VERSION);
    out.u64(header.len() as u64);
    out.0.extend_from_slice(&header);
    cache.write_to(&mut out);
    let crc = crc32fast::hash(&out.0);
    out.u32(crc);
    Ok(out.0)
}

/// Rebuilds a cache from [`to_bytes`] output.
pub fn from_bytes(bytes: &[u8]) -> Result<ModelCache, PersistError> {
    let mut input = ByteReader { bytes, offset: 0 };
    if input.take(8)? != MAGIC {
        return Err(PersistError::BadMagic);
    }
    let version = input.u32()?;
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(PersistError::UnsupportedVersion { found: version });
    }
    if bytes.len() < 4 {
        return Err(PersistError::Truncated {
            offset: 0,
            needed: 4,
        });
    }
    let (contents, stored) = bytes.split_at(bytes.len() - 4);
    let found = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    let computed = crc32fast::hash(contents);
    if found != computed {
        return Err(PersistError::Corrupted { found, computed });
    }
    let mut input = ByteReader {
        bytes: contents,
        offset: input.offset,
    };
    let header_len = input.usize()?;
    let header: Header = serde_json::from_slice(input.take(header_len)?)?;
    if header.streams.len() != header.specs.len() {
        return Err(PersistError::Inconsistent("header stream table"));
    }
    if codebooks(&header.streams)? != header.codebooks {
        return Err(PersistError::CodebookMismatch(
            "a stream of this cache (centroid hash differs)".into(),
        ));
    }
    let streams = header.streams;
    let mut index_of_layer = std::collections::BTreeMap::new();
    for (i, spec) in header.specs.iter().enumerate() {
        if let crate::states::StateKind::Kv { layer, .. } = spec.kind {
            index_of_layer.insert(layer, i);
        }
    }
    let mut cache = ModelCache::new(header.specs, |layer, _| {
        index_of_layer
            .get(&layer)
            .and_then(|&i| streams[i].clone())
            .ok_or_else(|| {
                CacheError::InvalidConfig(format!("no stream layouts for layer {layer}"))
            })
    })?;
    cache.read_from(&mut input)?;
    if input.offset != contents.len() {
        return Err(PersistError::Inconsistent(
            "trailing bytes after the last state",
        ));
    }
    Ok(cache)
}

/// Writes the cache to `path` (see the module docs for the format), crash-safe: the bytes go
/// to a temporary file in the same directory, which is synced and then renamed over `path`
/// ([`write_atomically`]). A save that fails or is killed at any point leaves the previous
/// file at `path` untouched.
pub fn save(cache: &ModelCache, path: impl AsRef<std::path::Path>) -> Result<(), PersistError> {
    let bytes = to_bytes(cache)?;
    write_atomically(path.as_ref(), |file| {
        std::io::Write::write_all(file, &bytes)
    })?;
    Ok(())
}

/// Reads a cache written by [`save`].
pub fn load(path: impl AsRef<std::path::Path>) -> Result<ModelCache, PersistError> {
    from_bytes(&std::fs::read(path)?)
}

/// Reads a cache written by [`save`] and checks that it is a cache of `expected`'s shape and
/// allocation: the same states and, stream by stream, the same layouts (codecs, seeds, policies
/// and windows), whatever each stream has calibrated since (outlier channels, means, bases).
/// A file written for another model or allocation is [`PersistError::Mismatch`] naming the
/// first difference, so a caller can recompute instead of trusting it.
pub fn load_matching(
    path: impl AsRef<std::path::Path>,
    expected: &ModelCache,
) -> Result<ModelCache, PersistError> {
    let cache = load(path)?;
    check_matches(&cache, expected)?;
    Ok(cache)
}

/// The check of [`load_matching`] on a cache already in memory.
pub fn check_matches(cache: &ModelCache, expected: &ModelCache) -> Result<(), PersistError> {
    if cache.specs() != expected.specs() {
        return Err(PersistError::Mismatch(
            "the states (layers, head counts, head dimensions or windows) differ".into(),
        ));
    }
    for (state, (found, wanted)) in cache
        .kv_stream_layouts()
        .iter()
        .zip(expected.kv_stream_layouts())
        .enumerate()
    {
        let (Some((fk, fv)), Some((wk, wv))) = (found, wanted) else {
            continue;
        };
        for (kind, found, wanted) in [("key", fk, wk), ("value", fv, wv)] {
            for (head, (f, w)) in found.iter().zip(&wanted).enumerate() {
                if f.uncalibrated() != w.uncalibrated() {
                    return Err(PersistError::Mismatch(format!(
                        "state `{}`, {kind} stream of KV head {head}: the file's layout \
                         {:?} with {} sinks and a {}-token window is not the expected {:?} \
                         with {} and {} (another allocation?)",
                        cache.specs()[state].name,
                        f.codec,
                        f.sink_tokens,
                        f.recent_tokens,
                        w.codec,
                        w.sink_tokens,
                        w.recent_tokens
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Replaces the file at `path` with what `write` writes, crash-safe: `write` fills a new
/// temporary file in the same directory (`.NAME.PID.N.tmp`, created exclusively), which is
/// flushed and synced to disk, then renamed over `path` (atomic on POSIX file systems), and
/// the directory is synced so the rename itself survives a power loss. If `write`, the sync or
/// the rename fails — or the process dies anywhere before the rename — `path` still holds its
/// previous contents; on an error the temporary file is removed.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("tq-atomic-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("cache.tq");
/// std::fs::write(&path, b"old")?;
/// let failed = tq_cache::persist::write_atomically(&path, |_| Err(std::io::Error::other("disk full")));
/// assert!(failed.is_err());
/// assert_eq!(std::fs::read(&path)?, b"old");
/// tq_cache::persist::write_atomically(&path, |f| std::io::Write::write_all(f, b"new"))?;
/// assert_eq!(std::fs::read(&path)?, b"new");
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn write_atomically(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let temp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)?;
    let written = write(&mut file)
        .and_then(|()| std::io::Write::flush(&mut file))
        .and_then(|()| file.sync_all());
    drop(file);
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        // Best effort: the error that matters is the one returned.
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    sync_directory(&dir)
}

/// Makes a rename in `dir` durable (POSIX: fsync the directory). Elsewhere a no-op: Windows
/// cannot open a directory as a file, and its rename is already journaled by NTFS.
fn sync_directory(dir: &std::path::Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Little-endian output buffer.
pub(crate) struct ByteWriter(Vec<u8>);

impl ByteWriter {
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// The filled records of a store: the count, then each token's words and scales.
    pub(crate) fn store(&mut self, store: &TokenStore) {
        self.u64(store.len() as u64);
        for t in 0..store.len() {
            if let Some((words, scales)) = store.record_copy(t) {
                for w in words.iter() {
                    self.u32(*w);
                }
                for s in scales {
                    self.0.extend_from_slice(&s.to_bits().to_le_bytes());
                }
            }
        }
    }
}

/// Bounds-checked little-endian input.
pub(crate) struct ByteReader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> ByteReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PersistError> {
        let remaining = self.bytes.len() - self.offset;
        if n > remaining {
            return Err(PersistError::Truncated {
                offset: self.offset,
                needed: n - remaining,
            });
        }
        let slice = &self.bytes[self.offset..self.offset + n];
        self.offset += n;
        Ok(slice)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, PersistError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, PersistError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn usize(&mut self) -> Result<usize, PersistError> {
        usize::try_from(self.u64()?)
            .map_err(|_| PersistError::Inconsistent("length exceeds this machine's address space"))
    }

    /// Refills an empty store with records written by [`ByteWriter::store`].
    /// The record count of the store [`store`](Self::store) would read next into `store`
    /// (not consumed), once its records are known to be in the input.
    pub(crate) fn store_len(&self, store: &TokenStore) -> Result<usize, PersistError> {
        let mut ahead = ByteReader {
            bytes: self.bytes,
            offset: self.offset,
        };
        let n = ahead.usize()?;
        let per_token = 4 * store.record_words() + 2 * store.scales_per_token();
        let needed = n
            .checked_mul(per_token)
            .ok_or(PersistError::Inconsistent("record count overflows"))?;
        if needed > ahead.bytes.len() - ahead.offset {
            return Err(PersistError::Truncated {
                offset: ahead.offset,
                needed: needed - (ahead.bytes.len() - ahead.offset),
            });
        }
        Ok(n)
    }

    pub(crate) fn store(&mut self, store: &mut TokenStore) -> Result<(), PersistError> {
        // Check the bytes exist before growing any page.
        let n = self.store_len(store)?;
        self.usize()?;
        if let crate::token_store::Growth::Static { capacity } = store.growth()
            && n > capacity
        {
            return Err(PersistError::Inconsistent(
                "more records than the store's capacity",
            ));
        }
        let mut words = vec![0u32; store.record_words()];
        let mut scales = vec![half::f16::ZERO; store.scales_per_token()];
        for _ in 0..n {
            for w in words.iter_mut() {
                *w = self.u32()?;
            }
            for s in scales.iter_mut() {
                let b = self.take(2)?;
                *s = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
            }
            store
                .push_record(&words, &scales)
                .map_err(PersistError::Cache)?;
        }
        Ok(())
    }
}
