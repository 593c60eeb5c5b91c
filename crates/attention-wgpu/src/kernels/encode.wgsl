// encode.wgsl — TurboQuant encode of new key or value vectors into packed token records.
//
// Workgroup: WG = 64 threads, one workgroup per vector (vector v = token·kv_heads + head),
// flattened over a 2-D/3-D grid (`flat_workgroup`).
//
// Bindings (group 0):
//   0 params   uniform      EncodeParams
//   1 input    storage r    f32 [vectors, dim]
//   2 tables   storage r    f32 (layout in StreamDesc: Π, S, Hadamard factors, centroids,
//                           thresholds, gains)
//   3 records  storage rw   u32 [vectors, record_words]   (the record layout of tq-cache)
//   4 scales   storage rw   u32 [vectors, scales]         (binary16 bits in the low half)
//
// The steps and their floating-point order follow `TqMse::encode_rotated` / `TqProd::encode_into`
// so the output equals the CPU codec's records bit for bit wherever f32 arithmetic is IEEE:
// norm over eight fixed lanes; Π·x (dense: in input order; Hadamard: the same butterflies);
// ×(1/‖x‖); code = number of f32 thresholds below the coordinate; pack; f16 norm (RNE);
// TQ_prod: ×‖x‖ again, r = Πx − n·c[idx], γ = ‖r‖ (f32 here, f64 on the CPU), signs of S·r.

struct EncodeParams {
    desc: StreamDesc,
    vectors: u32,
    kv_heads: u32,
    grid_x: u32,
    grid_y: u32,
}

@group(0) @binding(0) var<uniform> params: EncodeParams;
@group(0) @binding(1) var<storage, read> input: array<f32>;
@group(0) @binding(2) var<storage, read> tables: array<f32>;
@group(0) @binding(3) var<storage, read_write> records: array<u32>;
@group(0) @binding(4) var<storage, read_write> scales: array<u32>;

var<workgroup> xs: array<f32, MAX_DIM>;
var<workgroup> ys: array<f32, MAX_DIM>;
var<workgroup> codes: array<u32, MAX_DIM>;
var<workgroup> lanes: array<f32, 8>;
var<workgroup> wg_norm: f32;
var<workgroup> wg_scale: f32;

/// `ys = M·xs` for a column-major d×d matrix at `offset`, each output summed in input order
/// (the order of `tq_rotation`'s blocked matvec).
fn dense_sequential(offset: u32, d: u32, lid: u32) {
    for (var j = lid; j < d; j += WG) {
        var acc = 0.0;
        for (var i = 0u; i < d; i += 1u) {
            acc += tables[offset + i * d + j] * xs[i];
        }
        ys[j] = acc;
    }
}

