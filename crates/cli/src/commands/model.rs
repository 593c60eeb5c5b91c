//! Commands on a model file: `tq fetch-model`, `tq generate`, `tq inspect`, `tq tokenize`; and
//! the `--model` resolution every model-taking command shares ([`model_path`], [`open_model`]:
//! SmolLM2 by default, Gemma 3 270M by name, or any .gguf file of either architecture).

use std::io::Write;
use std::path::PathBuf;

use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tq_attention_wgpu::{ContextOptions, GpuContext, GpuError};
use tq_cache::allocation::{Allocation, StreamKind};
use tq_cache::states::ModelCache;
use tq_cache::token_store::Growth;
use tq_models::causal_lm::{CausalLm, load_model};
use tq_models::chat::{ChatTemplate, Message, Role};
use tq_models::fetch::{KnownModel, ModelSpec, sha256_hex};
use tq_models::gguf::Gguf;
use tq_models::llama::generate::{generate, generate_with};
use tq_models::llama::{GenerationOptions, Sampler, WgpuAttention};
use tq_models::prompt_cache::{
    PromptCacheHeader, load_prompt_cache, reusable_boundary, reusable_prefix, save_point,
    save_prompt_cache,
};
use tq_models::tokenizer::Tokenizer;

use super::kernel::KernelChoice;
use crate::bench::states::{class_rows, layer_kinds, model_contexts};
use crate::output::table;

/// Why a `--model` choice cannot serve a command.
#[derive(Debug, thiserror::Error)]
pub enum ModelChoiceError {
    /// `tq fetch-model` was given a file.
    #[error("`tq fetch-model --model` takes a model name ({known}), not a file ({path})")]
    NotAName {
        /// The file given.
        path: PathBuf,
        /// The known names.
        known: String,
    },
}

/// The allocations `tq demo` and `tq bench e2e` compare by default on a model with
/// sliding-window layers (Gemma 3): f16, then only the global layers compressed — with the
/// preset that finds every pass key f16 finds at 16K and 32K, and with the recommended 4.25-bit
/// one. (Compressing the sliding rings too saves little: they are bounded by the window.)
pub(crate) const SLIDING_MODEL_ALLOCS: [&str; 3] = ["f16", "k6v5-global", "rec4.25-global"];

/// Whether `model` has sliding-window layers, the criterion for [`SLIDING_MODEL_ALLOCS`].
pub(crate) fn has_sliding_layers(model: &dyn CausalLm) -> bool {
    model
        .layer_kinds()
        .contains(&tq_cache::allocation::LayerKind::Sliding)
}

/// The model file of a command: `--model smollm2|gemma3-270m|FILE.gguf`, the reference model
/// (SmolLM2, fetched on first use) when absent.
pub(crate) fn model_path(model: &Option<ModelSpec>) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let spec = model.clone().unwrap_or_default();
    Ok(spec.resolve(|line| eprintln!("{line}"))?)
}

/// The model of a command ([`model_path`], then [`load_model`], which picks the
/// implementation from the file's `general.architecture`: Llama/SmolLM2 or Gemma 3).
pub(crate) fn open_model(
    model: &Option<ModelSpec>,
) -> Result<Box<dyn CausalLm>, Box<dyn std::error::Error>> {
    Ok(load_model(model_path(model)?)?)
}

/// Arguments of `tq fetch-model`.
#[derive(Args, Debug)]
pub struct FetchArgs {
    /// The model: `smollm2` (the reference model) or `gemma3-270m`.
    #[arg(long, default_value = "smollm2")]
    model: ModelSpec,
}

/// Runs `tq fetch-model`: prints the path of the verified file.
pub fn fetch(args: &FetchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let model = match &args.model {
        ModelSpec::Known(model) => *model,
        ModelSpec::File(path) => {
            return Err(ModelChoiceError::NotAName {
                path: path.clone(),
                known: KnownModel::names(),
            }
            .into());
        }
    };
    let started = std::time::Instant::now();
    let path = model.ensure(|line| eprintln!("{line}"))?;
    eprintln!("{model}: {:.1} s", started.elapsed().as_secs_f64());
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
    /// Attention backend: `cpu` (the cache crate's kernels, see --kernel) or `wgpu` (the GPU
    /// kernels of `tq-attention-wgpu` on the first adapter wgpu finds; `WGPU_BACKEND` picks
    /// the API).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// Attention kernel of the CPU backend: `fused` (any allocation) or `llamacpp` (the f16
    /// kernel and model numerics of the reference engine, for token-for-token parity with it;
    /// f16 caches only).
    #[arg(long, value_enum, default_value_t = KernelChoice::Fused)]
    kernel: KernelChoice,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    /// Print JSON (keys: text, tokens, prefill_tokens_per_s, decode_tokens_per_s, cache_bytes;
    /// with --prompt-cache also prompt_cache_reused and time_to_first_token_s).
    #[arg(long)]
    json: bool,
    /// Save the cache after the prompt to this file (with the model file's SHA-256, the
    /// allocation and the token ids), and start from it when a later prompt begins with the
    /// cached tokens: the cache is rewound to the common prefix and only the rest is
    /// prefilled. A cache from another model or allocation, or a damaged one, is reported on
    /// stderr and ignored (the run recomputes). CPU backend only.
    #[arg(long)]
    prompt_cache: Option<std::path::PathBuf>,
    #[command(flatten)]
    budget: super::limits::CacheBudgetArgs,
}

