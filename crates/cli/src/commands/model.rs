//! Commands on the reference model: `tq fetch-model`, `tq generate`, `tq inspect`.

use std::io::Write;
use std::path::PathBuf;

use std::sync::Arc;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tq_attention_wgpu::{ContextOptions, GpuContext, GpuError};
use tq_cache::allocation::{Allocation, ModelShape, StreamKind};
use tq_cache::attention::AttentionKernel;
use tq_models::chat::{ChatTemplate, Message, Role};
use tq_models::fetch::ensure_reference_model;
use tq_models::gguf::Gguf;
use tq_models::llama::generate::{generate, generate_with};
use tq_models::llama::{GenerationOptions, Llama, LlamaConfig, Sampler, WgpuAttention};
use tq_models::tokenizer::Tokenizer;

use crate::output::table;

/// The model file: `--model PATH`, else the reference model (fetched on first use).
fn model_path(model: &Option<PathBuf>) -> Result<PathBuf, Box<dyn std::error::Error>> {
    match model {
        Some(path) => Ok(path.clone()),
        None => Ok(ensure_reference_model(|line| eprintln!("{line}"))?),
    }
}

/// Runs `tq fetch-model`.
pub fn fetch() -> Result<(), Box<dyn std::error::Error>> {
    let path = ensure_reference_model(|line| eprintln!("{line}"))?;
    println!("{}", path.display());
    Ok(())
}

/// Arguments of `tq generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt (raw text; control tokens such as `<|im_start|>` are parsed as special).
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// New tokens at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// A preset name or a TOML allocation file.
    #[arg(long, default_value = "f16")]
    alloc: String,
    /// 0 for greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus mass for sampling.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Attention backend: `cpu` (the cache crate's fused kernel) or `wgpu` (the GPU kernels of
    /// `tq-attention-wgpu` on the first adapter wgpu finds; `WGPU_BACKEND` picks the API).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// A GGUF file instead of the reference model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Print JSON (keys: text, tokens, prefill_tokens_per_s, decode_tokens_per_s, cache_bytes).
    #[arg(long)]
    json: bool,
}

/// Where `tq generate` runs attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU cache and its fused kernel.
    Cpu,
    /// The GPU kernels through wgpu.
    Wgpu,
}

#[derive(Serialize)]
struct GenerateReport {
    text: String,
    tokens: Vec<u32>,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    cache_bytes: usize,
}

