//! `TokenStore`: records read back as written, runs that never cross a page, pages in token
//! order, growth by policy, and a static store's pages laid out in one buffer.

use half::f16;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tq_cache::CacheError;
use tq_cache::record_order::{FAST_SCAN_BLOCK, RecordOrder};
use tq_cache::token_store::{Growth, MAX_PAGE_TOKENS, RunRecords, STATIC_PAGE_TOKENS, TokenStore};

/// The words of a rows-order run or page.
fn rows(records: RunRecords<'_>) -> &[u32] {
    match records {
        RunRecords::Rows(words) => words,
        RunRecords::FastScan { .. } => panic!("a rows store"),
    }
}

/// The words and scales token `t` is written with: distinct per token and position.
fn record_of(t: usize, words: usize, scales: usize) -> (Vec<u32>, Vec<f16>) {
    (
        (0..words).map(|i| (t * 1000 + i) as u32).collect(),
        (0..scales)
            .map(|i| f16::from_f32(((t * 7 + i) % 2048) as f32))
            .collect(),
    )
}

fn filled(words: usize, scales: usize, growth: Growth, n: usize) -> TokenStore {
    let mut store = TokenStore::new(words, scales, growth).unwrap();
    for t in 0..n {
        let (w, s) = store.push().expect("within capacity");
        let (want_w, want_s) = record_of(t, words, scales);
        w.copy_from_slice(&want_w);
        s.copy_from_slice(&want_s);
    }
    store
}

/// Where pages start under `growth`, up to `n` tokens.
fn page_starts(growth: Growth, n: usize) -> Vec<usize> {
    let mut starts = vec![0];
    let mut size = match growth {
        Growth::Static { .. } => STATIC_PAGE_TOKENS,
        Growth::Doubling { initial } => initial.max(1),
    };
    while *starts.last().unwrap() + size < n {
        starts.push(starts.last().unwrap() + size);
        if let Growth::Doubling { .. } = growth {
            size = (2 * size).min(MAX_PAGE_TOKENS);
        }
    }
    starts
}

fn growth_strategy() -> impl Strategy<Value = (Growth, usize)> {
    prop_oneof![
        (1usize..3000, 0.0f64..=1.0).prop_map(|(capacity, fill)| (
            Growth::Static { capacity },
            (capacity as f64 * fill) as usize
        )),
        (1usize..600, 0usize..3000).prop_map(|(initial, n)| (Growth::Doubling { initial }, n)),
    ]
}

/// Every record reads back as written, through `record`, `run` and `pages`; runs stop at
/// page boundaries; pages come in token order and cover exactly the stored tokens.
#[test]
fn records_runs_and_pages_read_back_what_was_written() {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 64,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x70; 32]),
    );
    runner
        .run(
            &(1usize..40, 0usize..4, growth_strategy()),
            |(words, scales, (growth, n))| {
                let store = filled(words, scales, growth, n);
                prop_assert_eq!(store.len(), n);
                for t in 0..n {
                    let (w, s) = store.record(t).unwrap();
                    let (want_w, want_s) = record_of(t, words, scales);
                    prop_assert_eq!(w, &want_w[..]);
                    prop_assert_eq!(s, &want_s[..]);
                }
                prop_assert!(store.record(n).is_none());

                let starts = page_starts(growth, n);
                let mut t = 0;
                while let Some((w, s, len)) = store.run(t, usize::MAX) {
                    prop_assert!(starts.contains(&t), "run starts at {t}, not a page start");
                    prop_assert_eq!(w.len(), len * words);
                    prop_assert_eq!(s.len(), len * scales);
                    prop_assert_eq!(&w[..words], &record_of(t, words, scales).0[..]);
                    t += len;
                }
                prop_assert_eq!(t, n);

                let views: Vec<_> = store.pages().collect();
                prop_assert_eq!(
                    views.iter().map(|v| v.first_token).collect::<Vec<_>>(),
                    if n == 0 { vec![] } else { starts.clone() }
                );
                let all: Vec<u32> = views
                    .iter()
                    .flat_map(|v| rows(v.records).to_vec())
                    .collect();
                let want: Vec<u32> = (0..n).flat_map(|t| record_of(t, words, scales).0).collect();
                prop_assert_eq!(all, want);
                Ok(())
            },
        )
        .unwrap();
}

