//! A record, beside a model file, that the file was verified: its expected SHA-256 and the
//! file's fingerprint (size, modification time, inode) when it was.
//!
//! Hashing the whole model on every start costs a quarter of a second for SmolLM2 (98 MB)
//! and half a second for Gemma 3 270M (253 MB) — on every `tq` command, however short. A model
//! file is written once (extracted, checked, renamed into place) and never modified by this
//! project, so a file whose fingerprint still equals the one recorded right after a full check
//! is the file that was checked; any write to it changes its modification time, and a
//! replacement changes its inode. What the stamp does not catch is damage that changes no
//! metadata (a failing disk): delete the `.verified` file to force a full check.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// The stamp of `file`: `<file>.verified` beside it.
pub(crate) fn stamp_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".verified");
    PathBuf::from(name)
}

/// The fingerprint of `file` as the stamp records it: `size=… mtime_ns=… inode=…`.
fn fingerprint(file: &Path) -> Option<String> {
    let meta = fs::metadata(file).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    Some(format!(
        "size={} mtime_ns={} inode={inode}",
        meta.len(),
        mtime.as_nanos()
    ))
}

/// The stamp's text for `file` verified against `sha256`.
fn record(file: &Path, sha256: &str) -> Option<String> {
    Some(format!(
        "sha256={} {}\n",
        sha256.to_ascii_lowercase(),
        fingerprint(file)?
    ))
}

/// Whether `file` has `size` bytes and a stamp saying it was verified against `sha256` with
/// the fingerprint it has now.
pub(crate) fn is_current(file: &Path, sha256: &str, size: u64) -> bool {
    let Ok(stamp) = fs::read_to_string(stamp_path(file)) else {
        return false;
    };
    let size_ok = fs::metadata(file).is_ok_and(|m| m.len() == size);
    size_ok && record(file, sha256).is_some_and(|now| now == stamp)
}

/// Records that `file` was just verified against `sha256`. Best effort: a cache folder that
/// cannot be written only means the next start hashes again. Written to a temporary name and
/// renamed, so a reader never sees half a stamp.
pub(crate) fn write(file: &Path, sha256: &str) {
    let Some(text) = record(file, sha256) else {
        return;
    };
    let stamp = stamp_path(file);
    let mut partial = stamp.as_os_str().to_owned();
    partial.push(".partial");
    if fs::write(&partial, text).is_ok() && fs::rename(&partial, &stamp).is_err() {
        let _ = fs::remove_file(&partial);
    }
}

/// Removes `file`'s stamp (the file failed its check, or is being replaced).
pub(crate) fn remove(file: &Path) {
    let _ = fs::remove_file(stamp_path(file));
}
