// merge.wgsl — decode attention, pass 2a: folds one window of pass-1 block partials into the
// running state of every row (max, sum, accumulators), in block order. Windows are merged in
// order too, so a call whose partials exceed one binding merges them window by window.
//
// Workgroup: WG = 64 threads, one workgroup per row (row = query·q_heads + head).
//
// Bindings (group 0), after attn_params.wgsl (0 params, 1 launch):
//   2 partials  storage r   f32 [launch.blocks, block_stride] (a window of pass-1 output)
//   3 state     storage rw  f32 [rows, rec]: max, sum, accumulators

@group(0) @binding(2) var<storage, read> partials: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;

const TILE: u32 = 256u;
var<workgroup> weights: array<f32, TILE>;
var<workgroup> red: array<f32, WG>;
var<workgroup> wg_max: f32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = flat_workgroup(wid, launch.grid_x, launch.grid_y);
    if (row >= launch.total) {
        return;
    }
    let rec = params.rec;
    let own = row * rec;
    let blocks = launch.blocks;
    var prev_max = NEG;
    var prev_sum = 0.0;
    if (launch.init == 0u) {
        prev_max = state[own];
        prev_sum = state[own + 1u];
    }

    // The largest block maximum among blocks that saw a token (and the previous state's).
    var m = NEG;
    for (var b = lid; b < blocks; b += WG) {
        let at = b * params.block_stride + own;
        if (partials[at + 1u] > 0.0) {
            m = max(m, partials[at]);
        }
    }
    red[lid] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        var top = red[0];
        if (prev_sum > 0.0) {
            top = max(top, prev_max);
        }
        wg_max = top;
    }
    let top = workgroupUniformLoad(&wg_max);

    var carry = 0.0;
    if (prev_sum > 0.0) {
        carry = exp(prev_max - top);
    }
    let coords = rec - 2u;
    for (var c = lid; c < coords; c += WG) {
        var acc = 0.0;
        if (launch.init == 0u) {
            acc = carry * state[own + 2u + c];
        }
        state[own + 2u + c] = acc;
    }
    var total = carry * prev_sum;
    for (var t0 = 0u; t0 < blocks; t0 += TILE) {
        let n = min(TILE, blocks - t0);
        for (var k = lid; k < n; k += WG) {
            let at = (t0 + k) * params.block_stride + own;
            var w = 0.0;
            if (partials[at + 1u] > 0.0) {
                w = exp(partials[at] - top);
            }
            weights[k] = w;
        }
        workgroupBarrier();
        if (lid == 0u) {
            for (var k = 0u; k < n; k += 1u) {
                total += weights[k] * partials[(t0 + k) * params.block_stride + own + 1u];
            }
        }
        for (var c = lid; c < coords; c += WG) {
            var acc = state[own + 2u + c];
            for (var k = 0u; k < n; k += 1u) {
                let w = weights[k];
                if (w != 0.0) {
                    acc += w * partials[(t0 + k) * params.block_stride + own + 2u + c];
                }
            }
            state[own + 2u + c] = acc;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        state[own] = top;
        state[own + 1u] = total;
    }
}
