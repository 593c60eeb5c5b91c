//! The split paths, forced on any adapter by artificially small limits: pages of a few tokens
//! (bindings capped at a few KiB), attention partials merged window by window, and grids
//! folded into y and z (at most five workgroups per dimension).
//!
//! Splitting changes where work runs, never what it computes: outputs match the CPU reference
//! within the tolerance of `attention.rs`, records match the CPU's bit for bit, and folding
//! the grid alone (same pages, same blocks) changes no bit of the output.

mod common;

use common::{context, fill, growing, sliding, tiny_context, vectors};
use tq_attention_wgpu::{GpuError, GpuKvCache};
use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionShape, reference_attention};
use tq_cache::kv_cache::KvCache;

const TINY_BINDING: u64 = 4096;
const TINY_GRID: u32 = 5;

fn attend(gpu: &mut GpuKvCache, queries: &[f32], positions: &[u32], q_heads: usize) -> Vec<f32> {
    let shape = AttentionShape {
        q_heads,
        scale: 0.125,
    };
    let mut out = vec![0.0f32; queries.len()];
    gpu.attend(queries, positions, shape, &mut out).unwrap();
    out
}

fn reference(cpu: &KvCache, queries: &[f32], positions: &[u32], q_heads: usize) -> Vec<f32> {
    let shape = AttentionShape {
        q_heads,
        scale: 0.125,
    };
    let mut out = vec![0.0f32; queries.len()];
    reference_attention(cpu, queries, positions, shape, &mut out).unwrap();
    out
}

fn assert_close(got: &[f32], expected: &[f32]) {
    let scale = expected.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(expected).enumerate() {
        assert!((a - b).abs() <= 1e-4 * scale, "output {i}: {a} vs {b}");
    }
}

#[test]
fn tiny_bindings_and_grids_match_reference() {
    let Some(ctx) = tiny_context(TINY_BINDING, TINY_GRID) else {
        return;
    };
    // The fast-scan order: pages of 32 slots hold one block each (a batch spanning pages
    // writes two pages' blocks).
    let fast = Allocation::from_toml_str(
        "name = \"mse-k4v4-fast-scan\"\n\
         key = { codec = \"mse\", bits = 4, record_order = \"fast-scan\" }\n\
         value = { codec = \"mse\", bits = 4, record_order = \"fast-scan\" }",
    )
    .unwrap();
    for allocation in [
        Allocation::preset("mse-k4v4").unwrap(),
        Allocation::preset("k5v4").unwrap(),
        fast,
    ] {
        let name = &allocation.name;
        let layout = growing(2, 64);
        let mut cpu = KvCache::with_allocation(layout, &allocation, 0, 4).unwrap();
        fill(&mut cpu, 0, 300, 3);
        let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        assert!(
            gpu.max_page_tokens() <= 32,
            "{name}: pages of {}",
            gpu.max_page_tokens()
        );
        assert!(gpu.pages() >= 9, "{name}: {} pages", gpu.pages());
        // A prefill-style chunk too: 4 queries × 8 heads = 32 rows fold into a 5×5×2 grid.
        let positions = [296u32, 297, 298, 299];
        let queries = vectors(positions.len() * 8, 64, 9);
        assert_close(
            &attend(&mut gpu, &queries, &positions, 8),
            &reference(&cpu, &queries, &positions, 8),
        );
        // GPU encode of a 40-token batch: 80 vectors fold into 5×5×4 workgroups, and the
        // batch spans two pages.
        let width = 2 * 64;
        let (k, v) = (vectors(40, width, 1), vectors(40, width, 2));
        let new: Vec<u32> = (300..340).collect();
        cpu.append(&k, &v, &new).unwrap();
        gpu.encode_and_append(&k, &v, &new).unwrap();
        let down = gpu.download().unwrap();
        for t in 0..cpu.len() {
            for h in 0..2 {
                let (_, record, _) = cpu.keys(h).token(t).unwrap();
                let rw = record.len();
                assert_eq!(
                    &down.key_records[(t * 2 + h) * rw..][..rw],
                    &*record,
                    "{name} token {t}"
                );
            }
        }
        let queries = vectors(8, 64, 10);
        assert_close(
            &attend(&mut gpu, &queries, &[339], 8),
            &reference(&cpu, &queries, &[339], 8),
        );
    }
}

