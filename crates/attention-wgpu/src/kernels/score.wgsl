// score.wgsl — scoring one key record against prepared queries, and the position masks
// (prepended to attend.wgsl and scores.wgsl, after attn_params.wgsl).
//
// Bindings (group 0):
//   2 prepared  storage r  f32 [rows, qstride] prepared queries, then the query positions:
//                          coded keys: scale·correction·Π_K·q and α·s·S·(scale·Π_K·q);
//                          plain keys: scale·q; after the positions (and window starts),
//                          RoPE-centered keys' score corrections per row and center block
//   3 tables    storage r  f32, key and value tables (StreamDesc offsets)
//   4 kpage     storage r  u32, one key page: words [kv_heads, page_tokens, record_words]
//                          (or the fast-scan order's blocks, `StreamDesc.order`),
//                          scales (binary16 pairs) at k_scales_offset, positions at
//                          k_positions_offset
//   7 fp        storage r  u32, the copies of the attention sinks (binary16) and of the recent
//                          window's ring (binary16 or 8-bit): keys at 0, values at fp_values,
//                          per KV head the sink slots then the ring's (see AttnParams.sink_end;
//                          a 16-byte placeholder without copies)
//   8 kept      storage r  u32, heavy hitters' kept copies (AttnParams.kept_capacity ≠ 0;
//                          otherwise a placeholder never read): per list (stream·kv_heads +
//                          KV head) a count, then [lists, kept_capacity] kept tokens
//                          ascending, then [lists, kept_capacity, ring_words] their copies in
//                          the ring's format
//
// A score is `norm·⟨q̃, c[idx]⟩ + γ·⟨s̃, z⟩` for coded keys (z = ±1 from the sign bits),
// `Σ_G norm_G·⟨q̃_G, c_G[idx]⟩` for keys of several code groups (two tiers, a basis),
// `⟨scale·q, k⟩` for f32 / f16 keys.

/// Query heads scored per workgroup (pipeline constant; divides the GQA group, ≤ MAX_GROUP).
/// A constant trip count lets the driver unroll the head loops and keep the per-head
/// accumulators in registers.
override CHUNK: u32 = 8u;

@group(0) @binding(2) var<storage, read> prepared: array<f32>;
@group(0) @binding(3) var<storage, read> tables: array<f32>;
@group(0) @binding(4) var<storage, read> kpage: array<u32>;
@group(0) @binding(7) var<storage, read> fp: array<u32>;
@group(0) @binding(8) var<storage, read> kept: array<u32>;

/// No kept copy.
const NO_COPY: u32 = 0xffffffffu;

/// Where a full-precision copy starts: word `at` of `fp` (a sink's or the ring's) or, for a
/// heavy hitter's, of `kept`; and whether it is an 8-bit copy.
struct CopyAt {
    at: u32,
    in_kept: bool,
    q8: bool,
}

/// Key centroids, loaded once per workgroup (the first MAX_LEVELS of them: the codebooks of
/// several code groups together may hold more, read from `tables`).
var<workgroup> ck: array<f32, MAX_LEVELS>;

/// Loads the key centroids into `ck` (all threads; a barrier must follow).
fn load_key_centroids(lid: u32) {
    if (params.key.kind == KIND_MSE || params.key.kind == KIND_PROD) {
        for (var i = lid; i < min(params.key.levels, MAX_LEVELS); i += WG) {
            ck[i] = tables[params.key.centroid_offset + i];
        }
    }
}

/// Key centroid `i`.
fn key_centroid(i: u32) -> f32 {
    if (i < MAX_LEVELS) {
        return ck[i];
    }
    return tables[params.key.centroid_offset + i];
}

/// Scale `k` (0: norm, 1: γ) of the key at (`kvh`, `local`) in the bound page.
fn key_scale(kvh: u32, local: u32, k: u32) -> f32 {
    let i = (kvh * launch.page_tokens + local) * params.key.scales + k;
    let w = kpage[launch.k_scales_offset + i / 2u];
    return f16_value((w >> (16u * (i % 2u))) & 0xffffu);
}

/// The stream index of the token in written slot `slot`: the slot itself on a growing layer,
/// the newest token living in it on a ring.
fn slot_token(slot: u32) -> u32 {
    if (params.ring_slots == 0u) {
        return slot;
    }
    return slot + params.ring_slots * ((params.len - 1u - slot) / params.ring_slots);
}