/// Where `tq generate` runs attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU cache, with the kernel --kernel picks.
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
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_reused: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_to_first_token_s: Option<f64>,
}

/// The CPU cache of a `--prompt-cache` run: the saved one rewound to what this prompt shares
/// with it, or a fresh one; returns it with the number of tokens it already holds. Anything
/// wrong with the file is reported and ignored.
fn warm_cache(
    path: &std::path::Path,
    model: &dyn CausalLm,
    model_sha256: &str,
    allocation: &Allocation,
    prompt: &[u32],
    first_chunk: usize,
) -> Result<(ModelCache, usize), Box<dyn std::error::Error>> {
    // Growing pages rather than a static capacity: a saved cache must fit any later prompt.
    let fresh = ModelCache::with_allocation(
        model.state_specs(Growth::Doubling { initial: 256 }),
        allocation,
    )?;
    if !path.exists() {
        return Ok((fresh, 0));
    }
    match load_prompt_cache(path, model_sha256, &allocation.name, &fresh) {
        Ok((header, mut cache)) => {
            // Heavy hitters: whole, at the chunk boundary it was saved on, or not at all.
            let keep = if fresh.keeps_heavy_hitters() {
                reusable_boundary(&header.tokens, prompt, first_chunk)
            } else {
                reusable_prefix(&header.tokens, prompt, first_chunk)
            };
            if keep == 0 {
                eprintln!(
                    "[prompt cache {}: no usable common prefix with this prompt; recomputing]",
                    path.display()
                );
                return Ok((fresh, 0));
            }
            if let Err(e) = cache.truncate(keep) {
                eprintln!(
                    "[prompt cache {}: cannot rewind to the common prefix ({e}); recomputing]",
                    path.display()
                );
                return Ok((fresh, 0));
            }
            eprintln!(
                "[prompt cache {}: reusing {keep} of {} cached tokens]",
                path.display(),
                header.tokens.len()
            );
            Ok((cache, keep))
        }
        Err(e) => {
            eprintln!(
                "[prompt cache {} ignored: {e}; recomputing]",
                path.display()
            );
            Ok((fresh, 0))
        }
    }
}

