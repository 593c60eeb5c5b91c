//! Decode-attention timing on the first adapter wgpu finds (what `scripts/gpu-check.sh` runs).
//!
//! ```text
//! cargo run --release -p tq-attention-wgpu --example decode_timing -- \
//!     --tokens 1024,16384,131072 --allocations f16,mse-k4v4,k5v4 \
//!     --head-dim 128 --q-heads 32 --kv-heads 8 --steps 20 [--bandwidth-gbs 4800]
//! ```
//!
//! Prints one line per (allocation, tokens): median time per decode step (one query token, all
//! query heads, readback included), bytes of cache read, effective GB/s, and — with
//! `--bandwidth-gbs` — the fraction of the device's memory bandwidth. On a software adapter
//! every line says "correctness run, not a speed figure".

use std::process::ExitCode;
use std::sync::Arc;

use tq_attention_wgpu::bench::{DecodeConfig, decode_step_timing};
use tq_attention_wgpu::{ContextOptions, GpuContext};

struct Args {
    tokens: Vec<usize>,
    allocations: Vec<String>,
    head_dim: usize,
    q_heads: usize,
    kv_heads: usize,
    steps: usize,
    bandwidth: Option<f64>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        tokens: vec![1024, 4096, 16384, 65536, 131072],
        allocations: vec!["f16".into(), "mse-k4v4".into(), "k5v4".into()],
        head_dim: 128,
        q_heads: 32,
        kv_heads: 8,
        steps: 20,
        bandwidth: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--tokens" => {
                args.tokens = value.split(',').map(number).collect::<Result<_, _>>()?;
            }
            "--allocations" => args.allocations = value.split(',').map(String::from).collect(),
            "--head-dim" => args.head_dim = number(&value)?,
            "--q-heads" => args.q_heads = number(&value)?,
            "--kv-heads" => args.kv_heads = number(&value)?,
            "--steps" => args.steps = number(&value)?,
            "--bandwidth-gbs" => {
                args.bandwidth = Some(value.parse().map_err(|e| format!("{flag}: {e}"))?);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("decode_timing: {e}");
            return ExitCode::from(2);
        }
    };
    let ctx = match GpuContext::new(&ContextOptions::default()) {
        Ok(ctx) => Arc::new(ctx),
        Err(e) => {
            eprintln!("decode_timing: {e}");
            return ExitCode::FAILURE;
        }
    };
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {})",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    println!(
        "shape: d = {}, {} query heads, {} KV heads, one query token per step, {} steps (median)",
        args.head_dim, args.q_heads, args.kv_heads, args.steps
    );
    println!(
        "{:<10} {:>8} {:>11} {:>11} {:>13} {:>9} {:>8}",
        "allocation", "tokens", "ms/step", "min ms", "bytes/step", "GB/s", "of peak"
    );
    for &tokens in &args.tokens {
        for allocation in &args.allocations {
            let config = DecodeConfig {
                allocation: allocation.clone(),
                head_dim: args.head_dim,
                q_heads: args.q_heads,
                kv_heads: args.kv_heads,
                tokens,
                steps: args.steps,
                warmup: 3,
            };
            match decode_step_timing(&ctx, &config) {
                Ok(t) => {
                    let peak = args.bandwidth.map_or(String::from("-"), |bw| {
                        format!("{:.1}%", 100.0 * t.gb_per_second / bw)
                    });
                    println!(
                        "{:<10} {:>8} {:>11.4} {:>11.4} {:>13} {:>9.2} {:>8} {}",
                        allocation,
                        tokens,
                        1e3 * t.seconds_per_step,
                        1e3 * t.min_seconds,
                        t.bytes_per_step,
                        t.gb_per_second,
                        peak,
                        t.label()
                    );
                }
                Err(e) => {
                    eprintln!("decode_timing: {allocation} at {tokens} tokens: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}
