//! Layer math every architecture shares: RoPE settings, attention through the cache, the
//! SwiGLU MLP. The numeric pieces themselves (RMSNorm, RoPE, SiLU) are the Llama model's
//! ([`crate::llama::ops`]), so a fix there reaches every architecture.

use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use tq_cache::attention::AttentionShape;

use super::dense::Dense;
use super::scratch::HybridScratch;
use crate::llama::ops::{rope, swiglu};
use crate::llama::{AttentionBackend, ModelError};

/// Rotary position embedding of one layer: its frequency base and how many leading
/// dimensions of each head rotate (partial RoPE leaves the rest position-free).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RopeSettings {
    /// Frequency base θ (10 000 on local layers, up to 10⁶ on global ones).
    pub base: f32,
    /// Rotated dimensions per head (even, at most the head dimension).
    pub dims: usize,
}

/// Head counts, head dimension and RoPE of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AttentionGeometry {
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of every head.
    pub head_dim: usize,
    /// Rotary embedding of this layer.
    pub rope: RopeSettings,
}

impl AttentionGeometry {
    /// Checks the shapes a layer can run with.
    pub fn validate(&self, what: &str) -> Result<(), ModelError> {
        let ok = self.q_heads > 0
            && self.kv_heads > 0
            && self.q_heads.is_multiple_of(self.kv_heads)
            && self.head_dim > 0
            && self.rope.dims.is_multiple_of(2)
            && self.rope.dims <= self.head_dim
            && self.rope.base.is_finite()
            && self.rope.base > 1.0;
        if ok {
            Ok(())
        } else {
            Err(ModelError::Unsupported(format!(
                "{what}: {self:?} (need kv_heads | q_heads, an even rope.dims ≤ head_dim, base > 1)"
            )))
        }
    }
}

/// Applies RoPE to `[n, heads·head_dim]` rows, row `i` at `positions[i]`.
pub fn rope_rows(x: &mut [f32], geometry: &AttentionGeometry, heads: usize, positions: &[u32]) {
    let width = heads * geometry.head_dim;
    for (row, &p) in x.chunks_exact_mut(width).zip(positions) {
        rope(
            row,
            geometry.head_dim,
            geometry.rope.dims,
            geometry.rope.base,
            p,
        );
    }
}

/// Softmax attention whose keys and values live in a [`ModelCache`](tq_cache::states::ModelCache) state: a producer layer
/// projects and stores its own K/V; a KV-sharing layer projects only queries and reads the
/// producer's cache.
#[derive(Clone, Debug)]
pub struct AttentionBlock {
    layer: usize,
    geometry: AttentionGeometry,
    q: Dense,
    /// `None` on a KV-sharing layer.
    kv: Option<(Dense, Dense)>,
    o: Dense,
}

impl AttentionBlock {
    /// Random projections for `layer` (`producer`: it writes its own K/V).
    pub fn random(
        layer: usize,
        embedding: usize,
        geometry: AttentionGeometry,
        producer: bool,
        rng: &mut ChaCha20Rng,
    ) -> Self {
        let (qd, kvd) = (
            geometry.q_heads * geometry.head_dim,
            geometry.kv_heads * geometry.head_dim,
        );
        let q = Dense::random(qd, embedding, rng);
        let kv = producer.then(|| {
            (
                Dense::random(kvd, embedding, rng),
                Dense::random(kvd, embedding, rng),
            )
        });
        let o = Dense::random(embedding, qd, rng);
        Self {
            layer,
            geometry,
            q,
            kv,
            o,
        }
    }

    /// The layer's shape.
    pub fn geometry(&self) -> &AttentionGeometry {
        &self.geometry
    }

    /// `out = O·attention(Q·h, cache ∪ {K·h, V·h})` for the `n` newest tokens (`h` is
    /// `[n, embedding]`, normalized); `positions` covers the whole sequence. The attention runs
    /// on `backend` ([`CpuAttention`](crate::llama::CpuAttention) over a `ModelCache`, or the
    /// GPU's): a producer's through [`AttentionBackend::attend`], a sharer's through
    /// [`AttentionBackend::attend_shared`].
    pub fn forward(
        &self,
        h: &[f32],
        n: usize,
        positions: &[u32],
        backend: &mut dyn AttentionBackend,
        s: &mut HybridScratch,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let g = &self.geometry;
        let new_positions = &positions[positions.len() - n..];
        let (qd, kvd) = (g.q_heads * g.head_dim, g.kv_heads * g.head_dim);
        s.q.resize(n * qd, 0.0);
        s.attn.resize(n * qd, 0.0);
        self.q.matmul(h, n, &mut s.q)?;
        rope_rows(&mut s.q, g, g.q_heads, new_positions);
        let shape = AttentionShape {
            q_heads: g.q_heads,
            scale: 1.0 / (g.head_dim as f32).sqrt(),
        };
        match &self.kv {
            Some((wk, wv)) => {
                s.k.resize(n * kvd, 0.0);
                s.v.resize(n * kvd, 0.0);
                wk.matmul(h, n, &mut s.k)?;
                wv.matmul(h, n, &mut s.v)?;
                rope_rows(&mut s.k, g, g.kv_heads, new_positions);
                backend.attend(self.layer, &s.q, &s.k, &s.v, positions, shape, &mut s.attn)?;
            }
            None => backend.attend_shared(self.layer, &s.q, positions, shape, &mut s.attn)?,
        }
        self.o.matmul(&s.attn, n, out)
    }
}

/// The SwiGLU feed-forward block: `down(silu(gate·h) ⊙ up·h)`.
#[derive(Clone, Debug)]
pub struct SwiGluMlp {
    gate: Dense,
    up: Dense,
    down: Dense,
}

impl SwiGluMlp {
    /// Random projections `embedding → hidden → embedding`.
    pub fn random(embedding: usize, hidden: usize, rng: &mut ChaCha20Rng) -> Self {
        Self {
            gate: Dense::random(hidden, embedding, rng),
            up: Dense::random(hidden, embedding, rng),
            down: Dense::random(embedding, hidden, rng),
        }
    }

    /// `out = MLP(h)` for `n` rows.
    pub fn forward(
        &self,
        h: &[f32],
        n: usize,
        s: &mut HybridScratch,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let hidden = self.gate.rows();
        s.gate.resize(n * hidden, 0.0);
        s.up.resize(n * hidden, 0.0);
        self.gate.matmul(h, n, &mut s.gate)?;
        self.up.matmul(h, n, &mut s.up)?;
        swiglu(&mut s.gate, &s.up);
        self.down.matmul(&s.gate, n, out)
    }
}
