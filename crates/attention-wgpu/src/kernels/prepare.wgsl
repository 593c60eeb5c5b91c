// prepare.wgsl — prepares every query row once per call: rotate (and project) it for coded keys.
//
// Workgroup: WG = 64 threads, one workgroup per row (row = query·q_heads + head), flattened grid.
//
// Bindings (group 0), after attn_params.wgsl's 0 params and 1 launch:
//   2 queries   storage r   f32 [rows, key dim]     raw queries
//   3 tables    storage r   f32                     key tables (Π_K, S_K column-major, gains)
//   4 prepared  storage rw  f32 [rows, qstride]     output (positions after it are the host's),
//                                                   then the RoPE centers' score corrections
//   5 angles    storage r   f32 [blocks, key dim]   RoPE-centered keys: each center block's
//                                                   (cos, sin) per plane, from block 0
//                                                   (`tq_cache::rope_center::CenterAngles`; a
//                                                   placeholder otherwise)
//
// Coded keys: q̃ = correction·Π_K·(scale·q) and s̃ = α·s·S_K·(Π_K·(scale·q)), the CPU fused
// kernel's order. f32 / f16 keys: scale·q. Then scale·q for sink copies beside coded keys, and
// Π₈·(scale·q) for an 8-bit window's copies. RoPE-centered keys: per center block b, the score
// correction q·R(φ_b)·m (`AttnParams.center_bias`), summed as the CPU's `score_bias`.

@group(0) @binding(2) var<storage, read> queries: array<f32>;
@group(0) @binding(3) var<storage, read> tables: array<f32>;
@group(0) @binding(4) var<storage, read_write> prepared: array<f32>;
@group(0) @binding(5) var<storage, read> angles: array<f32>;

var<workgroup> q_sh: array<f32, MAX_DIM>;
var<workgroup> r_sh: array<f32, MAX_DIM>;

/// The score corrections of RoPE-centered keys for this row (`AttnParams.center_bias`): the
/// coefficients of `q·R(φ)·m` per plane (`rope_center::bias_coefficients`, in `r_sh`), then per
/// center block their sum against the block's angles in eight running sums (entry i into sum
/// i mod 8, in index order) added pairwise — `rope_center::score_bias`'s order. All threads
/// call it (it holds a barrier).
fn center_corrections(row: u32, kvh: u32, lid: u32) {
    let d = params.key.dim;
    let m = params.key.mean_offset + kvh * d;
    for (var p = lid; p < d / 2u; p += WG) {
        var i = 2u * p;
        var j = 2u * p + 1u;
        if (params.rope_halves != 0u) {
            i = p;
            j = p + d / 2u;
        }
        let mi = tables[m + i];
        let mj = tables[m + j];
        r_sh[2u * p] = q_sh[i] * mi + q_sh[j] * mj;
        r_sh[2u * p + 1u] = q_sh[j] * mi - q_sh[i] * mj;
    }
    workgroupBarrier();
    for (var k = lid; k < params.center_blocks; k += WG) {
        let a = (params.center_first_block + k) * d;
        var sums: array<f32, 8>;
        for (var i = 0u; i < 8u; i += 1u) {
            sums[i] = 0.0;
        }
        for (var i = 0u; i < d; i += 1u) {
            sums[i % 8u] += r_sh[i] * angles[a + i];
        }
        prepared[params.center_bias + row * params.center_blocks + k] =
            ((sums[0] + sums[4]) + (sums[2] + sums[6])) + ((sums[1] + sums[5]) + (sums[3] + sums[7]));
    }
    // r_sh is reused by the rotation below.
    workgroupBarrier();
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = flat_workgroup(wid, launch.grid_x, launch.grid_y);
    if (row >= launch.total) {
        return;
    }
    let key = params.key;
    let d = key.dim;
    let kvh = (row % params.q_heads) / params.group;
    let out = row * params.qstride;
    for (var j = lid; j < d; j += WG) {
        q_sh[j] = queries[row * d + j] * params.scale;
    }
    workgroupBarrier();
    if (params.center_blocks != 0u) {
        center_corrections(row, kvh, lid);
    }
    // Coded keys with attention sinks also score the sinks' full-precision copies: scale·q.
    if (params.fp_coords != 0u && params.fp_query != 0u) {
        for (var j = lid; j < d; j += WG) {
            prepared[out + params.fp_query + j] = q_sh[j];
        }
    }
    // An 8-bit window scores its copies in the window rotation's coordinates: Π₈·(scale·q),
    // Π₈ column-major (entry (j, i) at i·d + j).
    if (params.q8_coords != 0u) {
        for (var j = lid; j < d; j += WG) {
            var acc = 0.0;
            for (var i = 0u; i < d; i += 1u) {
                acc += tables[params.q8_rotation + i * d + j] * q_sh[i];
            }
            prepared[out + params.q8_query + j] = acc;
        }
    }
    if (key.kind == KIND_F32 || key.kind == KIND_F16) {
        for (var j = lid; j < d; j += WG) {
            prepared[out + j] = q_sh[j];
        }
        return;
    }
    let pi = key.pi_offset + kvh * d * d;
    for (var j = lid; j < d; j += WG) {
        var acc = 0.0;
        for (var i = 0u; i < d; i += 1u) {
            acc += tables[pi + i * d + j] * q_sh[i];
        }
        r_sh[j] = acc;
    }
    workgroupBarrier();
    let correction = tables[key.correction_offset + kvh];
    for (var j = lid; j < d; j += WG) {
        prepared[out + j] = r_sh[j] * correction;
    }
    if (key.kind == KIND_PROD) {
        let s = key.s_offset + kvh * d * d;
        let gain = tables[key.gain_offset + kvh];
        for (var j = lid; j < d; j += WG) {
            var acc = 0.0;
            for (var i = 0u; i < d; i += 1u) {
                acc += tables[s + i * d + j] * r_sh[i];
            }
            prepared[out + d + j] = gain * acc;
        }
    }
}