/// Whether the token in slot `slot` (`local` within the bound page) is stored and visible to a
/// query at position `qpos`: causal (position ≤ qpos) and, with a window W, position > qpos − W.
fn slot_visible(slot: u32, local: u32, qpos: u32) -> bool {
    if (slot >= params.len) {
        return false;
    }
    if (params.ring_slots != 0u && slot >= params.ring_slots) {
        return false;
    }
    let t = slot_token(slot);
    if (t < params.first_stored) {
        return false;
    }
    let p = kpage[launch.k_positions_offset + local];
    if (p > qpos) {
        return false;
    }
    if (params.window != 0u && p + params.window <= qpos) {
        return false;
    }
    return true;
}

/// `Σ_j q̃[first + j]·c[centroids + code_j]` for prepared rows `row0 .. row0 + CHUNK`, over
/// the `count` `bits`-bit codes packed from word `rb` of the bound key page (read word by word).
fn coded_dot(row0: u32, rb: u32, first: u32, count: u32, bits: u32, centroids: u32)
    -> array<f32, MAX_GROUP> {
    var out: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g += 1u) {
        out[g] = 0.0;
    }
    let qs = params.qstride;
    let mask = (1u << bits) - 1u;
    var cur = kpage[rb];
    var next_word = 1u;
    var used = 0u;
    for (var j = 0u; j < count; j += 1u) {
        var code = cur >> used;
        if (used + bits > 32u) {
            code = code | (kpage[rb + next_word] << (32u - used));
        }
        code = code & mask;
        used += bits;
        if (used >= 32u) {
            used -= 32u;
            if (j + 1u < count) {
                cur = kpage[rb + next_word];
                next_word += 1u;
            }
        }
        let c = key_centroid(centroids + code);
        for (var g = 0u; g < CHUNK; g += 1u) {
            out[g] += prepared[(row0 + g) * qs + first + j] * c;
        }
    }
    return out;
}

/// Nibble lane `lane` of the key record in slot `local` of KV head `kvh` (fast-scan order).
fn key_nibble(kvh: u32, local: u32, lane: u32) -> u32 {
    let block = block_word(kvh, local, launch.page_tokens, params.key.record_words);
    let at = lane_at(block, local, lane);
    return (kpage[at.x] >> at.y) & 15u;
}

/// Code `j` of a run of `len` codes of `bits` bits whose planes start at nibble lane
/// `first_lane`, in the fast-scan key record of (`kvh`, `local`): each plane's bits (a nibble,
/// or a 2- or 1-bit field of one) shifted into place.
fn key_code_fs(kvh: u32, local: u32, first_lane: u32, len: u32, j: u32, bits: u32) -> u32 {
    var code = 0u;
    var lane = first_lane;
    var shift = 0u;
    var width = plane_width(bits);
    while (width != 0u) {
        let m = 4u / width;
        let field = key_nibble(kvh, local, lane + j / m) >> (width * (j % m));
        code = code | ((field & ((1u << width) - 1u)) << shift);
        lane += (len + m - 1u) / m;
        shift += width;
        width = plane_width(bits - shift);
    }
    return code;
}

/// [`coded_dot`] over a run of a fast-scan key record: its planes from nibble lane
/// `first_lane` of the record in slot `local` of KV head `kvh`.
fn coded_dot_fs(row0: u32, kvh: u32, local: u32, first_lane: u32, first: u32, count: u32, bits: u32,
    centroids: u32) -> array<f32, MAX_GROUP> {
    var out: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g += 1u) {
        out[g] = 0.0;
    }
    let qs = params.qstride;
    for (var j = 0u; j < count; j += 1u) {
        let c = key_centroid(centroids + key_code_fs(kvh, local, first_lane, count, j, bits));
        for (var g = 0u; g < CHUNK; g += 1u) {
            out[g] += prepared[(row0 + g) * qs + first + j] * c;
        }
    }
    return out;
}

/// Group `i` of the group table at `table` (see `StreamDesc.groups`).
fn code_group(table: u32, i: u32) -> CodeGroup {
    let e = table + 1u + 6u * i;
    return CodeGroup(
        u32(tables[e]),
        u32(tables[e + 1u]),
        u32(tables[e + 2u]),
        u32(tables[e + 3u]),
        u32(tables[e + 4u]),
        u32(tables[e + 5u]),
    );
}

/// Whether the token in slot `slot` is read from its copy rather than the page by query `qi`
/// in stream `stream` (0 keys, 1 values) of KV head `kvh`: an attention sink, or a token of that
/// stream's recent window for the query (both exist on growing layers only, where slot =
/// token). Window starts follow the query positions in `prepared`, `[queries, 2, kv_heads]`
/// (`len` where a stream has no window).
fn reads_copy(slot: u32, qi: u32, stream: u32, kvh: u32) -> bool {
    if (params.fp_coords == 0u) {
        return false;
    }
    return slot < params.sink_end || slot >= window_start(qi, stream, kvh);
}

