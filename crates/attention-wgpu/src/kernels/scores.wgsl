// scores.wgsl — raw attention scores `scale·⟨q, k̃⟩` of every slot of one page (for tests and
// inspection; attention itself never materializes them).
//
// Workgroup: WG = 64 threads, one workgroup per (row, tile of 64 slots of the page), flattened
// as id = tile + tiles·row; one thread per slot. Compiled with CHUNK = 1.
//
// Bindings (group 0), after attn_params.wgsl (0, 1) and score.wgsl (2 prepared, 3 tables,
// 4 kpage, 7 fp, 8 kept):
//   5 out  storage rw  f32 [rows, score_stride]   score per slot, −∞ where masked

@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let id = flat_workgroup(wid, launch.grid_x, launch.grid_y);
    if (id >= launch.total) {
        return;
    }
    load_key_centroids(lid);
    workgroupBarrier();
    let tile = id % launch.blocks;
    let row = id / launch.blocks;
    let local = tile * WG + lid;
    if (local >= launch.page_tokens) {
        return;
    }
    let slot = launch.first_slot + local;
    if (slot >= params.score_stride) {
        return;
    }
    let qi = row / params.q_heads;
    let kvh = (row % params.q_heads) / params.group;
    let qpos = bitcast<u32>(prepared[params.positions_offset + qi]);
    var s = bitcast<f32>(0xff800000u);
    if (slot_visible(slot, local, qpos)) {
        var scored: array<f32, MAX_GROUP>;
        var kept_key = NO_COPY;
        if (params.kept_capacity != 0u && !reads_copy(slot, qi, 0u, kvh)) {
            kept_key = kept_entry(kvh, kept_lower_bound(kvh, slot), kept_lower_bound(kvh, slot + 1u), slot);
        }
        if (reads_copy(slot, qi, 0u, kvh)) {
            scored = copy_key_scores(row, slot_copy(0u, kvh, slot));
        } else if (kept_key != NO_COPY) {
            scored = copy_key_scores(row, kept_copy(kvh, kept_key));
        } else {
            scored = key_scores(row, kvh, local);
        }
        add_center_corrections(&scored, row, slot);
        s = scored[0];
    }
    out[row * params.score_stride + slot] = s;
}
