// scatter.wgsl — appends new token records of one stream into one GPU page.
//
// Workgroup: WG = 64 threads, one workgroup per new vector (v = token·kv_heads + head), over a
// flattened 2-D/3-D grid. Tokens whose slot falls outside this page return at once, so one
// dispatch per touched page appends a batch that spans pages (or wraps a ring).
//
// Bindings (group 0):
//   0 params   uniform      ScatterParams
//   1 records  storage r    u32 [vectors, record_words]   new records (CPU- or GPU-encoded)
//   2 scales   storage r    u32 [vectors, scales]         one binary16 per word (low half)
//   3 page     storage rw   atomic<u32>, the page layout:
//                words     [kv_heads, page_tokens, record_words]         at 0
//                scales    [kv_heads, page_tokens, scales] binary16,     at scales_offset words
//                          two per word, even index in the low half (the f16 layout of tq-cache)
//                positions [page_tokens] u32 (key pages only)            at positions_offset
//   4 positions storage r   u32 [tokens]                  positions of the new tokens
//
// Two tokens share a scales word, so halves are written with atomicAnd/atomicOr.

struct ScatterParams {
    vectors: u32,
    kv_heads: u32,
    record_words: u32,
    scales: u32,
    /// Slot of new token 0 (token index, or token index mod ring size).
    first_slot: u32,
    /// Ring size in slots; 0 for a growing cache.
    ring_slots: u32,
    /// First slot of this page and its capacity.
    page_first_slot: u32,
    page_tokens: u32,
    scales_offset: u32,
    /// 0 for value pages (no position table).
    write_positions: u32,
    positions_offset: u32,
    grid_x: u32,
    grid_y: u32,
    /// New tokens before this one are skipped: a batch longer than a ring keeps only its
    /// last ring-size tokens (as appending them one by one would).
    skip_tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: ScatterParams;
@group(0) @binding(1) var<storage, read> records: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read_write> page: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let v = flat_workgroup(wid, params.grid_x, params.grid_y);
    if (v >= params.vectors) {
        return;
    }
    let token = v / params.kv_heads;
    let head = v % params.kv_heads;
    if (token < params.skip_tokens) {
        return;
    }
    var slot = params.first_slot + token;
    if (params.ring_slots != 0u) {
        slot = slot % params.ring_slots;
    }
    if (slot < params.page_first_slot || slot >= params.page_first_slot + params.page_tokens) {
        return;
    }
    let local = slot - params.page_first_slot;
    let row = head * params.page_tokens + local;
    let rw = params.record_words;
    for (var w = lid; w < rw; w += WG) {
        atomicStore(&page[row * rw + w], records[v * rw + w]);
    }
    if (lid < params.scales) {
        let half_index = row * params.scales + lid;
        let word = params.scales_offset + half_index / 2u;
        let shift = 16u * (half_index % 2u);
        atomicAnd(&page[word], ~(0xffffu << shift));
        atomicOr(&page[word], (scales[v * params.scales + lid] & 0xffffu) << shift);
    }
    if (params.write_positions != 0u && head == 0u && lid == 0u) {
        atomicStore(&page[params.positions_offset + local], positions[token]);
    }
}
