// common.wgsl — declarations shared by every kernel of this crate (prepended to each one).
//
// Nothing here binds a resource: it holds the stream descriptor every kernel reads from its
// uniform parameters, the exact f16 conversions and the b-bit code extraction of the packed
// layout (`tq_cache::codec::packing`: code j at bits [j·b, (j+1)·b) of a record, little-endian,
// possibly straddling two u32 words).

/// Largest head dimension the kernels accept (workgroup arrays are sized by it).
const MAX_DIM: u32 = 512u;
/// Largest codebook (2^8 centroids).
const MAX_LEVELS: u32 = 256u;
/// Threads per workgroup, for every kernel.
const WG: u32 = 64u;

/// Stream kinds (`StreamDesc.kind`).
const KIND_F32: u32 = 0u;
const KIND_F16: u32 = 1u;
const KIND_MSE: u32 = 2u;
const KIND_PROD: u32 = 3u;

/// Matrix modes (`StreamDesc.pi_mode`, `StreamDesc.s_mode`).
const MODE_DENSE: u32 = 0u;       // column-major matrix, outputs summed in input order
const MODE_FWHT: u32 = 1u;        // randomized Hadamard: entry signs, FWHT, exit signs·1/√d
const MODE_DENSE_LANES: u32 = 2u; // row dot products over eight fixed lanes (Gaussian QJL)

/// How one stream (the keys or the values of a layer) is stored, and where its tables lie in
/// the f32 `tables` buffer (all offsets in f32 elements; per-head tables have a fixed stride).
struct StreamDesc {
    kind: u32,
    dim: u32,
    /// Bits per MSE code (TQ_prod: total bits − 1).
    bits: u32,
    /// u32 words per token record.
    record_words: u32,
    /// Words of packed codes at the start of a record (QJL sign words follow for TQ_prod).
    code_words: u32,
    /// f16 scales per token (norm, then γ for TQ_prod).
    scales: u32,
    levels: u32,
    pi_mode: u32,
    s_mode: u32,
    norm_correction: u32,
    /// Π column-major, `[kv_heads, dim, dim]`: entry (i, j) of head h at h·dim² + j·dim + i.
    pi_offset: u32,
    /// S column-major, `[kv_heads, dim, dim]` (TQ_prod).
    s_offset: u32,
    /// Hadamard factors of Π, `[kv_heads, 2, dim]`: entry signs, then exit factors.
    fwht_pi_offset: u32,
    /// Hadamard factors of S, `[kv_heads, 2, dim]`.
    fwht_s_offset: u32,
    /// Centroids `[levels]`, f32 as the CPU codec uses them.
    centroid_offset: u32,
    /// Interior thresholds `[levels − 1]`, rounded down to f32 as the CPU quantizer uses them.
    threshold_offset: u32,
    /// QJL gain α·s per head, `[kv_heads]`.
    gain_offset: u32,
    /// Score factor per head (1, or 1/(1 − D_mse) for debiased MSE keys), `[kv_heads]`.
    correction_offset: u32,
    /// 1 for a record of several code groups (two tiers, a data-aware basis): Π is then the
    /// d×d map to every group's coordinates (rotated coordinates past the coded ones are zero),
    /// and each KV head has a group table of GROUP_STRIDE f32 at `group_offset + kvh·
    /// GROUP_STRIDE`: the group count, then per group its first coordinate, length, bits,
    /// first record word, first centroid and scale index (small integers, exact as f32).
    groups: u32,
    group_offset: u32,
    /// 1 for a mean-centered value stream: records hold `v − μ`, and the outputs of a row that
    /// saw a token get `μ` (per KV head, `[kv_heads, dim]` at `mean_offset`) added back. Keys
    /// with a fixed mean need nothing: a common shift of a query's scores leaves its softmax
    /// unchanged. CENTER_ROPE for `center = "rope"` keys: records hold `k − R(φ_b)·m`, `m` per
    /// KV head at `mean_offset`, and each score gets `q·R(φ_b)·m` back (`AttnParams.center_bias`).
    centered: u32,
    mean_offset: u32,
    /// Record order (ORDER_*): rows (`[kv_heads, page_tokens, record_words]` words), or the
    /// fast-scan order of `tq_cache::record_order`: per KV head, blocks of 32 slots, each
    /// `record_words·32` words holding, for nibble lane k of a record, 16 bytes (byte i: slot
    /// i's nibble k low, slot i + 16's high) — the CPU store's bytes. With bit planes, runs of
    /// codes of 3 or 5–8 bits are stored as planes of 4, 2 and 1 of their bits (`plane_width`).
    order: u32,
    /// With bit planes, per KV head `32·record_words` f32 at `planes_offset + kvh·32·
    /// record_words`: the plain record bit stored at each permuted bit (65535: padding).
    planes_offset: u32,
}