/// `ys = M·xs` with each output a row dot product over eight lanes combined as
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` (the order of the Gaussian QJL projection).
fn dense_lanes(offset: u32, d: u32, lid: u32) {
    for (var j = lid; j < d; j += WG) {
        var l: array<f32, 8>;
        for (var k = 0u; k < 8u; k += 1u) {
            l[k] = 0.0;
        }
        let full = d / 8u;
        for (var c = 0u; c < full; c += 1u) {
            for (var k = 0u; k < 8u; k += 1u) {
                let i = c * 8u + k;
                l[k] += tables[offset + i * d + j] * xs[i];
            }
        }
        for (var k = 0u; k < d % 8u; k += 1u) {
            let i = full * 8u + k;
            l[k] += tables[offset + i * d + j] * xs[i];
        }
        ys[j] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
}

/// `ys = diag(exit)·H·diag(entry)·xs` in workgroup memory (power-of-two d): the butterflies
/// of `tq_rotation`'s fast Walsh–Hadamard transform, level by level.
fn hadamard(offset: u32, d: u32, lid: u32) {
    for (var j = lid; j < d; j += WG) {
        ys[j] = xs[j] * tables[offset + j];
    }
    workgroupBarrier();
    for (var h = 1u; h < d; h *= 2u) {
        for (var p = lid; p < d / 2u; p += WG) {
            let i = (p / h) * 2u * h + p % h;
            let a = ys[i];
            let b = ys[i + h];
            ys[i] = a + b;
            ys[i + h] = a - b;
        }
        workgroupBarrier();
    }
    for (var j = lid; j < d; j += WG) {
        ys[j] = ys[j] * tables[offset + d + j];
    }
}

/// `ys = M·xs` for the matrix of `mode` (uniform control flow: barriers inside).
fn transform(mode: u32, dense_offset: u32, fwht_offset: u32, d: u32, lid: u32) {
    if (mode == MODE_FWHT) {
        hadamard(fwht_offset, d, lid);
    } else if (mode == MODE_DENSE_LANES) {
        dense_lanes(dense_offset, d, lid);
    } else {
        dense_sequential(dense_offset, d, lid);
    }
    workgroupBarrier();
}

/// Code = number of thresholds strictly below `y` (a value on a threshold takes the lower
/// cell; NaN takes code 0), by binary search over the sorted f32 thresholds.
fn quantize(y: f32, levels: u32, thresholds: u32) -> u32 {
    var lo = 0u;
    for (var step = levels / 2u; step > 0u; step /= 2u) {
        if (y > tables[thresholds + lo + step - 1u]) {
            lo += step;
        }
    }
    return lo;
}

/// Packs `codes[0..d)` of `bits` bits into record words `[0, words)` from `base`.
fn pack_codes(base: u32, d: u32, bits: u32, words: u32, lid: u32) {
    for (var w = lid; w < words; w += WG) {
        let first = (32u * w) / bits;
        let last = min(d - 1u, (32u * w + 31u) / bits);
        var word = 0u;
        for (var j = first; j <= last; j += 1u) {
            let start = i32(j * bits) - i32(32u * w);
            if (start >= 0) {
                word |= codes[j] << u32(start);
            } else {
                word |= codes[j] >> u32(-start);
            }
        }
        records[base + w] = word;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let v = flat_workgroup(wid, params.grid_x, params.grid_y);
    if (v >= params.vectors) {
        return;
    }
    let desc = params.desc;
    let d = desc.dim;
    let head = v % params.kv_heads;
    let rec = v * desc.record_words;
    for (var j = lid; j < d; j += WG) {
        xs[j] = input[v * d + j];
    }
    workgroupBarrier();

    if (desc.kind == KIND_F32) {
        for (var j = lid; j < d; j += WG) {
            records[rec + j] = bitcast<u32>(xs[j]);
        }
        return;
    }
    if (desc.kind == KIND_F16) {
        for (var w = lid; w < desc.record_words; w += WG) {
            let lo = f16_bits(xs[2u * w]);
            var hi = 0u;
            if (2u * w + 1u < d) {
                hi = f16_bits(xs[2u * w + 1u]);
            }
            records[rec + w] = lo | (hi << 16u);
        }
        return;
    }

    // ‖x‖ over eight lanes, remainder into the first lanes, lanes summed in order.
    if (lid < 8u) {
        var acc = 0.0;
        let full = d / 8u;
        for (var c = 0u; c < full; c += 1u) {
            let x = xs[c * 8u + lid];
            acc += x * x;
        }
        if (lid < d % 8u) {
            let x = xs[full * 8u + lid];
            acc += x * x;
        }
        lanes[lid] = acc;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var s = 0.0;
        for (var k = 0u; k < 8u; k += 1u) {
            s += lanes[k];
        }
        wg_norm = sqrt(s);
    }
    let norm = workgroupUniformLoad(&wg_norm);
    let stored = f16_bits(norm);

    transform(desc.pi_mode, desc.pi_offset + head * d * d, desc.fwht_pi_offset + head * 2u * d, d, lid);

    let cents = desc.centroid_offset;
    if (stored == 0u) {
        // A norm that rounds to zero: all-zero codes, scale 0, Π·x kept unnormalized.
        for (var j = lid; j < d; j += WG) {
            codes[j] = 0u;
        }
        if (lid == 0u) {
            wg_scale = 0.0;
            scales[v * desc.scales] = 0u;
        }
    } else {
        let inv = 1.0 / norm;
        for (var j = lid; j < d; j += WG) {
            let y = ys[j] * inv;
            codes[j] = quantize(y, desc.levels, desc.threshold_offset);
            ys[j] = y * norm;
        }
        workgroupBarrier();
        if (lid == 0u) {
            var scale_bits = stored;
            if (desc.norm_correction != 0u) {
                var c2 = 0.0;
                for (var j = 0u; j < d; j += 1u) {
                    let c = tables[cents + codes[j]];
                    c2 += c * c;
                }
                scale_bits = f16_bits(norm / sqrt(c2));
            }
            wg_scale = f16_value(scale_bits);
            scales[v * desc.scales] = scale_bits;
        }
    }
    workgroupBarrier();
    pack_codes(rec, d, desc.bits, desc.code_words, lid);
    if (desc.kind != KIND_PROD) {
        return;
    }

    // TQ_prod: residual in the rotated domain, then the QJL signs of S·r and γ = ‖r‖.
    let n = workgroupUniformLoad(&wg_scale);
    for (var j = lid; j < d; j += WG) {
        xs[j] = ys[j] - n * tables[cents + codes[j]];
    }
    workgroupBarrier();
    if (lid == 0u) {
        var r2 = 0.0;
        for (var j = 0u; j < d; j += 1u) {
            r2 += xs[j] * xs[j];
        }
        scales[v * desc.scales + 1u] = f16_bits(sqrt(r2));
    }
    transform(desc.s_mode, desc.s_offset + head * d * d, desc.fwht_s_offset + head * 2u * d, d, lid);
    let sign_base = rec + desc.code_words;
    for (var w = lid; w < (d + 31u) / 32u; w += WG) {
        var word = 0u;
        for (var k = 0u; k < 32u; k += 1u) {
            let i = 32u * w + k;
            if (i < d && ys[i] >= 0.0) {
                word |= 1u << k;
            }
        }
        records[sign_base + w] = word;
    }
}
