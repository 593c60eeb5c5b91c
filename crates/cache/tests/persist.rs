//! Saved caches reload bit-identical; damaged files are typed errors, never panics.

mod common;

use common::{CODECS, codec, sliding, vectors};
use std::io::Write;
use tq_cache::CodecSpec;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvKind, KvLayout, uniform_streams};

use tq_cache::persist::{
    FORMAT_VERSION, PersistError, from_bytes, load, load_matching, save, to_bytes, write_atomically,
};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

fn specs() -> Vec<StateSpec> {
    let full = KvLayout {
        kv_heads: 2,
        head_dim: 64,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 16 },
        },
        max_rewind: 4,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    };
    vec![
        StateSpec {
            name: "l0".into(),
            kind: StateKind::Kv {
                layer: 0,
                layout: full,
            },
        },
        StateSpec {
            name: "l1".into(),
            kind: StateKind::Kv {
                layer: 1,
                layout: sliding(2, 64, 24, 2),
            },
        },
        StateSpec {
            name: "l2".into(),
            kind: StateKind::SharedKv {
                layer: 2,
                source_layer: 0,
            },
        },
        StateSpec {
            name: "rec".into(),
            kind: StateKind::Fixed { shape: vec![3, 5] },
        },
    ]
}

/// Sinks and recent windows on the growing layer, a window of its own per stream and head
/// (keys 7 and 6 tokens, values 5 and 4), as an allocation's per-stream `recent_fp_tokens` gives.
fn build(key: usize, value: usize) -> ModelCache {
    build_with(key, value, None)
}

/// [`build`] with the windows' copies in `window` (`None`: f16).
fn build_with(key: usize, value: usize, window: Option<CodecSpec>) -> ModelCache {
    build_growing(key, value, window, None)
}

/// [`build_with`] with windows that also grow as `fraction` of the tokens held.
fn build_growing(
    key: usize,
    value: usize,
    window: Option<CodecSpec>,
    fraction: Option<f64>,
) -> ModelCache {
    build_keeping(specs(), key, value, window, fraction, None)
}

/// [`build_growing`] over the states `specs`, with heavy hitters at `factor` (ignored by a
/// sliding layer's ring).
fn build_keeping(
    specs: Vec<StateSpec>,
    key: usize,
    value: usize,
    window: Option<CodecSpec>,
    fraction: Option<f64>,
    factor: Option<f32>,
) -> ModelCache {
    ModelCache::new(specs, |layer, layout| {
        let streams = |c, recent: usize| {
            uniform_streams(layout, c)
                .into_iter()
                .enumerate()
                .map(|(head, mut s)| {
                    s.sink_tokens = 3;
                    s.recent_tokens = recent - head;
                    s.recent_fraction = fraction;
                    s.recent = window;
                    s.heavy_hitters = factor;
                    s
                })
                .collect::<Vec<_>>()
        };
        Ok((
            streams(codec(key, 64, 5, layer as u64), 7),
            streams(codec(value, 64, 4, 100 + layer as u64), 5),
        ))
    })
    .unwrap()
}

fn run(cache: &mut ModelCache, from: usize, to: usize) -> Vec<f32> {
    let mut outs = Vec::new();
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    for t in from..to {
        let positions: Vec<u32> = (0..=t as u32).collect();
        for layer in 0..3 {
            let q = vectors(4, 64, (t * 7 + layer) as u64);
            let k = vectors(2, 64, (t * 7 + layer) as u64 + 99);
            let kv = if layer == 2 {
                None
            } else {
                Some((&k[..], &k[..]))
            };
            let mut out = vec![0.0; 4 * 64];
            cache
                .forward_layer(
                    layer,
                    &q,
                    kv,
                    &positions,
                    shape,
                    AttentionKernel::Fused,
                    &mut out,
                )
                .unwrap();
            outs.extend(out);
        }
        cache.fixed_mut("rec").unwrap()[t % 15] += 1.0;
    }
    outs
}