/// Pages of fewer than 32 slots cannot hold a fast-scan block: such a cache keeps its records
/// in rows on the GPU (uploaded record by record) and reads and appends the same tokens.
#[test]
fn pages_below_a_block_keep_fast_scan_streams_in_rows() {
    // 2048 bytes: pages of 16 slots of 4-bit records at d = 64 and two heads.
    let Some(ctx) = tiny_context(2048, TINY_GRID) else {
        return;
    };
    let fast = Allocation::from_toml_str(
        "name = \"mse-k3v6-fast-scan\"\n\
         key = { codec = \"mse\", bits = 3, record_order = \"fast-scan\" }\n\
         value = { codec = \"mse\", bits = 6, record_order = \"fast-scan\" }",
    )
    .unwrap();
    let mut cpu = KvCache::with_allocation(growing(2, 64), &fast, 0, 4).unwrap();
    fill(&mut cpu, 0, 70, 5);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    assert!(
        gpu.max_page_tokens() < 32,
        "pages of {}",
        gpu.max_page_tokens()
    );
    let width = 2 * 64;
    let (k, v) = (vectors(5, width, 6), vectors(5, width, 7));
    let new: Vec<u32> = (70..75).collect();
    cpu.append(&k, &v, &new).unwrap();
    gpu.encode_and_append(&k, &v, &new).unwrap();
    let down = gpu.download().unwrap();
    let mut expected = Vec::new();
    for t in 0..cpu.len() {
        for h in 0..2 {
            expected.extend_from_slice(&cpu.values(h).token(t).unwrap().1);
        }
    }
    assert_eq!(down.value_records, expected);
    // Two query heads: the partials of more do not fit this binding.
    let queries = vectors(2, 64, 12);
    assert_close(
        &attend(&mut gpu, &queries, &[74], 2),
        &reference(&cpu, &queries, &[74], 2),
    );
}

#[test]
fn tiny_bindings_on_a_sliding_ring_match_reference() {
    let Some(ctx) = tiny_context(TINY_BINDING, TINY_GRID) else {
        return;
    };
    let mut cpu = KvCache::with_allocation(
        sliding(1, 64, 70, 2),
        &Allocation::preset("k5v4").unwrap(),
        0,
        4,
    )
    .unwrap();
    fill(&mut cpu, 0, 200, 4);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    assert!(gpu.pages() >= 2);
    let queries = vectors(4, 64, 11);
    assert_close(
        &attend(&mut gpu, &queries, &[199], 4),
        &reference(&cpu, &queries, &[199], 4),
    );
}

/// Folding the grid into y and z only renames workgroups: bit-identical outputs.
#[test]
fn folded_grids_change_no_bit() {
    let (Some(plain), Some(folded)) = (context(), tiny_context(u64::MAX, 2)) else {
        return;
    };
    let mut cpu =
        KvCache::with_allocation(growing(2, 128), &Allocation::preset("k5v4").unwrap(), 0, 4)
            .unwrap();
    fill(&mut cpu, 0, 700, 5);
    let queries = vectors(8, 128, 12);
    let mut a = GpuKvCache::from_cache(&plain, &cpu).unwrap();
    let mut b = GpuKvCache::from_cache(&folded, &cpu).unwrap();
    let x = attend(&mut a, &queries, &[699], 8);
    let y = attend(&mut b, &queries, &[699], 8);
    assert_eq!(
        x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // And the same call twice gives the same bits (no atomics, fixed orders).
    let z = attend(&mut a, &queries, &[699], 8);
    assert_eq!(x, z);
}

/// A binding too small for one token's page is a typed error, not a panic.
#[test]
fn impossible_limits_are_typed_errors() {
    let Some(ctx) = tiny_context(64, 4) else {
        return;
    };
    let cpu = KvCache::with_allocation(growing(4, 128), &Allocation::preset("k5v4").unwrap(), 0, 4)
        .unwrap();
    assert!(matches!(
        GpuKvCache::new(&ctx, &cpu),
        Err(GpuError::TooLarge { .. })
    ));
}