/// Where query `qi` starts reading stream `stream` of KV head `kvh` from its window's copies.
fn window_start(qi: u32, stream: u32, kvh: u32) -> u32 {
    let at = params.positions_offset + params.queries + (qi * 2u + stream) * params.kv_heads + kvh;
    return bitcast<u32>(prepared[at]);
}

/// Word of `fp` where the copy of token `t` (a sink, or in the recent ring) of KV head `kvh`
/// starts, keys (`base` 0) or values (`base` fp_values).
fn fp_slot_word(base: u32, kvh: u32, t: u32) -> u32 {
    let sink_words = (params.key.dim + 1u) / 2u;
    let sinks = params.fp_slots - params.fp_ring;
    let head = base + kvh * (sinks * sink_words + params.fp_ring * params.ring_words);
    if (t < sinks) {
        return head + t * sink_words;
    }
    return head + sinks * sink_words + (t % max(params.fp_ring, 1u)) * params.ring_words;
}

/// Whether token `t`'s copy is an 8-bit one (in the ring of an 8-bit window; sinks keep
/// binary16 copies).
fn copy_is_q8(t: u32) -> bool {
    return params.q8_coords != 0u && t >= params.fp_slots - params.fp_ring;
}

/// The copy of token `t` (a sink, or in the recent ring) of KV head `kvh` in `fp`, keys
/// (`base` 0) or values (`base` fp_values).
fn slot_copy(base: u32, kvh: u32, t: u32) -> CopyAt {
    return CopyAt(fp_slot_word(base, kvh, t), false, copy_is_q8(t));
}

/// Word `i` of the copy `c`.
fn copy_word(c: CopyAt, i: u32) -> u32 {
    if (c.in_kept) {
        return kept[c.at + i];
    }
    return fp[c.at + i];
}

/// Heavy hitters: the kept token of entry `e` of list `list` (stream·kv_heads + KV head).
fn kept_token(list: u32, e: u32) -> u32 {
    return kept[2u * params.kv_heads + list * params.kept_capacity + e];
}

/// The kept copy of entry `e` of list `list` (in the ring's format).
fn kept_copy(list: u32, e: u32) -> CopyAt {
    let lists = 2u * params.kv_heads;
    let at = lists + lists * params.kept_capacity + (list * params.kept_capacity + e) * params.ring_words;
    return CopyAt(at, true, params.q8_coords != 0u);
}

/// The first entry of list `list` whose token is at or after `t` (0 without heavy hitters).
fn kept_lower_bound(list: u32, t: u32) -> u32 {
    if (params.kept_capacity == 0u) {
        return 0u;
    }
    var lo = 0u;
    var hi = kept[list];
    while (lo < hi) {
        let m = (lo + hi) / 2u;
        if (kept_token(list, m) < t) {
            lo = m + 1u;
        } else {
            hi = m;
        }
    }
    return lo;
}

/// The entry of token `t` among entries `lo .. hi` of list `list`, or NO_COPY.
fn kept_entry(list: u32, lo: u32, hi: u32, t: u32) -> u32 {
    for (var e = lo; e < hi; e += 1u) {
        if (kept_token(list, e) == t) {
            return e;
        }
    }
    return NO_COPY;
}

/// Coordinate `j` of the binary16 copy `c`.
fn copy_coordinate(c: CopyAt, j: u32) -> f32 {
    let w = copy_word(c, j / 2u);
    return f16_value((w >> (16u * (j % 2u))) & 0xffffu);
}

/// Code `j` (a signed byte, in Π₈'s coordinates) of the 8-bit copy `c`.
fn q8_code(c: CopyAt, j: u32) -> f32 {
    let byte = (copy_word(c, j / 4u) >> (8u * (j % 4u))) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

/// The step of the 8-bit copy `c` (its last word's low half, binary16).
fn q8_step(c: CopyAt) -> f32 {
    return f16_value(copy_word(c, params.ring_words - 1u) & 0xffffu);
}

/// Scores `⟨scale·q, k⟩` of the full-precision key copy `c` against prepared rows
/// `row0 .. row0 + CHUNK`: a binary16 copy against their `scale·q` at `fp_query`, an 8-bit one
/// as `s·⟨Π₈·scale·q, c⟩` against `q8_query`.
fn copy_key_scores(row0: u32, c: CopyAt) -> array<f32, MAX_GROUP> {
    var out: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g += 1u) {
        out[g] = 0.0;
    }
    let qs = params.qstride;
    if (c.q8) {
        for (var j = 0u; j < params.key.dim; j += 1u) {
            let x = q8_code(c, j);
            for (var g = 0u; g < CHUNK; g += 1u) {
                out[g] += prepared[(row0 + g) * qs + params.q8_query + j] * x;
            }
        }
        let step = q8_step(c);
        for (var g = 0u; g < CHUNK; g += 1u) {
            out[g] *= step;
        }
        return out;
    }
    for (var j = 0u; j < params.key.dim; j += 1u) {
        let x = copy_coordinate(c, j);
        for (var g = 0u; g < CHUNK; g += 1u) {
            out[g] += prepared[(row0 + g) * qs + params.fp_query + j] * x;
        }
    }
    return out;
}

