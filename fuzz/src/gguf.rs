//! The GGUF target: the whole file model, from the header to a forward pass.

use std::sync::Arc;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_models::causal_lm::CausalLm;
use tq_models::chat::ChatTemplate;
use tq_models::forward_scratch::{ForwardScratch, Logits};
use tq_models::gemma3::Gemma3;
use tq_models::gguf::Gguf;
use tq_models::llama::Llama;
use tq_models::tokenizer::Tokenizer;

/// Parses `data` as a GGUF file and, as far as it is accepted, uses it the way `tq` does:
/// every metadata value and tensor view, the tokenizer, the chat template, and the model its
/// `general.architecture` names, which then runs two tokens through an f16 cache.
///
/// Panics when a tensor view that the reader hands out is not exactly the tensor's size or
/// lies outside the file, when ids an accepted vocabulary encoded do not decode,
/// or when anything on the way panics instead of returning its typed error.
pub fn gguf(data: &[u8]) {
    let Ok(file) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    for (_, value) in file.metadata().iter() {
        std::hint::black_box(value.value_type());
    }
    let data_start = file.data_offset();
    for info in file.tensors() {
        let Ok(view) = file.tensor_data(&info.name) else {
            continue;
        };
        let size = info.byte_size().expect("a tensor view of a sized type");
        assert_eq!(view.data.len() as u64, size, "tensor {:?}", info.name);
        let start = view.data.as_ptr() as usize - file.bytes().as_ptr() as usize;
        assert!(
            start as u64 >= data_start,
            "tensor {:?} before the data",
            info.name
        );
        assert!(start + view.data.len() <= file.bytes().len());
    }
    if let Ok(tokenizer) = Tokenizer::from_gguf(&file) {
        // A vocabulary without a byte token for some character is accepted; encoding such a
        // character is then a typed error.
        if let Ok(ids) = tokenizer.encode("Hi, ß 日本 <|x|>\n") {
            tokenizer.decode(&ids).expect("its own ids decode");
        }
        let _ = tokenizer.decode(&[0, u32::MAX]);
    }
    if let Ok(template) = ChatTemplate::from_gguf(&file) {
        std::hint::black_box(template.prompt(Some("system"), "user"));
    }
    let file = Arc::new(file);
    let model: Box<dyn CausalLm> = match file.metadata().str("general.architecture") {
        Ok("llama") => match Llama::from_gguf(file) {
            Ok(model) => Box::new(model),
            Err(_) => return,
        },
        Ok("gemma3") => match Gemma3::from_gguf(file) {
            Ok(model) => Box::new(model),
            Err(_) => return,
        },
        _ => return,
    };
    crate::on_one_thread(|| run_two_tokens(model.as_ref()));
}

/// Two tokens through a fresh f16 cache: the loader's shape checks must have made every
/// weight product and cache write of a forward pass safe.
fn run_two_tokens(model: &dyn CausalLm) {
    let f16 = Allocation::preset("f16").expect("the f16 preset");
    let Ok(mut cache) = model.new_cache(&f16, 2) else {
        return;
    };
    let vocab = model.dims().vocab as u32;
    let tokens = [0, 1.min(vocab.saturating_sub(1))];
    let mut scratch = ForwardScratch::default();
    let _ = model.forward(
        &tokens,
        &[0, 1],
        &mut cache,
        AttentionKernel::Fused,
        Logits::Last,
        &mut scratch,
    );
}