/// Runs `tq generate`.
pub fn generate_text(args: &GenerateArgs) -> Result<(), Box<dyn std::error::Error>> {
    // The adapter first: a missing GPU fails before the model is mapped.
    let gpu = match args.backend {
        Backend::Cpu => None,
        Backend::Wgpu => Some(open_gpu()?),
    };
    let model = Llama::load(model_path(&args.model)?)?;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let allocation = Allocation::load(&args.alloc)?;
    let text = if args.chat {
        ChatTemplate::from_gguf(model.file())
            .unwrap_or_else(|_| ChatTemplate::smollm2())
            .render(&[Message::new(Role::User, args.prompt.clone())], true)
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text)?;
    let capacity = (prompt.len() + args.max_tokens).min(model.config.context_length);
    let stop: Vec<u32> = ["<|im_end|>", "<|endoftext|>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .chain(tokenizer.eos_id())
        .collect();
    let options = GenerationOptions {
        max_tokens: args.max_tokens,
        stop_tokens: stop,
        kernel: AttentionKernel::Fused,
        ..GenerationOptions::default()
    };
    let mut sampler = Sampler::new(args.temperature, args.top_p, args.seed);
    let stream = !args.json;
    let on_token = |token| {
        if stream && let Ok(piece) = tokenizer.decode(&[token]) {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }
    };
    let (out, cache_bytes) = match &gpu {
        None => {
            let mut cache = model.new_cache(&allocation, capacity)?;
            let out = generate(
                &model,
                &mut cache,
                &prompt,
                &mut sampler,
                &options,
                on_token,
            )?;
            let bytes = cache.memory().iter().map(|m| m.allocated_bytes).sum();
            (out, bytes)
        }
        Some(ctx) => {
            let mut backend = WgpuAttention::for_model(ctx, &model, &allocation)?;
            let out = generate_with(
                &model,
                &mut backend,
                0,
                &prompt,
                &mut sampler,
                &options,
                on_token,
            )?;
            (out, backend.device_bytes() as usize)
        }
    };
    if args.json {
        let report = GenerateReport {
            text: tokenizer.decode(&out.tokens)?,
            prefill_tokens_per_s: out.prefill_tokens_per_s(),
            decode_tokens_per_s: out.decode_tokens_per_s(),
            tokens: out.tokens,
            cache_bytes,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!(
            "\n[{} prompt tokens at {:.1} tok/s, {} new at {:.1} tok/s, cache {} bytes ({}), {} attention]",
            out.prompt_tokens,
            out.prefill_tokens_per_s(),
            out.tokens.len(),
            out.decode_tokens_per_s(),
            cache_bytes,
            allocation.name,
            match args.backend {
                Backend::Cpu => "cpu",
                Backend::Wgpu => "wgpu",
            }
        );
    }
    Ok(())
}

/// Opens the first GPU adapter wgpu finds and compiles the kernels. A missing adapter is an
/// error that says what to install; a software adapter (lavapipe, WARP) is accepted with a
/// note on stderr, since it runs the kernels correctly but far slower than the CPU backend.
pub fn open_gpu() -> Result<Arc<GpuContext>, Box<dyn std::error::Error>> {
    let ctx = GpuContext::new(&ContextOptions::default()).map_err(|e| match e {
        GpuError::NoAdapter(message) => format!(
            "--backend wgpu: no GPU adapter found ({message}); install a Vulkan driver \
             (mesa-vulkan-drivers provides the software one, lavapipe) or use --backend cpu"
        ),
        other => format!("--backend wgpu: {other}"),
    })?;
    let info = ctx.adapter_info();
    if ctx.is_software() {
        eprintln!(
            "note: the only GPU adapter is a CPU (software) device, {} ({:?}): the wgpu backend \
             runs correctly but slowly; --backend cpu is faster on this machine",
            info.name, info.backend
        );
    } else {
        eprintln!("wgpu adapter: {} ({:?})", info.name, info.backend);
    }
    Ok(Arc::new(ctx))
}

/// Arguments of `tq inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The GGUF file.
    file: PathBuf,
}

/// Runs `tq inspect`.
pub fn inspect(args: &InspectArgs) -> Result<(), Box<dyn std::error::Error>> {
    let gguf = Gguf::open(&args.file)?;
    println!(
        "GGUF v{}, {} metadata keys, {} tensors",
        gguf.version(),
        gguf.metadata().len(),
        gguf.tensors().len()
    );
    let mut rows = Vec::new();
    for (key, value) in gguf.metadata().iter() {
        let shown = format!("{value:?}");
        let shown: String = shown.chars().take(80).collect();
        rows.push(vec![key.to_string(), shown]);
    }
    println!("{}", table(&["metadata key", "value (truncated)"], &rows));
    let mut counts = std::collections::BTreeMap::new();
    for t in gguf.tensors() {
        *counts.entry(format!("{:?}", t.ggml_type)).or_insert(0usize) += 1;
    }
    println!("\ntensor types: {counts:?}");
    let Ok(config) = LlamaConfig::from_gguf(&gguf) else {
        return Ok(());
    };
    println!(
        "\n{} layers × {} KV heads × head dim {}: cache bytes per token per allocation",
        config.layers, config.kv_heads, config.head_dim
    );
    let shape = ModelShape {
        num_layers: config.layers,
        num_kv_heads: config.kv_heads,
        head_dim: config.head_dim,
    };
    let mut rows = Vec::new();
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name)?;
        let mut bytes = 0usize;
        for plan in allocation.plans(&shape) {
            bytes += plan?.bytes_per_token();
        }
        let bits_k = allocation.bits_per_value(&shape, StreamKind::Key)?;
        let bits_v = allocation.bits_per_value(&shape, StreamKind::Value)?;
        rows.push(vec![
            name.to_string(),
            format!("{bits_k:.3}"),
            format!("{bits_v:.3}"),
            bytes.to_string(),
            format!(
                "{:.2}×",
                config.f16_cache_bytes_per_token() as f64 / bytes as f64
            ),
        ]);
    }
    println!(
        "{}",
        table(
            &[
                "allocation",
                "K bits/value",
                "V bits/value",
                "bytes/token (formula)",
                "vs f16"
            ],
            &rows
        )
    );
    Ok(())
}
