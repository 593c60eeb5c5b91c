// attend.wgsl — decode attention, pass 1 (flash-decoding): one token block of one page against
// the query heads of one GQA chunk: block max, block sum of exp(score − max), and the
// exp-weighted value sums in the value codec's rotated domain (and sketch domain for TQ_prod
// values; the original domain for f32 / f16 values).
//
// Workgroup: WG = 64 threads, one workgroup per (block, kv head, head chunk, query), flattened
// as id = block + blocks·(chunk + chunks·(kv_head + kv_heads·query)) over a 2-D/3-D grid; a
// head chunk is CHUNK consecutive query heads of one GQA group (CHUNK divides the group).
//
// Bindings (group 0), after attn_params.wgsl (0, 1) and score.wgsl (2 prepared, 3 tables,
// 4 kpage, 7 fp, 8 kept):
//   5 vpage     storage r   u32, one value page: words [kv_heads, page_tokens, record_words]
//                           (or the fast-scan order's blocks, `StreamDesc.order`),
//                           scales (binary16 pairs) at v_scales_offset
//   6 partials  storage rw  f32 [blocks of this page, block_stride]: per block, rows·rec
//                           records (max, sum, value accumulators), row = query·q_heads + head
//   9 gather    storage rw  f32 [rows, gather_stride] (heavy hitters; a placeholder otherwise):
//                           the score of each token a row reads in a window, from the earlier
//                           of its key and value window starts (sinks aside), for the finish
//                           kernel to turn into softmax weights
//
// Heavy hitters (kept_capacity ≠ 0): a token outside the query's window that its stream kept
// is read from its kept copy (as a window copy is) instead of the page.
//
// Token blocks never straddle pages (block_tokens divides page_tokens), so a page binds alone.

@group(0) @binding(5) var<storage, read> vpage: array<u32>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;
@group(0) @binding(9) var<storage, read_write> gather: array<f32>;

var<workgroup> cv: array<f32, MAX_LEVELS>;
/// Scores, then weights exp(score − max): [MAX_GROUP, MAX_BLOCK].
var<workgroup> p_sh: array<f32, 2048>;
/// Per token of the block, where its value is read (bits 0–1): 0 hidden, 1 from the page, 2
/// from its binary16 copy (an attention sink, a binary16 window), 3 from its 8-bit window copy;
/// for a copy a heavy hitter kept (`KEPT_VALUE`), its entry in the values' list from bit 3.
var<workgroup> live_sh: array<u32, MAX_BLOCK>;
/// Heavy hitters: the entries of the block's tokens in the kept lists of keys and values.
var<workgroup> kept_lo: array<u32, 2>;
var<workgroup> kept_hi: array<u32, 2>;
/// Value norm and γ (two tiers: the second tier's norm) per token of the block: [MAX_BLOCK, 2];
/// for a token read from an 8-bit copy, the value copy's step.
var<workgroup> vscale: array<f32, 512>;
/// Reduction scratch [MAX_GROUP, WG].
var<workgroup> red: array<f32, 512>;
var<workgroup> wg_any: u32;

/// `live_sh`: the value is read from a kept copy.
const KEPT_VALUE: u32 = 4u;

fn value_scale(kvh: u32, local: u32, k: u32) -> f32 {
    let i = (kvh * launch.page_tokens + local) * params.value.scales + k;
    let w = vpage[launch.v_scales_offset + i / 2u];
    return f16_value((w >> (16u * (i % 2u))) & 0xffffu);
}

/// Value centroid `i` (past MAX_LEVELS, as for the keys, from `tables`).
fn value_centroid(i: u32) -> f32 {
    if (i < MAX_LEVELS) {
        return cv[i];
    }
    return tables[params.value.centroid_offset + i];
}

/// Where coordinate `c` (< dim) of a coded value lives in a record: `bits` from bit `bit` of
/// the record, centroid table `centroid`, scale slot `scale` of `vscale`; `bits` 0 for a
/// coordinate no group codes (a basis component past its rank: zero).
struct CodeAt {
    bits: u32,
    bit: u32,
    centroid: u32,
    scale: u32,
    /// The fast-scan order's view: the run's first nibble lane, its codes, this code's index.
    lane: u32,
    len: u32,
    j: u32,
}