/// `StreamDesc.centered` of RoPE-centered keys.
const CENTER_ROPE: u32 = 2u;

/// Record orders (`StreamDesc.order`).
const ORDER_ROWS: u32 = 0u;
const ORDER_FAST_SCAN: u32 = 1u;
const ORDER_PLANES: u32 = 2u;

/// Width of the next bit plane of a code with `rest` bits not yet in a plane: 4, 2, 1 (the
/// binary digits of the width, widest first: 3 = 2 + 1, 6 = 4 + 2, 8 = 4 + 4; 1-, 2- and 4-bit
/// codes are one plane, their own nibbles), 0 once none is left (`record_order::planes_from`).
fn plane_width(rest: u32) -> u32 {
    if (rest >= 4u) {
        return 4u;
    }
    if (rest >= 2u) {
        return 2u;
    }
    return rest;
}

/// Word and bit shift of nibble lane `lane` of slot `local` in a fast-scan page region whose
/// 32-slot block starts at word `block` (words `[block, block + 32·record_words)`).
fn lane_at(block: u32, local: u32, lane: u32) -> vec2<u32> {
    let byte = local % 16u;
    return vec2<u32>(block + 4u * lane + byte / 4u, 8u * (byte % 4u) + 4u * ((local % 32u) / 16u));
}

/// First word of the fast-scan block holding slot `local` of KV head `kvh` in a page of
/// `page_tokens` slots (a block of 32 records takes the words 32 rows would).
fn block_word(kvh: u32, local: u32, page_tokens: u32, record_words: u32) -> u32 {
    return (kvh * page_tokens + (local & ~31u)) * record_words;
}

/// Most code groups per record, and f32 per head of a group table (`tables.rs`).
const MAX_GROUPS: u32 = 8u;
const GROUP_STRIDE: u32 = 49u;

/// One code group of a grouped record (see `StreamDesc.groups`).
struct CodeGroup {
    start: u32,
    len: u32,
    bits: u32,
    word: u32,
    centroid: u32,
    scale: u32,
}

/// IEEE binary16 bits of `x`, rounded to nearest even exactly as `half::f16::from_f32`
/// (integer arithmetic only, so every backend gives the same bits; overflow gives ±inf).
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = i32((b >> 23u) & 0xffu);
    let m = b & 0x7fffffu;
    if (e == 255) {
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let he = e - 112;
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    if (he <= 0) {
        if (he < -10) {
            return sign;
        }
        let full = m | 0x800000u;
        let shift = u32(14 - he);
        var hm = full >> shift;
        let rem = full & ((1u << shift) - 1u);
        let half_way = 1u << (shift - 1u);
        if (rem > half_way || (rem == half_way && (hm & 1u) == 1u)) {
            hm += 1u;
        }
        return sign | hm;
    }
    let hm = m >> 13u;
    let rem = m & 0x1fffu;
    var r = sign | (u32(he) << 10u) | hm;
    if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u) == 1u)) {
        r += 1u; // a carry into the exponent is the correct rounding (up to ±inf)
    }
    return r;
}

/// The f32 value of the binary16 bits in the low half of `h` (exact; subnormals kept).
fn f16_value(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // ±0 or a subnormal: m·2^-24, exact in f32.
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | sign);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

/// The `bits`-bit field starting at bit `shift` of `lo`, continued into `hi` when it straddles.
fn code_from(lo: u32, hi: u32, shift: u32, bits: u32) -> u32 {
    var c = lo >> shift;
    if (shift + bits > 32u) {
        c = c | (hi << (32u - shift));
    }
    return c & ((1u << bits) - 1u);
}

/// Workgroup index of a 2-D (or 3-D) dispatch, flattened: dispatches larger than the limit
/// per dimension wrap into y (and z); `grid_x`, `grid_y` are the dispatched x and y counts.
fn flat_workgroup(wid: vec3<u32>, grid_x: u32, grid_y: u32) -> u32 {
    return wid.x + grid_x * (wid.y + grid_y * wid.z);
}
