//! The pre-norm residual stack every architecture here is: embed, then per layer
//! `x += mixer(rmsnorm(x))` and `x += mlp(rmsnorm(x))`, then a final norm and the output
//! projection. Architectures differ only in their mixers (attention over a growing, sliding or
//! shared KV state, or a recurrent layer over fixed states) and in the states they declare.

use tq_cache::attention::AttentionKernel;
use tq_cache::states::ModelCache;

use super::delta_net::DeltaNetBlock;
use super::dense::Dense;
use super::layers::{AttentionBlock, SwiGluMlp};
use super::scratch::HybridScratch;
use crate::llama::ops::rms_norm;
use crate::llama::{AttentionBackend, CpuAttention, Logits, ModelError};

/// What mixes information across tokens in one layer.
#[derive(Clone, Debug)]
pub enum Mixer {
    /// Softmax attention over a KV state (own or shared).
    Attention(AttentionBlock),
    /// A gated-DeltaNet layer over a conv and a recurrent state.
    DeltaNet(DeltaNetBlock),
}

/// One residual block.
#[derive(Clone, Debug)]
pub struct Block {
    /// RMSNorm weight before the mixer.
    pub mixer_norm: Vec<f32>,
    /// The token mixer.
    pub mixer: Mixer,
    /// RMSNorm weight before the MLP.
    pub mlp_norm: Vec<f32>,
    /// The feed-forward block.
    pub mlp: SwiGluMlp,
}

/// Embedding, blocks, output head and the state names the blocks expect.
#[derive(Clone, Debug)]
pub struct Stack {
    /// `[vocab, embedding]`: row `t` is token `t`'s embedding.
    pub embed: Dense,
    /// The layers, in order.
    pub blocks: Vec<Block>,
    /// Final RMSNorm weight.
    pub output_norm: Vec<f32>,
    /// `[vocab, embedding]` output projection.
    pub output: Dense,
    /// RMSNorm ε.
    pub rms_eps: f32,
    /// Names of the states a cache must declare, in order (checked before anything runs).
    pub state_names: Vec<String>,
}

