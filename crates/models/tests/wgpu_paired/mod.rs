//! [`Paired`]: the CPU and GPU attention backends run side by side, layer by layer, for the
//! wgpu backend tests.
#![allow(dead_code)] // Each test crate reads a different part of it.

use tq_cache::attention::AttentionShape;
use tq_models::llama::{AttentionBackend, CpuAttention, ModelError, WgpuAttention};

/// Runs both backends on identical inputs at every layer (KV-sharing layers too) and keeps the
/// largest difference of their outputs relative to the call's largest |output|; the model
/// carries on with the CPU output, so every call's inputs are the CPU run's.
pub struct Paired<'c> {
    pub cpu: CpuAttention<'c>,
    pub gpu: WgpuAttention,
    gpu_out: Vec<f32>,
    /// The largest difference seen, relative to its call's largest |output|.
    pub worst: f32,
    /// Calls, all layers.
    pub calls: usize,
    /// Of them, calls of KV-sharing layers.
    pub shared_calls: usize,
}

impl<'c> Paired<'c> {
    pub fn new(cpu: CpuAttention<'c>, gpu: WgpuAttention) -> Self {
        Self {
            cpu,
            gpu,
            gpu_out: Vec::new(),
            worst: 0.0,
            calls: 0,
            shared_calls: 0,
        }
    }

    fn record(&mut self, layer: usize, out: &[f32]) {
        let top = out.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(top > 0.0, "layer {layer}: attention output is all zeros");
        for (a, b) in self.gpu_out.iter().zip(out) {
            self.worst = self.worst.max((a - b).abs() / top);
        }
        self.calls += 1;
    }
}

impl AttentionBackend for Paired<'_> {
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
        self.cpu
            .attend(layer, queries, keys, values, positions, shape, out)?;
        self.gpu_out.resize(out.len(), 0.0);
        self.gpu.attend(
            layer,
            queries,
            keys,
            values,
            positions,
            shape,
            &mut self.gpu_out,
        )?;
        self.record(layer, out);
        Ok(())
    }

    fn attend_shared(
        &mut self,
        layer: usize,
        queries: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.cpu
            .attend_shared(layer, queries, positions, shape, out)?;
        self.gpu_out.resize(out.len(), 0.0);
        self.gpu
            .attend_shared(layer, queries, positions, shape, &mut self.gpu_out)?;
        self.record(layer, out);
        self.shared_calls += 1;
        Ok(())
    }
}