/// `cache` (40 tokens run) saves and reloads bit-identical, with the same memory, and both
/// copies continue identically over 10 more tokens.
fn assert_reload_continues(cache: &mut ModelCache, kind: usize) {
    let bytes = to_bytes(cache).unwrap();
    let mut reloaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&reloaded).unwrap(), bytes, "codec {kind}");
    assert_eq!(reloaded.memory(), cache.memory());
    assert_eq!(
        run(&mut reloaded, 40, 50),
        run(cache, 40, 50),
        "codec {kind}"
    );
}

/// An 8-bit window — its tokens' codes written only as they leave it, so each body is a window
/// shorter than its stream — reloads bit-identical and continues identically.
#[test]
fn eight_bit_windows_reload_bit_identical() {
    for kind in [2, 5] {
        let mut cache = build_with(kind, 3, Some(CodecSpec::Q8 { dim: 64 }));
        run(&mut cache, 0, 40);
        let kv = cache.kv(0).unwrap();
        assert!(kv.keys(0).defers_codes());
        assert_eq!(kv.keys(0).body().len(), 40 - 7);
        assert_reload_continues(&mut cache, kind);
    }
}

/// Windows that grow with the context (a quarter of the tokens held, over floors of 4–7) in a
/// cache that grows in pages: their rings grew past the slots they were built with (floor +
/// rewind margin), and still reload bit-identical and continue identically (f16 and 8-bit
/// copies).
#[test]
fn growing_windows_reload_bit_identical() {
    for window in [None, Some(CodecSpec::Q8 { dim: 64 })] {
        let mut cache = build_growing(5, 3, window, Some(0.25));
        run(&mut cache, 0, 40);
        let kv = cache.kv(0).unwrap();
        for h in 0..2 {
            let keys = kv.keys(h);
            assert_eq!(keys.recent_start(), 30, "{window:?}");
            assert!(keys.recent_slots() >= 10 + 4 && keys.recent_slots() > 7 - h + 4);
        }
        assert_reload_continues(&mut cache, 5);
    }
}

/// Heavy hitters — kept tokens, their copies and the counts of the tokens still in the
/// window — reload bit-identical, and the reloaded cache goes on keeping the same tokens.
#[test]
fn heavy_hitters_reload_bit_identical() {
    for window in [None, Some(CodecSpec::Q8 { dim: 64 })] {
        let mut cache = build_keeping(specs(), 2, 3, window, None, Some(1.2));
        run(&mut cache, 0, 40);
        let kv = cache.kv(0).unwrap();
        let kept = kv.keys(0).heavy_hitters().unwrap().kept().len();
        assert!(kept > 0 && kv.kept_bytes() > 0, "{window:?}");
        assert_reload_continues(&mut cache, 2);
        let kv = cache.kv(0).unwrap();
        assert!(kv.keys(0).heavy_hitters().unwrap().kept().len() >= kept);
    }
}

/// A rewind to before tokens whose heavy-hitter decisions were made (the values' 4-token
/// window of head 1 decides up to 37 of 40 tokens), then a reload: the counts resume at the
/// new end, the saved cache reloads bit-identical and both continue identically (the growing
/// layer alone, which may rewind its 4 tokens).
#[test]
fn heavy_hitters_reload_after_a_rewind() {
    let growing = specs()[..1].to_vec();
    let mut cache = build_keeping(
        growing,
        2,
        3,
        Some(CodecSpec::Q8 { dim: 64 }),
        None,
        Some(1.2),
    );
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    let step = |cache: &mut ModelCache, t: usize| {
        let positions: Vec<u32> = (0..=t as u32).collect();
        let q = vectors(4, 64, t as u64);
        let k = vectors(2, 64, t as u64 + 99);
        let mut out = vec![0.0; 4 * 64];
        cache
            .forward_layer(
                0,
                &q,
                Some((&k[..], &k[..])),
                &positions,
                shape,
                AttentionKernel::Fused,
                &mut out,
            )
            .unwrap();
        out
    };
    for t in 0..40 {
        step(&mut cache, t);
    }
    cache.truncate(36).unwrap();
    let bytes = to_bytes(&cache).unwrap();
    let mut reloaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&reloaded).unwrap(), bytes);
    for t in 36..46 {
        assert_eq!(step(&mut reloaded, t), step(&mut cache, t), "token {t}");
    }
}