/// Where the mixers find their states: a [`ModelCache`] (attention on the CPU with a
/// kernel, recurrent layers' fixed states), or an attention backend alone.
enum Mixing<'a> {
    Cache(&'a mut ModelCache, AttentionKernel),
    Backend(&'a mut dyn AttentionBackend),
}

fn resize(buffer: &mut Vec<f32>, len: usize) {
    buffer.resize(len, 0.0);
}

impl Stack {
    /// A stack over `blocks` with unit output-norm weights, expecting the states `specs`
    /// declares (the same list a cache for this model is built from).
    pub fn new(
        embed: Dense,
        blocks: Vec<Block>,
        output: Dense,
        rms_eps: f32,
        specs: Vec<tq_cache::states::StateSpec>,
    ) -> Self {
        let output_norm = vec![1.0; embed.cols()];
        Self {
            embed,
            blocks,
            output_norm,
            output,
            rms_eps,
            state_names: specs.into_iter().map(|s| s.name).collect(),
        }
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.embed.rows()
    }

    /// Runs `tokens` at the end of the sequence whose positions are `positions`
    /// (`offset = positions.len − tokens.len` tokens are already in `cache`) and returns the
    /// logits (`[vocab]` for [`Logits::Last`], `[tokens.len, vocab]` for [`Logits::All`]).
    ///
    /// Everything that can be checked up front is (token ids, the cache's states, the offset),
    /// so a refused call leaves the fixed states untouched.
    pub fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        self.check_call(tokens, positions)?;
        if !cache
            .specs()
            .iter()
            .map(|s| &s.name)
            .eq(self.state_names.iter())
        {
            return Err(ModelError::InvalidCall(
                "the cache was not built from this model's state specs".into(),
            ));
        }
        let offset = positions.len() - tokens.len();
        if offset != cache.len() {
            return Err(tq_cache::CacheError::OffsetMismatch {
                cached: cache.len(),
                offset,
            }
            .into());
        }
        self.run(
            tokens,
            positions,
            Mixing::Cache(cache, kernel),
            logits,
            scratch,
        )
    }

    /// [`forward`](Self::forward) with the attention on `backend` (the GPU's, say): for a stack
    /// of attention layers only — a recurrent layer's fixed states live in a `ModelCache`
    /// (`InvalidCall`). The backend checks each layer's offset.
    pub fn forward_with<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        backend: &mut dyn AttentionBackend,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        self.check_call(tokens, positions)?;
        if self
            .blocks
            .iter()
            .any(|b| matches!(b.mixer, Mixer::DeltaNet(_)))
        {
            return Err(ModelError::InvalidCall(
                "a stack with recurrent layers runs over a ModelCache (their fixed states)".into(),
            ));
        }
        self.run(tokens, positions, Mixing::Backend(backend), logits, scratch)
    }

    /// The checks of a call that need no cache: tokens, positions, token ids, increasing
    /// positions.
    fn check_call(&self, tokens: &[u32], positions: &[u32]) -> Result<(), ModelError> {
        let n = tokens.len();
        if n == 0 || positions.len() < n {
            return Err(ModelError::InvalidCall(format!(
                "{n} tokens with {} positions",
                positions.len()
            )));
        }
        let vocab = self.vocab();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        if positions[positions.len() - n..]
            .windows(2)
            .any(|w| w[1] <= w[0])
        {
            return Err(ModelError::InvalidCall(
                "positions must increase".to_string(),
            ));
        }
        Ok(())
    }

    /// The layers, over checked inputs.
    fn run<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        mut mixing: Mixing<'_>,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        let n = tokens.len();
        let vocab = self.vocab();
        let e = self.embed.cols();
        let s = scratch;
        resize(&mut s.x, n * e);
        resize(&mut s.h, n * e);
        resize(&mut s.delta, n * e);
        for (row, &t) in s.x.chunks_exact_mut(e).zip(tokens) {
            row.copy_from_slice(self.embed.row(t as usize));
        }
        for block in &self.blocks {
            for (x, h) in s.x.chunks_exact(e).zip(s.h.chunks_exact_mut(e)) {
                rms_norm(x, &block.mixer_norm, self.rms_eps, h);
            }
            // The mixer reads `h` and writes `delta`; both are moved out of the scratch for the
            // call so the mixer may use the rest of it.
            let (h, mut delta) = (std::mem::take(&mut s.h), std::mem::take(&mut s.delta));
            let result = match (&block.mixer, &mut mixing) {
                (Mixer::Attention(a), Mixing::Cache(cache, kernel)) => {
                    let mut cpu = CpuAttention {
                        cache,
                        kernel: *kernel,
                    };
                    a.forward(&h, n, positions, &mut cpu, s, &mut delta)
                }
                (Mixer::Attention(a), Mixing::Backend(backend)) => {
                    a.forward(&h, n, positions, *backend, s, &mut delta)
                }
                (Mixer::DeltaNet(d), Mixing::Cache(cache, _)) => {
                    d.forward(&h, n, cache, s, &mut delta)
                }
                (Mixer::DeltaNet(_), Mixing::Backend(_)) => Err(ModelError::InvalidCall(
                    "a recurrent layer needs its fixed states (a ModelCache)".into(),
                )),
            };
            (s.h, s.delta) = (h, delta);
            result?;
            for (x, d) in s.x.iter_mut().zip(&s.delta) {
                *x += d;
            }
            for (x, h) in s.x.chunks_exact(e).zip(s.h.chunks_exact_mut(e)) {
                rms_norm(x, &block.mlp_norm, self.rms_eps, h);
            }
            let (h, mut delta) = (std::mem::take(&mut s.h), std::mem::take(&mut s.delta));
            let result = block.mlp.forward(&h, n, s, &mut delta);
            (s.h, s.delta) = (h, delta);
            result?;
            for (x, d) in s.x.iter_mut().zip(&s.delta) {
                *x += d;
            }
        }
        let rows = match logits {
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        let count = rows.len();
        for (i, t) in rows.enumerate() {
            rms_norm(
                &s.x[t * e..(t + 1) * e],
                &self.output_norm,
                self.rms_eps,
                &mut s.h[i * e..(i + 1) * e],
            );
        }
        resize(&mut s.logits, count * vocab);
        self.output
            .matmul(&s.h[..count * e], count, &mut s.logits)?;
        Ok(&s.logits)
    }
}
