// finish.wgsl — decode attention, pass 2b: divides each row's accumulators by its softmax sum
// and maps them back once: out = Π_Vᵀ·(acc + α·s·S_Vᵀ·sketch_acc) / sum for coded values,
// acc / sum for f32 / f16 values, plus the attention sinks' original-domain sums / sum, plus
// an 8-bit window's sums turned back (Π₈ᵀ·w / sum), plus μ_V for a mean-centered stream. A row that saw no token outputs zeros.
//
// Workgroup: WG = 64 threads, one workgroup per row (row = query·q_heads + head).
//
// Bindings (group 0), after attn_params.wgsl (0 params, 1 launch):
//   2 state   storage r   f32 [rows, rec] (merge output)
//   3 tables  storage r   f32 value tables (Π_V, S_V column-major, gains)
//   4 out     storage rw  f32 [rows, value dim]
//   5 gather  storage rw  f32 [rows, gather_stride] (heavy hitters; a placeholder otherwise):
//                         the scores attend.wgsl gathered, turned into softmax weights
//                         exp(score − max) / sum with the row's final max and sum

@group(0) @binding(2) var<storage, read> state: array<f32>;
@group(0) @binding(3) var<storage, read> tables: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> gather: array<f32>;

var<workgroup> a_sh: array<f32, MAX_DIM>;
var<workgroup> t_sh: array<f32, MAX_DIM>;
/// An 8-bit window's weighted sum, normalized, in Π₈'s coordinates.
var<workgroup> w_sh: array<f32, MAX_DIM>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = flat_workgroup(wid, launch.grid_x, launch.grid_y);
    if (row >= launch.total) {
        return;
    }
    let value = params.value;
    let d = value.dim;
    let own = row * params.rec;
    let sum = state[own + 1u];
    var inv = 0.0;
    if (sum > 0.0) {
        inv = 1.0 / sum;
    }
    let kvh = (row % params.q_heads) / params.group;
    if (params.gather_stride != 0u && sum > 0.0) {
        // Entries a row did not gather hold stale values the host never reads.
        let m = state[own];
        for (var j = lid; j < params.gather_stride; j += WG) {
            let at = row * params.gather_stride + j;
            gather[at] = exp(min(gather[at] - m, 0.0)) * inv;
        }
    }
    if (params.q8_coords != 0u) {
        for (var j = lid; j < d; j += WG) {
            w_sh[j] = state[own + params.rec - params.q8_coords + j] * inv;
        }
        workgroupBarrier();
    }
    if (value.kind == KIND_F32 || value.kind == KIND_F16) {
        for (var j = lid; j < d; j += WG) {
            out[row * d + j] = with_mean(state[own + 2u + j] * inv + sinks(own, j, inv) + window8(j), kvh, j, sum);
        }
        return;
    }
    for (var j = lid; j < d; j += WG) {
        a_sh[j] = state[own + 2u + j] * inv;
        if (value.kind == KIND_PROD) {
            t_sh[j] = state[own + 2u + d + j] * inv;
        }
    }
    workgroupBarrier();
    if (value.kind == KIND_PROD) {
        // a += α·s·Sᵀ·t, with S column-major: column j of S is contiguous.
        let s = value.s_offset + kvh * d * d;
        let gain = tables[value.gain_offset + kvh];
        var sums: array<f32, 8>;
        var n = 0u;
        for (var j = lid; j < d; j += WG) {
            var acc = 0.0;
            for (var i = 0u; i < d; i += 1u) {
                acc += tables[s + j * d + i] * t_sh[i];
            }
            sums[n] = acc;
            n += 1u;
        }
        workgroupBarrier();
        n = 0u;
        for (var j = lid; j < d; j += WG) {
            a_sh[j] += gain * sums[n];
            n += 1u;
        }
        workgroupBarrier();
    }
    // out = Πᵀ·a: entry (j, k) of Π is at k·d + j, so thread k reads a contiguous column.
    let pi = value.pi_offset + kvh * d * d;
    for (var k = lid; k < d; k += WG) {
        var acc = 0.0;
        for (var j = 0u; j < d; j += 1u) {
            acc += tables[pi + k * d + j] * a_sh[j];
        }
        out[row * d + k] = with_mean(acc + sinks(own, k, inv) + window8(k), kvh, k, sum);
    }
}

/// Coordinate `k` of the binary16 copies' weighted values (sinks and a binary16 window:
/// original domain, the `fp_coords` accumulators before the 8-bit window's), normalized; 0
/// without copies.
fn sinks(own: u32, k: u32, inv: f32) -> f32 {
    if (params.fp_coords == 0u) {
        return 0.0;
    }
    return state[own + params.rec - params.q8_coords - params.fp_coords + k] * inv;
}

/// Coordinate `k` of an 8-bit window's weighted values turned back once: (Π₈ᵀ·w)_k, Π₈
/// column-major (entry (j, k) at k·d + j); 0 without one.
fn window8(k: u32) -> f32 {
    if (params.q8_coords == 0u) {
        return 0.0;
    }
    let d = params.value.dim;
    var acc = 0.0;
    for (var j = 0u; j < d; j += 1u) {
        acc += tables[params.q8_rotation + k * d + j] * w_sh[j];
    }
    return acc;
}

/// Output coordinate `k` of KV head `kvh` with a centered stream's mean added back, as the CPU
/// does: only for a row that saw a token (`sum > 0`), and a zero coordinate of μ is skipped
/// (`o + 0.0` would turn `−0.0` into `+0.0`).
fn with_mean(o: f32, kvh: u32, k: u32, sum: f32) -> f32 {
    if (params.value.centered == 0u || sum <= 0.0) {
        return o;
    }
    let m = tables[params.value.mean_offset + kvh * params.value.dim + k];
    if (m == 0.0) {
        return o;
    }
    return o + m;
}
