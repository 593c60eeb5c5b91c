//! Driving any [`StatefulModel`] over a prompt in chunks.

use tq_cache::attention::AttentionKernel;
use tq_cache::states::ModelCache;

use super::StatefulModel;
use crate::llama::{Logits, ModelError};

/// Feeds `tokens` (the sequence continues at position `cache.len()`) in calls of
/// `chunks[0], chunks[1], …` tokens — the last size repeats, and the final call takes what is
/// left — and returns the logits of every token, `[tokens.len, vocab]`.
///
/// `chunks = [1]` is token-by-token decode; `chunks = [tokens.len()]` is one pass.
pub fn feed_in_chunks<M: StatefulModel>(
    model: &M,
    cache: &mut ModelCache,
    tokens: &[u32],
    chunks: &[usize],
    kernel: AttentionKernel,
    scratch: &mut M::Scratch,
) -> Result<Vec<f32>, ModelError> {
    if chunks.is_empty() || chunks.contains(&0) {
        return Err(ModelError::InvalidCall(
            "chunk sizes must be positive".into(),
        ));
    }
    let start = cache.len();
    let positions: Vec<u32> = (0..(start + tokens.len()) as u32).collect();
    let mut logits = Vec::with_capacity(tokens.len() * model.vocab());
    let (mut done, mut call) = (0, 0);
    while done < tokens.len() {
        let n = chunks[call.min(chunks.len() - 1)].min(tokens.len() - done);
        logits.extend_from_slice(model.forward(
            &tokens[done..done + n],
            &positions[..start + done + n],
            cache,
            kernel,
            Logits::All,
            scratch,
        )?);
        done += n;
        call += 1;
    }
    Ok(logits)
}
