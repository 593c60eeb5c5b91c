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
//   5 tables    storage r   f32, the layer's tables (the bit planes' permutation)
//
// A stream in the fast-scan order (ScatterParams.order) keeps its words in blocks of 32 slots
// (`common.wgsl`, StreamDesc.order): each record's nibbles go to their lanes, through its bit
// planes where it has them.
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
    /// `StreamDesc.order` of the stream: rows, or the fast-scan order (with bit planes: the
    /// permutation table of KV head h at `planes_offset + h·32·record_words` of `tables`).
    order: u32,
    planes_offset: u32,
}

@group(0) @binding(0) var<uniform> params: ScatterParams;
@group(0) @binding(1) var<storage, read> records: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read_write> page: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read> tables: array<f32>;

/// Word `w` of new record `v` (of KV head `head`) as the page stores it: through the head's bit
/// planes (`BitPlanes::permute`: each bit from the plain record bit its table names).
fn stored_word(v: u32, head: u32, w: u32) -> u32 {
    let rw = params.record_words;
    if (params.order != ORDER_PLANES) {
        return records[v * rw + w];
    }
    let table = params.planes_offset + head * 32u * rw + 32u * w;
    var out = 0u;
    for (var k = 0u; k < 32u; k += 1u) {
        let source = u32(tables[table + k]);
        if (source != 65535u) {
            out = out | (((records[v * rw + source / 32u] >> (source % 32u)) & 1u) << k);
        }
    }
    return out;
}

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
    if (params.order == ORDER_ROWS) {
        for (var w = lid; w < rw; w += WG) {
            atomicStore(&page[row * rw + w], records[v * rw + w]);
        }
    } else {
        // Each nibble into its lane of the slot's block; the slots sharing a word are written
        // by other workgroups, so a nibble is cleared and set with atomics.
        let block = block_word(head, local, params.page_tokens, rw);
        for (var w = lid; w < rw; w += WG) {
            let word = stored_word(v, head, w);
            for (var k = 0u; k < 8u; k += 1u) {
                let at = lane_at(block, local, 8u * w + k);
                atomicAnd(&page[at.x], ~(15u << at.y));
                atomicOr(&page[at.x], ((word >> (4u * k)) & 15u) << at.y);
            }
        }
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