/// A static store's pages are consecutive views of one buffer (one allocation per store, not
/// per page: see the module docs), it holds exactly `capacity` records, and one more is an
/// overflow.
#[test]
fn a_static_store_is_one_buffer_of_its_capacity() {
    let (words, scales) = (128, 2);
    let capacity = 3 * STATIC_PAGE_TOKENS + 17;
    let mut store = filled(words, scales, Growth::Static { capacity }, capacity);
    assert_eq!(store.allocated_bytes(), capacity * (4 * words + 2 * scales));
    let views: Vec<_> = store.pages().collect();
    assert_eq!(views.len(), 4);
    for pair in views.windows(2) {
        let (a, b) = (rows(pair[0].records), rows(pair[1].records));
        assert_eq!(a.as_ptr_range().end, b.as_ptr());
        assert_eq!(pair[0].scales.as_ptr_range().end, pair[1].scales.as_ptr());
    }
    assert!(matches!(
        store.push(),
        Err(CacheError::ContextOverflow { capacity: c }) if c == capacity
    ));
}

/// A doubling store allocates page by page and never moves what it stored.
#[test]
fn a_doubling_store_grows_without_moving_records() {
    let mut store = filled(4, 1, Growth::Doubling { initial: 3 }, 3);
    let first = store.record(0).unwrap().0.as_ptr();
    for t in 3..100 {
        let (w, _) = store.push().unwrap();
        w.fill(t as u32);
    }
    assert_eq!(store.record(0).unwrap().0.as_ptr(), first);
    assert_eq!(store.capacity(), 3 + 6 + 12 + 24 + 48 + 96);
    assert_eq!(store.allocated_bytes(), store.capacity() * (4 * 4 + 2));
}

/// An empty static store allocates nothing and overflows at once.
#[test]
fn a_zero_capacity_static_store_holds_nothing() {
    let mut store = TokenStore::new(8, 1, Growth::Static { capacity: 0 }).unwrap();
    assert_eq!(store.allocated_bytes(), 0);
    assert_eq!(store.pages().count(), 0);
    assert!(matches!(
        store.push(),
        Err(CacheError::ContextOverflow { capacity: 0 })
    ));
}

/// Found by the GGUF fuzz target (a model file whose sliding window was 2.4 billion tokens):
/// a static store too large for memory is a typed error, whether its byte count overflows or
/// the allocator refuses it, never an aborted process or a wrapped size.
#[test]
fn a_store_larger_than_memory_is_a_typed_error() {
    for (words, capacity) in [(usize::MAX / 2, 3), (64, 1 << 50), (1, usize::MAX)] {
        let err = TokenStore::new(words, 1, Growth::Static { capacity }).unwrap_err();
        assert!(
            matches!(err, CacheError::StorageTooLarge { tokens, .. } if tokens == capacity),
            "{err}"
        );
        assert!(err.to_string().contains(&capacity.to_string()), "{err}");
    }
    // Large but possible: granted, and mapped lazily (nothing to check here but success).
    TokenStore::new(16, 1, Growth::Static { capacity: 1 << 20 }).unwrap();
}

/// A fast-scan store (records of 4-bit codes, 32 tokens per block, coordinate-major) holds
/// what a rows store holds: after any sequence of appends, overwrites and truncations every
/// record reads back (`record_copy`) as last written, runs stop where the rows store's runs
/// stop and start at the token's slot in its block, and the borrowing reads (`record`,
/// `run`, `push`, `record_mut`) refuse it rather than hand out permuted words.
#[test]
fn a_fast_scan_store_reads_back_what_a_rows_store_holds() {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 64,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x71; 32]),
    );
    // (op, argument): 0 push a new record, 1 overwrite token `arg % len`, 2 truncate to
    // `arg % (len + 1)`.
    let ops = proptest::collection::vec((0u8..3, any::<u32>()), 0..400);
    runner
        .run(
            &(1usize..10, 0usize..3, growth_strategy(), ops),
            |(words, scales, (growth, _), ops)| {
                let mut fast =
                    TokenStore::with_order(words, scales, growth, RecordOrder::FastScan).unwrap();
                let mut model: Vec<(Vec<u32>, Vec<f16>)> = Vec::new();
                for (i, &(op, arg)) in ops.iter().enumerate() {
                    let (w, s) = record_of(i, words, scales);
                    // Any 32-bit word is eight 4-bit codes.
                    let w: Vec<u32> = w.iter().map(|x| x.wrapping_mul(0x9E37_79B9) ^ arg).collect();
                    match op {
                        0 => match fast.push_record(&w, &s) {
                            Ok(()) => model.push((w, s)),
                            Err(CacheError::ContextOverflow { .. }) => {
                                let full = matches!(growth, Growth::Static { capacity } if capacity == model.len());
                                prop_assert!(full, "overflow below capacity");
                            }
                            Err(e) => return Err(TestCaseError::fail(e.to_string())),
                        },
                        1 if !model.is_empty() => {
                            let t = arg as usize % model.len();
                            fast.write_record(t, &w, &s).unwrap();
                            model[t] = (w, s);
                        }
                        _ => {
                            let len = arg as usize % (model.len() + 1);
                            fast.truncate(len);
                            model.truncate(len);
                        }
                    }
                }
                prop_assert_eq!(fast.len(), model.len());
                for (t, (w, s)) in model.iter().enumerate() {
                    let (got_w, got_s) = fast.record_copy(t).unwrap();
                    prop_assert_eq!(&*got_w, &w[..], "token {}", t);
                    prop_assert_eq!(got_s, &s[..]);
                    prop_assert!(fast.record(t).is_none());
                }
                let mut t = 0;
                while let Some((records, s, len)) = fast.records(t, usize::MAX) {
                    let RunRecords::FastScan { codes, lead } = records else {
                        return Err(TestCaseError::fail("a rows run from a fast-scan store"));
                    };
                    let (page, slot) = page_of(growth, t);
                    prop_assert_eq!(lead, slot % FAST_SCAN_BLOCK, "token {} of page {}", t, page);
                    let blocks = (lead + len).div_ceil(FAST_SCAN_BLOCK);
                    prop_assert_eq!(codes.len(), blocks * words * 8 * 16);
                    prop_assert_eq!(s.len(), len * scales);
                    prop_assert!(fast.run(t, usize::MAX).is_none());
                    t += len;
                }
                prop_assert_eq!(t, model.len());
                prop_assert!(fast.push().is_err());
                if !model.is_empty() {
                    prop_assert!(fast.record_mut(0).is_err());
                }
                Ok(())
            },
        )
        .unwrap();
}