#[test]
fn reload_is_bit_identical_and_continues_identically() {
    for kind in 0..CODECS {
        let mut cache = build(kind, (kind + 3) % CODECS);
        run(&mut cache, 0, 40);
        assert_reload_continues(&mut cache, kind);
    }
    let dir = std::env::temp_dir().join(format!("tq-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.tqc");
    let mut cache = build(5, 2);
    run(&mut cache, 0, 10);
    save(&cache, &path).unwrap();
    assert_eq!(
        to_bytes(&load(&path).unwrap()).unwrap(),
        to_bytes(&cache).unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_files_are_typed_errors() {
    let mut cache = build(5, 2);
    run(&mut cache, 0, 30);
    let bytes = to_bytes(&cache).unwrap();
    // Every truncation point: an error, never a panic.
    for cut in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
        assert!(from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    // A flipped bit anywhere after the version is caught by the checksum.
    for at in (12..bytes.len() - 4).step_by(97) {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x10;
        assert!(
            matches!(from_bytes(&damaged), Err(PersistError::Corrupted { .. })),
            "byte {at}"
        );
    }
    let mut bad_magic = bytes.clone();
    bad_magic[0] = b'X';
    assert!(matches!(
        from_bytes(&bad_magic),
        Err(PersistError::BadMagic)
    ));
    let mut future = bytes.clone();
    future[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        from_bytes(&future),
        Err(PersistError::UnsupportedVersion { .. })
    ));
}

/// Rewrites the header and the checksum, as a hostile or buggy writer could.
fn with_header(bytes: &[u8], edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    let header_len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let mut header: serde_json::Value =
        serde_json::from_slice(&bytes[20..20 + header_len]).unwrap();
    edit(&mut header);
    let header = serde_json::to_vec(&header).unwrap();
    let mut out = bytes[..12].to_vec();
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[20 + header_len..bytes.len() - 4]);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn hostile_headers_are_refused() {
    let mut cache = build(2, 5);
    run(&mut cache, 0, 12);
    let bytes = to_bytes(&cache).unwrap();
    let unchanged = with_header(&bytes, |_| {});
    assert!(from_bytes(&unchanged).is_ok());
    let wrong_codebook = with_header(&bytes, |h| {
        h["codebooks"][0][0][0]["centroid_hash"] = "00000000".into();
    });
    assert!(matches!(
        from_bytes(&wrong_codebook),
        Err(PersistError::CodebookMismatch(_))
    ));
    // A header that declares a bigger head dimension than the body holds: inconsistent, and
    // nothing is allocated for the claimed size beyond what the bytes can back.
    let wider = with_header(&bytes, |h| {
        h["specs"][0]["kind"]["layout"]["kv_heads"] = 3.into();
    });
    assert!(from_bytes(&wider).is_err());
    let garbage = with_header(&bytes, |h| {
        h["specs"] = "nonsense".into();
    });
    assert!(matches!(from_bytes(&garbage), Err(PersistError::Header(_))));
}

/// Files in `dir` other than the ones named (a failed save must not leave its temporary file).
fn stray_files(dir: &std::path::Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !keep.contains(&name.as_str()))
        .collect()
}

/// A save that fails half-way (the failure injected after half the new bytes are written)
/// leaves the previous file loading bit-identical and no temporary file behind; the next save
/// replaces it. Catches a save that writes the target in place (the previous file would be
/// half overwritten) or that renames before the write completed.
#[test]
fn a_failed_save_keeps_the_previous_file() {
    let dir = std::env::temp_dir().join(format!("tq-persist-atomic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.tqc");
    let mut old = build(2, 3);
    run(&mut old, 0, 12);
    save(&old, &path).unwrap();
    let old_bytes = to_bytes(&old).unwrap();
    let mut new = build(2, 3);
    run(&mut new, 0, 30);
    let new_bytes = to_bytes(&new).unwrap();
    assert_ne!(new_bytes, old_bytes);
    let failed = write_atomically(&path, |file| {
        file.write_all(&new_bytes[..new_bytes.len() / 2])?;
        Err(std::io::Error::other("injected failure mid-save"))
    });
    assert_eq!(failed.unwrap_err().to_string(), "injected failure mid-save");
    assert_eq!(to_bytes(&load(&path).unwrap()).unwrap(), old_bytes);
    assert_eq!(stray_files(&dir, &["cache.tqc"]), Vec::<String>::new());
    save(&new, &path).unwrap();
    assert_eq!(to_bytes(&load(&path).unwrap()).unwrap(), new_bytes);
    assert_eq!(stray_files(&dir, &["cache.tqc"]), Vec::<String>::new());
    // A path that names no file is an error before anything is written.
    assert!(write_atomically(std::path::Path::new("/"), |_| Ok(())).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `load_matching` accepts a file of the expected shape and allocation whatever its streams
/// calibrated (two-tier channels, means) and refuses another allocation or model with a typed
/// error that says so; another format version is refused by its version.
#[test]
fn a_file_for_another_allocation_or_version_is_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("tq-persist-match-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.tqc");
    let allocation = |name: &str| tq_cache::allocation::Allocation::preset(name).unwrap();
    let mut cache = ModelCache::with_allocation(specs(), &allocation("tq3.5")).unwrap();
    run(&mut cache, 0, 20);
    save(&cache, &path).unwrap();
    let fresh = ModelCache::with_allocation(specs(), &allocation("tq3.5")).unwrap();
    let loaded = load_matching(&path, &fresh).unwrap();
    assert_eq!(to_bytes(&loaded).unwrap(), to_bytes(&cache).unwrap());
    let other = ModelCache::with_allocation(specs(), &allocation("k5v4")).unwrap();
    let err = load_matching(&path, &other).unwrap_err();
    assert!(
        matches!(err, PersistError::Mismatch(_)) && err.to_string().contains("another"),
        "{err}"
    );
    let mut fewer = specs();
    fewer.pop();
    let other_model = ModelCache::with_allocation(fewer, &allocation("tq3.5")).unwrap();
    assert!(matches!(
        load_matching(&path, &other_model),
        Err(PersistError::Mismatch(_))
    ));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = load_matching(&path, &fresh).unwrap_err();
    assert!(
        matches!(err, PersistError::UnsupportedVersion { found } if found == FORMAT_VERSION + 1),
        "{err}"
    );
    assert!(err.to_string().contains("version"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A positions table that does not increase (two stored positions swapped, the checksum
/// rewritten) is refused on load: its masks would be wrong.
#[test]
fn positions_that_do_not_increase_are_refused() {
    let mut cache = build(0, 0);
    run(&mut cache, 0, 12);
    let mut bytes = to_bytes(&cache).unwrap();
    let header_len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    // Layer 0's table: positions 0, 1, ..., 11 as u32 words, right after the header.
    let table: Vec<u8> = (0..12u32).flat_map(u32::to_le_bytes).collect();
    let at = 20
        + header_len
        + bytes[20 + header_len..]
            .windows(table.len())
            .position(|w| w == table)
            .expect("the positions table");
    bytes[at + 8..at + 12].copy_from_slice(&5u32.to_le_bytes()); // 0, 1, 5, 3, ...
    let n = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    assert!(
        matches!(
            from_bytes(&bytes),
            Err(PersistError::Inconsistent(
                "stored positions do not increase"
            ))
        ),
        "{:?}",
        from_bytes(&bytes).err()
    );
    // The same file with the table intact loads (the edit, not the search, is what fails).
    bytes[at + 8..at + 12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    from_bytes(&bytes).unwrap();
}