/// Runs `tq generate`.
pub fn generate_text(args: &GenerateArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.prompt_cache.is_some() && args.backend == Backend::Wgpu {
        return Err("--prompt-cache needs the CPU backend (--backend cpu)".into());
    }
    if args.kernel != KernelChoice::Fused && args.backend == Backend::Wgpu {
        return Err(format!(
            "--kernel {} is a CPU kernel: leave out --kernel with --backend wgpu, or use \
             --backend cpu",
            args.kernel.name()
        )
        .into());
    }
    // The adapter first: a missing GPU fails before the model is mapped.
    let gpu = match args.backend {
        Backend::Cpu => None,
        Backend::Wgpu => Some(open_gpu()?),
    };
    let mut model = open_model(&args.model)?;
    let kernel = args.kernel.apply(model.as_mut());
    let model = &*model;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let allocation = Allocation::load(&args.alloc)?;
    args.kernel.check(model, &allocation)?;
    let text = if args.chat {
        ChatTemplate::from_gguf(model.file())
            .map_err(|e| {
                format!(
                    "--chat needs a ChatML chat template in the model file ({e}); a base model \
                     such as gemma3-270m has none: give the prompt as plain text without --chat"
                )
            })?
            .render(&[Message::new(Role::User, args.prompt.clone())], true)
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text)?;
    super::limits::check_run(
        model,
        [&allocation],
        prompt.len() + args.max_tokens,
        "the prompt plus --max-tokens",
        &args.budget,
    )?;
    let capacity = prompt.len() + args.max_tokens;
    let stop: Vec<u32> = ["<|im_end|>", "<|endoftext|>", "<end_of_turn>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .chain(tokenizer.eos_id())
        .collect();
    let options = GenerationOptions {
        max_tokens: args.max_tokens,
        stop_tokens: stop,
        kernel,
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
    let started = Instant::now();
    let first_token = std::cell::Cell::new(None::<f64>);
    let on_token = |token| {
        if first_token.get().is_none() {
            first_token.set(Some(started.elapsed().as_secs_f64()));
        }
        on_token(token)
    };
    let mut reused = None;
    let (out, cache_bytes) = match (&gpu, &args.prompt_cache) {
        (_, Some(path)) => {
            let model_sha256 = sha256_hex(model.file().bytes());
            // The first batch a cold run calibrates on: the chunk `generate` really runs.
            let first_chunk = options.prefill_chunk.clamp(1, model.max_chunk());
            let (mut cache, keep) = warm_cache(
                path,
                model,
                &model_sha256,
                &allocation,
                &prompt,
                first_chunk,
            )?;
            reused = Some(keep);
            // Everything but the last prompt token, so the saved cache serves this very prompt
            // again (its last token must run to give the first new token) — with heavy hitters
            // the chunks a cold run runs before it, so the rest runs as its last chunk
            // (`save_point`). A greedy sampler of its own: the user's sampler state must not
            // depend on whether the cache was warm.
            let save_at =
                save_point(prompt.len(), first_chunk, cache.keeps_heavy_hitters()).max(keep);
            if keep < save_at {
                let prefill = GenerationOptions {
                    max_tokens: 0,
                    ..options.clone()
                };
                generate(
                    model,
                    &mut cache,
                    &prompt[keep..save_at],
                    &mut Sampler::new(0.0, 1.0, 0),
                    &prefill,
                    |_| {},
                )?;
            }
            if save_at > 0 {
                let header = PromptCacheHeader {
                    model_sha256,
                    allocation: allocation.name.clone(),
                    tokens: prompt[..save_at].to_vec(),
                };
                if let Err(e) = save_prompt_cache(path, &header, &cache) {
                    eprintln!("[prompt cache {} not saved: {e}]", path.display());
                }
            }
            let out = generate(
                model,
                &mut cache,
                &prompt[save_at..],
                &mut sampler,
                &options,
                on_token,
            )?;
            let bytes = cache.memory().iter().map(|m| m.allocated_bytes).sum();
            (out, bytes)
        }
        (None, None) => {
            let mut cache = model.new_cache(&allocation, capacity)?;
            let out = generate(model, &mut cache, &prompt, &mut sampler, &options, on_token)?;
            let bytes = cache.memory().iter().map(|m| m.allocated_bytes).sum();
            (out, bytes)
        }
        (Some(ctx), None) => {
            // The CPU cache of this allocation is the template of the GPU caches (codecs,
            // seeds, ring sizes); what the GPU kernels do not implement is refused here.
            let template = model.new_cache(&allocation, 1)?;
            let mut backend = WgpuAttention::new(ctx, &template)?;
            let out = generate_with(
                model,
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
            prompt_cache_reused: reused,
            time_to_first_token_s: reused.and(first_token.get()),
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!(
            "\n[{}, {} new at {:.1} tok/s, cache {} bytes ({}), {} attention]",
            match reused {
                // Only the prompt's tail ran in the timed call (its last token; with heavy
                // hitters its last chunk): the cache line below says what was reused.
                Some(_) => format!("{} prompt tokens", prompt.len()),
                None => format!(
                    "{} prompt tokens at {:.1} tok/s",
                    out.prompt_tokens,
                    out.prefill_tokens_per_s()
                ),
            },
            out.tokens.len(),
            out.decode_tokens_per_s(),
            cache_bytes,
            allocation.name,
            match args.backend {
                Backend::Cpu => format!("cpu {}", args.kernel.name()),
                Backend::Wgpu => "wgpu".to_string(),
            }
        );
        if let (Some(keep), Some(ttft)) = (reused, first_token.get()) {
            eprintln!(
                "[prompt cache: {} prompt tokens, {keep} reused, {} prefilled; first token \
                 after {ttft:.2} s]",
                prompt.len(),
                prompt.len() - keep
            );
        }
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
    /// The GGUF file (or use --model).
    file: Option<PathBuf>,
    /// The model: `smollm2` (the default), `gemma3-270m` (both fetched on first use) or a
    /// .gguf file.
    #[arg(long, conflicts_with = "file")]
    model: Option<ModelSpec>,
}

/// Runs `tq inspect`.
pub fn inspect(args: &InspectArgs) -> Result<(), Box<dyn std::error::Error>> {
    let path = match (&args.file, &args.model) {
        (Some(file), _) => file.clone(),
        (None, model) => model
            .clone()
            .unwrap_or_default()
            .resolve(|line| eprintln!("{line}"))?,
    };
    let gguf = Gguf::open(&path)?;
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
    let model = match load_model(&path) {
        Ok(model) => model,
        Err(e) => {
            println!("\ncache bytes per token: not shown ({e})");
            return Ok(());
        }
    };
    let dims = model.dims();
    println!(
        "\n{}: {} layers × {} KV heads × head dim {}; {}\n\
         cache bytes per token per allocation, every layer storing the token:",
        model.architecture(),
        dims.layers,
        dims.kv_heads,
        dims.head_dim,
        layer_kinds(&model.state_specs(Growth::Static { capacity: 1 })),
    );
    let shape = dims.model_shape();
    let kinds = model.layer_kinds();
    // f16 keys and values of one token in every layer (positions left out, as in the plans).
    let f16_per_token = model.f16_cache_bytes(1);
    let mut rows = Vec::new();
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name)?;
        let mut bytes = 0usize;
        for plan in allocation.plans_in(&shape, &kinds) {
            bytes += plan?.bytes_per_token();
        }
        let bits_k = allocation.bits_per_value_in(&shape, &kinds, StreamKind::Key)?;
        let bits_v = allocation.bits_per_value_in(&shape, &kinds, StreamKind::Value)?;
        rows.push(vec![
            name.to_string(),
            format!("{bits_k:.3}"),
            format!("{bits_v:.3}"),
            bytes.to_string(),
            format!("{:.2}×", f16_per_token as f64 / bytes as f64),
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
    if has_sliding_layers(model.as_ref()) {
        println!("\n{}", sliding_global_table(model.as_ref())?);
    }
    Ok(())
}

/// A model with sliding layers: per allocation, the bytes per token of the sliding and the
/// global layers (all of each kind, positions included), and the whole cache at 4K, 16K and
/// 32K tokens against f16 — the rows `tq bench states --model` gives, by formula.
fn sliding_global_table(model: &dyn CausalLm) -> Result<String, Box<dyn std::error::Error>> {
    let contexts = model_contexts(model.dims().context_length);
    let mut names: Vec<&str> = vec!["f16"];
    names.extend(Allocation::preset_names().filter(|n| *n != "f16"));
    let mut f16_totals: Vec<usize> = Vec::new();
    let mut rows = Vec::new();
    let mut ring = 0;
    for name in names {
        let allocation = Allocation::preset(name)?;
        // A one-token cache is a template: ring states are allocated in full, growing ones
        // are counted at each context by the formula.
        let template = model.new_cache(&allocation, 1)?;
        let mut row = vec![name.to_string()];
        let (mut sliding, mut global) = (0, 0);
        let mut totals = Vec::new();
        for &context in &contexts {
            let classes = class_rows(model.architecture(), &template, name, context);
            for c in &classes {
                match c.class {
                    "sliding-kv" => {
                        sliding = c.class_bytes_per_token;
                        ring = ring.max(c.slots);
                    }
                    "full-kv" => global = c.class_bytes_per_token,
                    _ => {}
                }
            }
            totals.push(classes.iter().map(|c| c.formula_bytes).sum::<usize>());
        }
        if name == "f16" {
            f16_totals = totals.clone();
        }
        row.push(sliding.to_string());
        row.push(global.to_string());
        for (total, f16) in totals.iter().zip(&f16_totals) {
            row.push(format!("{:.2}", *total as f64 / 1_048_576.0));
            row.push(format!("{:.2}×", *f16 as f64 / *total as f64));
        }
        rows.push(row);
    }
    let mut header = vec![
        "allocation".to_string(),
        "sliding B/token".to_string(),
        "global B/token".to_string(),
    ];
    for context in &contexts {
        header.push(format!("MiB at {}K", context / 1024));
        header.push("vs f16".to_string());
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    Ok(format!(
        "Sliding and global layers: bytes per token of all sliding layers together (each keeps \
         at most its ring of {ring} slots, so their bytes stop growing there) and of all global \
         layers (every token), positions included; the whole cache at {}:\n{}",
        contexts
            .iter()
            .map(|c| format!("{c}"))
            .collect::<Vec<_>>()
            .join(", "),
        table(&header, &rows)
    ))
}
