//! `--kernel fused|llamacpp`: the attention kernel of a model run, shared by `tq generate` and
//! `tq perplexity`.

use clap::ValueEnum;
use tq_cache::TokenCodec;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_cache::states::StateKind;
use tq_models::causal_lm::CausalLm;

/// Which attention kernel (and model numerics) a run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum KernelChoice {
    /// The cache crate's fused kernel (scores packed codes; f32 sums), with the model's
    /// numerics as loaded.
    #[default]
    Fused,
    /// The f16 kernel that rounds like the reference engine (llama.cpp) for this model — its
    /// AVX2 build for SmolLM2, its AVX512-FP16 build for Gemma 3 — with the model's elementwise
    /// numerics switched to that engine's (Gemma 3: the f16 GELU table, fused RoPE, its batch-dependent K-quant orders). f16 caches
    /// only: for parity with that engine's outputs.
    Llamacpp,
}

impl KernelChoice {
    /// Prepares `model` for this choice and returns the attention kernel to run it with:
    /// `llamacpp` switches the model's numerics to the reference engine's and picks
    /// [`CausalLm::llamacpp_kernel`]; `fused` leaves the model as loaded.
    pub fn apply(self, model: &mut dyn CausalLm) -> AttentionKernel {
        match self {
            KernelChoice::Fused => AttentionKernel::Fused,
            KernelChoice::Llamacpp => {
                model.set_llamacpp_numerics(true);
                model.llamacpp_kernel()
            }
        }
    }

    /// The name `--kernel` takes.
    pub fn name(self) -> &'static str {
        match self {
            KernelChoice::Fused => "fused",
            KernelChoice::Llamacpp => "llamacpp",
        }
    }
}

/// `--kernel llamacpp` over an allocation it cannot read.
#[derive(Debug, thiserror::Error)]
#[error(
    "--kernel llamacpp reads plain f16 caches only, and allocation `{allocation}` stores \
     {what}: use --alloc f16, or --kernel fused for compressed allocations"
)]
pub struct KernelRefused {
    /// The allocation's name.
    pub allocation: String,
    /// What the kernel cannot read, e.g. `layer 0 keys as TurboQuant codes`.
    pub what: String,
}

impl KernelChoice {
    /// Refuses, before any work, a `llamacpp` run over a cache of `allocation` that the kernel
    /// would refuse at the first forward call (anything but plain f16 streams: codes, f32,
    /// full-precision sinks or recent windows). `fused` runs every allocation.
    pub fn check(
        self,
        model: &dyn CausalLm,
        allocation: &Allocation,
    ) -> Result<(), Box<dyn std::error::Error>> {
        if self == KernelChoice::Fused {
            return Ok(());
        }
        // A one-token cache is only a template: the codecs each stream would use.
        let cache = model.new_cache(allocation, 1)?;
        for spec in cache.specs() {
            let StateKind::Kv { layer, .. } = spec.kind else {
                continue;
            };
            let kv = cache.kv(layer)?;
            for h in 0..kv.layout().kv_heads {
                for (stream, name) in [(kv.keys(h), "keys"), (kv.values(h), "values")] {
                    let layout = stream.layout();
                    let what = if !matches!(stream.codec(), TokenCodec::F16 { .. }) {
                        Some(format!(
                            "{name} of layer {layer} in another format than f16"
                        ))
                    } else if layout.ring_slots.is_none()
                        && (layout.sink_tokens > 0 || layout.has_window())
                    {
                        Some(format!(
                            "full-precision sink or recent-window copies of layer {layer}'s {name}"
                        ))
                    } else {
                        None
                    };
                    if let Some(what) = what {
                        return Err(KernelRefused {
                            allocation: allocation.name.clone(),
                            what,
                        }
                        .into());
                    }
                }
            }
        }
        Ok(())
    }
}