/// RoPE-centered keys: adds the score correction of the center block of the (visible) token in
/// slot `slot` to its scores `s` against prepared rows `row0 .. row0 + CHUNK` (written by the
/// prepare kernel; `AttnParams.center_bias`); nothing for other keys.
fn add_center_corrections(s: ptr<function, array<f32, MAX_GROUP>>, row0: u32, slot: u32) {
    if (params.center_blocks == 0u) {
        return;
    }
    let k = slot_token(slot) / CENTER_BLOCK - params.center_first_block;
    for (var g = 0u; g < CHUNK; g += 1u) {
        (*s)[g] += prepared[params.center_bias + (row0 + g) * params.center_blocks + k];
    }
}

/// Scores of the key at (`kvh`, `local`) against prepared rows `row0 .. row0 + CHUNK`.
fn key_scores(row0: u32, kvh: u32, local: u32) -> array<f32, MAX_GROUP> {
    var out: array<f32, MAX_GROUP>;
    for (var g = 0u; g < MAX_GROUP; g += 1u) {
        out[g] = 0.0;
    }
    let key = params.key;
    let d = key.dim;
    let qs = params.qstride;
    let rb = (kvh * launch.page_tokens + local) * key.record_words;
    if (key.kind == KIND_F32 || key.kind == KIND_F16) {
        for (var j = 0u; j < d; j += 1u) {
            var x: f32;
            if (key.kind == KIND_F32) {
                x = bitcast<f32>(kpage[rb + j]);
            } else {
                x = f16_value((kpage[rb + j / 2u] >> (16u * (j % 2u))) & 0xffffu);
            }
            for (var g = 0u; g < CHUNK; g += 1u) {
                out[g] += prepared[(row0 + g) * qs + j] * x;
            }
        }
        return out;
    }
    if (key.groups != 0u) {
        // Several code groups: each group's codes against its coordinates, times its scale.
        let table = key.group_offset + kvh * GROUP_STRIDE;
        let count = u32(tables[table]);
        for (var i = 0u; i < count; i += 1u) {
            let group = code_group(table, i);
            var part: array<f32, MAX_GROUP>;
            if (key.order != ORDER_ROWS) {
                part = coded_dot_fs(row0, kvh, local, 8u * group.word, group.start, group.len, group.bits, group.centroid);
            } else {
                part = coded_dot(row0, rb + group.word, group.start, group.len, group.bits, group.centroid);
            }
            let norm = key_scale(kvh, local, group.scale);
            for (var g = 0u; g < CHUNK; g += 1u) {
                out[g] += norm * part[g];
            }
        }
        return out;
    }
    var first: array<f32, MAX_GROUP>;
    if (key.order != ORDER_ROWS) {
        first = coded_dot_fs(row0, kvh, local, 0u, 0u, d, key.bits, 0u);
    } else {
        first = coded_dot(row0, rb, 0u, d, key.bits, 0u);
    }
    let norm = key_scale(kvh, local, 0u);
    for (var g = 0u; g < CHUNK; g += 1u) {
        out[g] = norm * first[g];
    }
    if (key.kind == KIND_PROD) {
        let gamma = key_scale(kvh, local, 1u);
        let sb = rb + key.code_words;
        var sign_sum: array<f32, MAX_GROUP>;
        for (var g = 0u; g < MAX_GROUP; g += 1u) {
            sign_sum[g] = 0.0;
        }
        for (var i = 0u; i < d; i += 1u) {
            var bit: u32;
            if (key.order != ORDER_ROWS) {
                // The signs: a run of 1-bit codes after the codes' words.
                bit = key_code_fs(kvh, local, 8u * key.code_words, d, i, 1u);
            } else {
                bit = (kpage[sb + i / 32u] >> (i % 32u)) & 1u;
            }
            let z = select(-1.0, 1.0, bit == 1u);
            for (var g = 0u; g < CHUNK; g += 1u) {
                sign_sum[g] += prepared[(row0 + g) * qs + d + i] * z;
            }
        }
        for (var g = 0u; g < CHUNK; g += 1u) {
            out[g] += gamma * sign_sum[g];
        }
    }
    return out;
}