/// The page holding token `t` in a fast-scan store under `growth` (whose doubling pages start
/// at a multiple of 32 tokens) and `t`'s index in it.
fn page_of(growth: Growth, t: usize) -> (usize, usize) {
    let growth = match growth {
        Growth::Doubling { initial } => Growth::Doubling {
            initial: initial.next_multiple_of(FAST_SCAN_BLOCK),
        },
        g => g,
    };
    let starts = page_starts(growth, t + 1);
    let page = starts.len() - 1;
    (page, t - starts[page])
}

/// The bytes a store's buffers hold by the formula: rows hold `capacity` records, a fast-scan
/// store `record_slots` (each buffer rounded up to whole blocks), beside `capacity` scales.
fn formula_bytes(store: &TokenStore) -> usize {
    4 * store.record_words() * store.record_slots()
        + 2 * store.scales_per_token() * store.capacity()
}

/// An emptied store changes order keeping its pages: the same capacity, the memory of those
/// pages in the new order, no page added when it fills to that capacity again, and every
/// record reads back as written; a store holding tokens refuses and stays as it was, and the
/// same order changes nothing.
#[test]
fn an_empty_store_changes_order_keeping_its_pages() {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 64,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[0x72; 32]),
    );
    let order = prop_oneof![Just(RecordOrder::Rows), Just(RecordOrder::FastScan)];
    runner
        .run(
            &(
                1usize..6,
                0usize..3,
                growth_strategy(),
                order.clone(),
                order,
            ),
            |(words, scales, (growth, n), from, to)| {
                let mut store = TokenStore::with_order(words, scales, growth, from).unwrap();
                for t in 0..n {
                    let (w, s) = record_of(t, words, scales);
                    store.push_record(&w, &s).unwrap();
                }
                if n > 0 {
                    let before = store.clone();
                    let refused = store.reorder(to);
                    prop_assert!(
                        matches!(refused, Err(CacheError::InvalidConfig(_))),
                        "{:?}",
                        refused
                    );
                    prop_assert_eq!(&store, &before);
                }
                store.truncate(0);
                let capacity = store.capacity();
                let bytes = store.allocated_bytes();
                let same = store.clone();
                store.reorder(to).unwrap();
                prop_assert_eq!(store.order(), to);
                prop_assert_eq!(store.capacity(), capacity);
                prop_assert_eq!(store.allocated_bytes(), formula_bytes(&store));
                if from == to {
                    prop_assert_eq!(&store, &same);
                    prop_assert_eq!(store.allocated_bytes(), bytes);
                }
                for t in 0..capacity {
                    let (w, s) = record_of(t + 1, words, scales);
                    store.push_record(&w, &s).unwrap();
                }
                prop_assert_eq!(store.capacity(), capacity, "no page added");
                for t in 0..capacity {
                    let (w, s) = record_of(t + 1, words, scales);
                    let (got_w, got_s) = store.record_copy(t).unwrap();
                    prop_assert_eq!(&*got_w, &w[..], "token {}", t);
                    prop_assert_eq!(got_s, &s[..]);
                }
                Ok(())
            },
        )
        .unwrap();
}