/// Nibble lane `lane` of the value record in slot `local` of KV head `kvh` (fast-scan order).
fn value_nibble(kvh: u32, local: u32, lane: u32) -> u32 {
    let block = block_word(kvh, local, launch.page_tokens, params.value.record_words);
    let at = lane_at(block, local, lane);
    return (vpage[at.x] >> at.y) & 15u;
}

/// The code at `at` of the fast-scan value record of (`kvh`, `local`) (`key_code_fs`).
fn value_code_fs(kvh: u32, local: u32, at: CodeAt) -> u32 {
    var code = 0u;
    var lane = at.lane;
    var shift = 0u;
    var width = plane_width(at.bits);
    while (width != 0u) {
        let m = 4u / width;
        let field = value_nibble(kvh, local, lane + at.j / m) >> (width * (at.j % m));
        code = code | ((field & ((1u << width) - 1u)) << shift);
        lane += (at.len + m - 1u) / m;
        shift += width;
        width = plane_width(at.bits - shift);
    }
    return code;
}

fn code_at(kvh: u32, c: u32) -> CodeAt {
    let value = params.value;
    if (value.groups == 0u) {
        return CodeAt(value.bits, c * value.bits, 0u, 0u, 0u, value.dim, c);
    }
    let table = value.group_offset + kvh * GROUP_STRIDE;
    let count = u32(tables[table]);
    for (var i = 0u; i < count; i += 1u) {
        let group = code_group(table, i);
        if (c >= group.start && c < group.start + group.len) {
            return CodeAt(group.bits, 32u * group.word + (c - group.start) * group.bits, group.centroid,
                group.scale, 8u * group.word, group.len, c - group.start);
        }
    }
    return CodeAt(0u, 0u, 0u, 0u, 0u, 0u, 0u);
}

/// Coordinate `c` of the value at (`kvh`, `local`) in its accumulation domain, without the
/// softmax weight: rotated-domain `norm·c[idx_c]` for c < dim (`at`: where its code lives,
/// with its group's norm and codebook), sketch-domain `γ·z` beyond.
fn value_coordinate(kvh: u32, local: u32, k: u32, c: u32, at: CodeAt) -> f32 {
    let value = params.value;
    let rb = (kvh * launch.page_tokens + local) * value.record_words;
    if (value.kind == KIND_F32) {
        return bitcast<f32>(vpage[rb + c]);
    }
    if (value.kind == KIND_F16) {
        return f16_value((vpage[rb + c / 2u] >> (16u * (c % 2u))) & 0xffffu);
    }
    if (c < value.dim) {
        if (at.bits == 0u) {
            return 0.0;
        }
        var code: u32;
        if (value.order != ORDER_ROWS) {
            code = value_code_fs(kvh, local, at);
        } else {
            let w = at.bit / 32u;
            let shift = at.bit % 32u;
            var hi = 0u;
            if (shift + at.bits > 32u) {
                hi = vpage[rb + w + 1u];
            }
            code = code_from(vpage[rb + w], hi, shift, at.bits);
        }
        return vscale[2u * k + at.scale] * value_centroid(at.centroid + code);
    }
    let i = c - value.dim;
    var bit: u32;
    if (value.order != ORDER_ROWS) {
        // The signs: a run of 1-bit codes after the codes' words.
        bit = value_code_fs(kvh, local, CodeAt(1u, 0u, 0u, 0u, 8u * value.code_words, value.dim, i));
    } else {
        bit = (vpage[rb + value.code_words + i / 32u] >> (i % 32u)) & 1u;
    }
    let z = select(-1.0, 1.0, bit == 1u);
    return vscale[2u * k + 1u] * z;
}

