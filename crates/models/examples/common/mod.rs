//! What the research probes share: run the first tokens of a text through a model with an f16
//! cache, in prefill pieces of 256, and record every layer's queries, keys and values.

use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_models::llama::{AttentionBackend, CpuAttention, Llama, ModelError};
use tq_models::llama::{ForwardScratch, Logits};
use tq_models::tokenizer::Tokenizer;

/// Per layer, the queries `[tokens, heads·d]`, keys and values `[tokens, kv_heads·d]`.
#[derive(Default)]
pub struct Recording {
    pub q: Vec<Vec<f32>>,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

struct Recorder<'c> {
    inner: CpuAttention<'c>,
    recording: Recording,
}

impl AttentionBackend for Recorder<'_> {
    fn attend(
        &mut self,
        layer: usize,
        queries: &[f32],
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let r = &mut self.recording;
        if r.q.len() <= layer {
            for x in [&mut r.q, &mut r.k, &mut r.v] {
                x.resize(layer + 1, Vec::new());
            }
        }
        r.q[layer].extend_from_slice(queries);
        r.k[layer].extend_from_slice(keys);
        r.v[layer].extend_from_slice(values);
        self.inner
            .attend(layer, queries, keys, values, positions, shape, out)
    }
}

/// Runs the first `n` tokens of `text` (BOS first) through `model`; returns the recording.
pub fn record(
    model: &Llama,
    text: &str,
    n: usize,
) -> Result<Recording, Box<dyn std::error::Error>> {
    let tok = Tokenizer::from_gguf(model.file())?;
    let mut ids = tok.encode(text)?;
    ids.truncate(n);
    if let Some(b) = tok.bos_id() {
        ids[0] = b;
    }
    let n = ids.len();
    let mut cache = model.new_cache(&Allocation::preset("f16")?, n)?;
    let mut scratch = ForwardScratch::default();
    let mut rec = Recorder {
        inner: CpuAttention {
            cache: &mut cache,
            kernel: AttentionKernel::default(),
        },
        recording: Recording::default(),
    };
    let positions: Vec<u32> = (0..n as u32).collect();
    for start in (0..n).step_by(256) {
        let end = (start + 256).min(n);
        model.forward_with(
            &ids[start..end],
            &positions[..end],
            &mut rec,
            Logits::Last,
            &mut scratch,
        )?;
    }
    Ok(rec.recording)
}
