// attn_params.wgsl — the parameters every attention kernel reads (prepended after common.wgsl).
//
// Bindings (group 0), shared by prepare / attend / scores / merge / finish:
//   0 params    uniform  AttnParams      one call (a chunk of query tokens, all heads)
//   1 launch    uniform  DispatchParams  one dispatch (its grid, page or window)

/// Largest number of query heads one workgroup scores together (GQA heads of one KV head).
const MAX_GROUP: u32 = 8u;
/// Largest token block of pass 1 (workgroup arrays are sized by it).
const MAX_BLOCK: u32 = 256u;
/// Stands for −∞ in maxima (WGSL has no infinite constants); real scores are finite.
const NEG: f32 = -3.0e38;
/// Tokens per block of one RoPE-aware key center (`tq_cache::rope_center::CENTER_BLOCK`).
const CENTER_BLOCK: u32 = 16u;

struct AttnParams {
    key: StreamDesc,
    value: StreamDesc,
    /// Query tokens in this call.
    queries: u32,
    q_heads: u32,
    kv_heads: u32,
    /// Query heads per KV head (GQA).
    group: u32,
    /// Query heads per pass-1 workgroup (≤ MAX_GROUP) and the chunks a group splits into.
    chunk_heads: u32,
    chunks: u32,
    /// f32 per prepared query row: key dim, then the key sketch dim for TQ_prod keys.
    qstride: u32,
    /// Index in `prepared` where the query positions (u32 bits) start.
    positions_offset: u32,
    /// Softmax temperature (usually 1/√d).
    scale: f32,
    /// Tokens appended so far, the oldest still stored, ring size (0: growing), window (0: none).
    len: u32,
    first_stored: u32,
    ring_slots: u32,
    window: u32,
    /// Tokens per pass-1 block (divides every page's token count).
    block_tokens: u32,
    /// f32 per partial record: max, sum, value dim accumulators, value sketch accumulators.
    rec: u32,
    /// f32 per block in the partials (≥ rows·rec, padded to the storage offset alignment).
    block_stride: u32,
    /// queries · q_heads.
    rows: u32,
    /// f32 per row of the scores output (slots).
    score_stride: u32,
    /// Attention sinks and recent windows (growing layers): tokens `t < sink_end` (min(sinks,
    /// len)) and `t ≥` the query's window start (after the positions in `prepared`) are read
    /// from their copies in `fp` instead of the page: keys at word 0, values at word
    /// `fp_values`, each per KV head `sinks` binary16 slots of ceil(dim/2) words (slot t for
    /// sink t), then `fp_ring` slots of `ring_words` (token t at `sinks + t mod fp_ring`):
    /// binary16 copies, or 8-bit ones (`q8_coords` ≠ 0: ceil(dim/4) words of signed bytes of
    /// the rotated vector Π₈x, then the f16 step in the low half of one word).
    sink_end: u32,
    fp_slots: u32,
    /// Where a prepared row holds `scale·q` for scoring those copies (0 for f32 / f16 keys).
    fp_query: u32,
    fp_values: u32,
    /// Accumulators of those copies' values (original domain) at the end of a partial record
    /// (`dim`, or 0 without sinks).
    fp_coords: u32,
    fp_ring: u32,
    /// Words per ring slot (see `sink_end`).
    ring_words: u32,
    /// 8-bit ring copies: where a prepared row holds Π₈·(scale·q), which scores them without
    /// decoding (`q·Π₈ᵀ(s·c) = s·(Π₈q)·c`); their values' accumulators (in Π₈'s coordinates,
    /// turned back once by the finish kernel) are the last `q8_coords` (= dim) of a partial
    /// record; Π₈ is column-major at `q8_rotation` in `tables`. `q8_coords` 0: binary16 ring.
    q8_query: u32,
    q8_coords: u32,
    q8_rotation: u32,
    /// RoPE-aware key centering (`key.centered` = CENTER_ROPE; 0 blocks otherwise): the
    /// prepare kernel writes each row's score correction `q·c_b` of the center blocks
    /// `center_first_block ..+ center_blocks` (every block holding a stored token) to
    /// `prepared[center_bias + row·center_blocks + (b − center_first_block)]`, and every score
    /// of a token in block `b` (`t / CENTER_BLOCK`, `t` its stream index) gets it added.
    center_bias: u32,
    center_first_block: u32,
    center_blocks: u32,
    /// The RoPE planes pair coordinates `(p, p + d/2)` (1) or `(2p, 2p + 1)` (0).
    rope_halves: u32,
    /// Heavy hitters: entries per list of the kept store (`kept`, see score.wgsl; 0: no kept
    /// copies), and the f32 per row of the gathered window weights (`gather`, see attend.wgsl;
    /// 0: nothing gathered).
    kept_capacity: u32,
    gather_stride: u32,
    _pad_a: u32,
    _pad_b: u32,
}

struct DispatchParams {
    grid_x: u32,
    grid_y: u32,
    /// Workgroups that do work (the grid may have a few more).
    total: u32,
    /// First slot of the bound page (pass 1, scores).
    first_slot: u32,
    /// Blocks in the bound page or partials window; tiles for the scores kernel.
    blocks: u32,
    /// Merge: 1 for the first window (ignore the state buffer's old contents).
    init: u32,
    /// Token slots of the bound page, and the u32 index of the key scales, the key positions
    /// and the value scales inside its key and value pages.
    page_tokens: u32,
    k_scales_offset: u32,
    k_positions_offset: u32,
    v_scales_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: AttnParams;
@group(0) @binding(1) var<uniform> launch: DispatchParams;