/// Tree reduction of red[g·WG + lid] over lid for g < CHUNK (max or sum); result in red[g·WG].
fn reduce(lid: u32, take_max: bool) {
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) {
            for (var g = 0u; g < CHUNK; g += 1u) {
                let a = red[g * WG + lid];
                let b = red[g * WG + lid + s];
                red[g * WG + lid] = select(a + b, max(a, b), take_max);
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let id = flat_workgroup(wid, launch.grid_x, launch.grid_y);
    if (id >= launch.total) {
        return;
    }
    let blk = id % launch.blocks;
    var r = id / launch.blocks;
    let chunk = r % params.chunks;
    r = r / params.chunks;
    let kvh = r % params.kv_heads;
    let qi = r / params.kv_heads;
    let first_head = chunk * CHUNK;
    let row0 = qi * params.q_heads + kvh * params.group + first_head;
    let qpos = bitcast<u32>(prepared[params.positions_offset + qi]);
    let bt = params.block_tokens;
    let value = params.value;
    let coded_values = value.kind == KIND_MSE || value.kind == KIND_PROD;

    load_key_centroids(lid);
    if (params.kept_capacity != 0u && lid < 2u) {
        let first = launch.first_slot + blk * bt;
        kept_lo[lid] = kept_lower_bound(lid * params.kv_heads + kvh, first);
        kept_hi[lid] = kept_lower_bound(lid * params.kv_heads + kvh, first + bt);
    }
    if (coded_values) {
        for (var i = lid; i < min(value.levels, MAX_LEVELS); i += WG) {
            cv[i] = tables[value.centroid_offset + i];
        }
    }
    workgroupBarrier();

    // Scores of the block's visible tokens; local maxima per head.
    var local_max: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g += 1u) {
        local_max[g] = NEG;
    }
    // Heavy hitters: scores of the tokens a row reads in a window, from the earlier of its
    // key and value window starts (sinks aside).
    let gathering = params.gather_stride != 0u;
    var gather_first = 0u;
    if (gathering) {
        gather_first = max(min(window_start(qi, 0u, kvh), window_start(qi, 1u, kvh)), params.sink_end);
    }
    for (var k = lid; k < bt; k += WG) {
        let local = blk * bt + k;
        let visible = slot_visible(launch.first_slot + local, local, qpos);
        let slot = launch.first_slot + local;
        // Keys and values each read the copy inside their own window (they may differ), else
        // a kept copy, else the page.
        var source = select(0u, 1u, visible);
        var vcopy = CopyAt(0u, false, false);
        var live = source;
        if (visible) {
            if (reads_copy(slot, qi, 1u, kvh)) {
                vcopy = slot_copy(params.fp_values, kvh, slot);
                source = select(2u, 3u, vcopy.q8);
                live = source;
            } else if (params.kept_capacity != 0u) {
                let list = params.kv_heads + kvh;
                let e = kept_entry(list, kept_lo[1], kept_hi[1], slot);
                if (e != NO_COPY) {
                    vcopy = kept_copy(list, e);
                    source = select(2u, 3u, vcopy.q8);
                    live = source | KEPT_VALUE | (e << 3u);
                }
            }
        }
        live_sh[k] = live;
        if (visible) {
            var s: array<f32, MAX_GROUP>;
            let key_copy = reads_copy(slot, qi, 0u, kvh);
            var kept_key = NO_COPY;
            if (params.kept_capacity != 0u && !key_copy) {
                kept_key = kept_entry(kvh, kept_lo[0], kept_hi[0], slot);
            }
            if (key_copy) {
                s = copy_key_scores(row0, slot_copy(0u, kvh, slot));
            } else if (kept_key != NO_COPY) {
                s = copy_key_scores(row0, kept_copy(kvh, kept_key));
            } else {
                s = key_scores(row0, kvh, local);
            }
            add_center_corrections(&s, row0, slot);
            for (var g = 0u; g < CHUNK; g += 1u) {
                p_sh[g * MAX_BLOCK + k] = s[g];
                local_max[g] = max(local_max[g], s[g]);
            }
            if (gathering && slot >= gather_first && slot - gather_first < params.gather_stride) {
                for (var g = 0u; g < CHUNK; g += 1u) {
                    gather[(row0 + g) * params.gather_stride + slot - gather_first] = s[g];
                }
            }
            if (source == 3u) {
                vscale[2u * k] = q8_step(vcopy);
            } else if (source == 1u && coded_values) {
                vscale[2u * k] = value_scale(kvh, local, 0u);
                if (value.scales > 1u) {
                    vscale[2u * k + 1u] = value_scale(kvh, local, 1u);
                }
            }
        }
    }
    for (var g = 0u; g < CHUNK; g += 1u) {
        red[g * WG + lid] = local_max[g];
    }
    workgroupBarrier();
    reduce(lid, true);
    if (lid == 0u) {
        wg_any = select(0u, 1u, red[0] > NEG);
    }
    let any_visible = workgroupUniformLoad(&wg_any);
    let stride = params.rec;
    let base = blk * params.block_stride;
    if (any_visible == 0u) {
        if (lid < CHUNK) {
            partials[base + (row0 + lid) * stride] = NEG;
            partials[base + (row0 + lid) * stride + 1u] = 0.0;
        }
        return;
    }
    var block_max: array<f32, MAX_GROUP>;
    for (var g = 0u; g < CHUNK; g += 1u) {
        block_max[g] = red[g * WG];
    }
    workgroupBarrier();

    // Weights exp(score − max) in place; their sums per head.
    var local_sum: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g += 1u) {
        local_sum[g] = 0.0;
    }
    for (var k = lid; k < bt; k += WG) {
        for (var g = 0u; g < CHUNK; g += 1u) {
            var p = 0.0;
            if (live_sh[k] != 0u) {
                p = exp(p_sh[g * MAX_BLOCK + k] - block_max[g]);
            }
            p_sh[g * MAX_BLOCK + k] = p;
            local_sum[g] += p;
        }
    }
    for (var g = 0u; g < CHUNK; g += 1u) {
        red[g * WG + lid] = local_sum[g];
    }
    workgroupBarrier();
    reduce(lid, false);
    if (lid < CHUNK) {
        partials[base + (row0 + lid) * stride] = block_max[lid];
        partials[base + (row0 + lid) * stride + 1u] = red[lid * WG];
    }

    // Weighted value sums, one coordinate per thread at a time, tokens in order: the page's
    // records in their accumulation domain, then the binary16 copies' (original domain) in the
    // next fp_coords accumulators, then the 8-bit copies' (Π₈'s coordinates) in the last
    // q8_coords.
    var coords = value.dim;
    if (value.kind == KIND_PROD) {
        coords = 2u * value.dim;
    }
    let fp_end = coords + params.fp_coords;
    for (var c = lid; c < fp_end + params.q8_coords; c += WG) {
        var acc: array<f32, MAX_GROUP>;
        for (var g = 0u; g < MAX_GROUP; g += 1u) {
            acc[g] = 0.0;
        }
        var source = 1u;
        if (c >= fp_end) {
            source = 3u;
        } else if (c >= coords) {
            source = 2u;
        }
        var at = CodeAt(0u, 0u, 0u, 0u, 0u, 0u, 0u);
        if (coded_values && c < value.dim) {
            at = code_at(kvh, c);
        }
        for (var k = 0u; k < bt; k += 1u) {
            let live = live_sh[k];
            if ((live & 3u) == source) {
                var x: f32;
                if (source == 1u) {
                    x = value_coordinate(kvh, blk * bt + k, k, c, at);
                } else {
                    var copy = slot_copy(params.fp_values, kvh, launch.first_slot + blk * bt + k);
                    if ((live & KEPT_VALUE) != 0u) {
                        copy = kept_copy(params.kv_heads + kvh, live >> 3u);
                    }
                    if (source == 3u) {
                        x = vscale[2u * k] * q8_code(copy, c - fp_end);
                    } else {
                        x = copy_coordinate(copy, c - coords);
                    }
                }
                for (var g = 0u; g < CHUNK; g += 1u) {
                    acc[g] += p_sh[g * MAX_BLOCK + k] * x;
                }
            }
        }
        for (var g = 0u; g < CHUNK; g += 1u) {
            partials[base + (row0 + g) * stride + 2u + c] = acc[g];
        }
    }
}
