//! Prompt-cache files: a saved cache reloads bit-identical with its header, and nothing about
//! a file is trusted — another model, another allocation (by name or by any stream layout),
//! another version, a damaged or inconsistent file are typed errors the caller recovers from.

mod cache_common;

use tq_cache::allocation::Allocation;
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::persist::{PersistError, to_bytes};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_models::prompt_cache::{
    PROMPT_CACHE_VERSION, PromptCacheError, PromptCacheHeader, load_prompt_cache, reusable_prefix,
    save_prompt_cache,
};

const D: usize = 64;

fn specs() -> Vec<StateSpec> {
    (0..2)
        .map(|layer| StateSpec {
            name: format!("blk.{layer}.kv"),
            kind: StateKind::Kv {
                layer,
                layout: KvLayout {
                    kv_heads: 2,
                    head_dim: D,
                    kind: KvKind::Growing {
                        growth: Growth::Doubling { initial: 16 },
                    },
                    max_rewind: 0,
                    rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                    rope_base: Default::default(),
                },
            },
        })
        .collect()
}

fn cache(preset: &str, tokens: usize) -> ModelCache {
    let mut cache =
        ModelCache::with_allocation(specs(), &Allocation::preset(preset).unwrap()).unwrap();
    cache_common::fill_layers(&mut cache, 2, D, tokens);
    cache
}

fn header(tokens: usize) -> PromptCacheHeader {
    PromptCacheHeader {
        model_sha256: "ab".repeat(32),
        allocation: "rec4.25".into(),
        tokens: (0..tokens as u32).map(|t| t * 3 + 1).collect(),
    }
}

#[test]
fn a_prompt_cache_reloads_bit_identical_and_refuses_what_it_is_not() {
    let dir = std::env::temp_dir().join(format!("tq-prompt-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("prompt.tqp");
    let saved = cache("rec4.25", 40);
    save_prompt_cache(&path, &header(40), &saved).unwrap();
    let fresh =
        ModelCache::with_allocation(specs(), &Allocation::preset("rec4.25").unwrap()).unwrap();
    let sha = "ab".repeat(32);
    let (h, loaded) = load_prompt_cache(&path, &sha, "rec4.25", &fresh).unwrap();
    assert_eq!(h, header(40));
    assert_eq!(to_bytes(&loaded).unwrap(), to_bytes(&saved).unwrap());

    // Another model, another allocation name.
    assert!(matches!(
        load_prompt_cache(&path, &"cd".repeat(32), "rec4.25", &fresh),
        Err(PromptCacheError::OtherModel { .. })
    ));
    assert!(matches!(
        load_prompt_cache(&path, &sha, "k5v4", &fresh),
        Err(PromptCacheError::OtherAllocation { .. })
    ));
    // The same name over other layouts (an edited allocation file): the layouts decide.
    let edited =
        ModelCache::with_allocation(specs(), &Allocation::preset("k5v4").unwrap()).unwrap();
    let err = load_prompt_cache(&path, &sha, "rec4.25", &edited).unwrap_err();
    assert!(
        matches!(err, PromptCacheError::Cache(PersistError::Mismatch(_))),
        "{err}"
    );

    // Damage: a flipped byte in the cache body, a truncated file, a bad magic, a new version.
    let bytes = std::fs::read(&path).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 0x40;
    std::fs::write(&path, &flipped).unwrap();
    assert!(matches!(
        load_prompt_cache(&path, &sha, "rec4.25", &fresh),
        Err(PromptCacheError::Cache(PersistError::Corrupted { .. }))
    ));
    for cut in [0, 7, 19, 30, bytes.len() / 2] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert!(
            load_prompt_cache(&path, &sha, "rec4.25", &fresh).is_err(),
            "cut at {cut}"
        );
    }
    let mut magic = bytes.clone();
    magic[0] = b'X';
    std::fs::write(&path, &magic).unwrap();
    assert!(matches!(
        load_prompt_cache(&path, &sha, "rec4.25", &fresh),
        Err(PromptCacheError::Format(_))
    ));
    let mut version = bytes.clone();
    version[8..12].copy_from_slice(&(PROMPT_CACHE_VERSION + 1).to_le_bytes());
    std::fs::write(&path, &version).unwrap();
    assert!(matches!(
        load_prompt_cache(&path, &sha, "rec4.25", &fresh),
        Err(PromptCacheError::Version { .. })
    ));
    // A header that does not describe the cache is refused when saving.
    assert!(matches!(
        save_prompt_cache(&path, &header(39), &saved),
        Err(PromptCacheError::Inconsistent { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_reusable_prefix_keeps_the_last_token_and_the_first_chunk() {
    let cached: Vec<u32> = (0..300).collect();
    let mut longer = cached.clone();
    longer.extend([7, 7, 7]);
    assert_eq!(reusable_prefix(&cached, &longer, 256), 300);
    // The very same prompt: its last token must run again.
    assert_eq!(reusable_prefix(&cached, &cached, 256), 299);
    // A prompt that departs inside the first chunk: the cache calibrated on tokens it lacks.
    let mut early = cached.clone();
    early[100] = 9999;
    assert_eq!(reusable_prefix(&cached, &early, 256), 0);
    let mut late = cached.clone();
    late[280] = 9999;
    assert_eq!(reusable_prefix(&cached, &late, 256), 280);
    // A cache shorter than the first chunk was all one first batch: usable only for the prompt
    // whose cold run batches exactly those tokens.
    assert_eq!(reusable_prefix(&cached[..50], &cached[..51], 256), 50);
    assert_eq!(reusable_prefix(&cached[..50], &longer, 256), 0);
    assert_eq!(reusable_prefix(&[], &longer, 256), 0);
    assert_eq!(reusable_prefix(&cached, &[], 256), 0);
}
