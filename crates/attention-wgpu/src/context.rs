//! [`GpuContext`]: one adapter, device and queue, the compiled kernels, and the limits that
//! decide how work is split into bindings and dispatches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::error::GpuError;
use crate::kernels::{Access, Grid, Kernel};

/// A kernel's module and explicit layouts, and its pipelines by `CHUNK` value.
struct Compiled {
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    module: wgpu::ShaderModule,
    pipelines: Mutex<HashMap<u32, wgpu::ComputePipeline>>,
}

/// The limits that split work: no binding larger than `max_binding_bytes`, no dispatch
/// dimension larger than `max_workgroups_per_dimension`.
///
/// They default to the device's own limits (`max_storage_buffer_binding_size`, 128 MiB on
/// lavapipe; `max_compute_workgroups_per_dimension`, 65 535). Lower values, as the tests use,
/// force the split paths (many small pages, 2-D and 3-D grids) on any device.
///
/// What grows with the context (pages of records, attention partials) is split to fit;
/// per-layer tables (Π and S: `kv_heads·d²` f32 each) and per-call buffers (queries, outputs)
/// are bound whole and checked against the device's real limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitLimits {
    /// Largest storage binding the crate creates for context-sized data, in bytes.
    pub max_binding_bytes: u64,
    /// Largest workgroup count in one dispatch dimension.
    pub max_workgroups_per_dimension: u32,
}

/// How to pick the adapter and which limits to split by.
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Power preference (`WGPU_POWER_PREF` overrides it).
    pub power_preference: wgpu::PowerPreference,
    /// Lower split limits than the device's (each field is clamped to the device's).
    pub split_limits: Option<SplitLimits>,
}

/// The device, queue and compiled kernels.
///
/// Backends come from `WGPU_BACKEND` (default: all compiled in — Vulkan, Metal, DX12).
/// Errors the driver raises outside an explicit error scope are collected, never panicked on,
/// and reported by the next operation.
pub struct GpuContext {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: SplitLimits,
    device_limits: wgpu::Limits,
    kernels: HashMap<Kernel, Compiled>,
    uncaptured: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl GpuContext {
    /// Picks an adapter, creates the device with the adapter's limits, and compiles every
    /// kernel (each inside an error scope, so a rejected shader is a [`GpuError::Pipeline`]
    /// with the driver's message).
    pub fn new(options: &ContextOptions) -> Result<Self, GpuError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let power_preference =
            wgpu::PowerPreference::from_env().unwrap_or(options.power_preference);
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference,
            ..Default::default()
        }))
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let adapter_limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tq-attention-wgpu"),
            required_features: wgpu::Features::empty(),
            required_limits: adapter_limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            if let Ok(mut errors) = sink.lock() {
                errors.push(error.to_string());
            }
        }));
        let device_limits = device.limits();
        let mut limits = SplitLimits {
            max_binding_bytes: device_limits
                .max_storage_buffer_binding_size
                .min(device_limits.max_buffer_size),
            max_workgroups_per_dimension: device_limits.max_compute_workgroups_per_dimension,
        };
        if let Some(lower) = options.split_limits {
            limits.max_binding_bytes = limits.max_binding_bytes.min(lower.max_binding_bytes);
            limits.max_workgroups_per_dimension = limits
                .max_workgroups_per_dimension
                .min(lower.max_workgroups_per_dimension)
                .max(1);
        }
        let mut context = Self {
            device,
            queue,
            info,
            limits,
            device_limits,
            kernels: HashMap::new(),
            uncaptured,
        };
        for kernel in Kernel::ALL {
            let compiled = context.compile(kernel)?;
            context.kernels.insert(kernel, compiled);
        }
        Ok(context)
    }

    /// Runs `create` inside validation and out-of-memory error scopes.
    fn scoped<T>(&self, kernel: Kernel, create: impl FnOnce() -> T) -> Result<T, GpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = create();
        let errors = [
            pollster::block_on(validation.pop()),
            pollster::block_on(oom.pop()),
        ];
        match errors.into_iter().flatten().next() {
            Some(error) => Err(GpuError::Pipeline {
                kernel: kernel.name(),
                message: error.to_string(),
            }),
            None => Ok(value),
        }
    }

    /// Compiles `kernel`'s module against the explicit layout its `.rs` file declares (so a
    /// shader whose bindings drift from the documented table fails here), and its default
    /// pipeline.
    fn compile(&self, kernel: Kernel) -> Result<Compiled, GpuError> {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = kernel
            .bindings()
            .iter()
            .map(|b| wgpu::BindGroupLayoutEntry {
                binding: b.index,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match b.access {
                        Access::Uniform => wgpu::BufferBindingType::Uniform,
                        Access::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Access::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let compiled = self.scoped(kernel, || {
            let layout = self
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(kernel.name()),
                    entries: &entries,
                });
            let pipeline_layout =
                self.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(kernel.name()),
                        bind_group_layouts: &[Some(&layout)],
                        immediate_size: 0,
                    });
            let module = self
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.name()),
                    source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
                });
            Compiled {
                layout,
                pipeline_layout,
                module,
                pipelines: Mutex::new(HashMap::new()),
            }
        })?;
        let default = self.specialize(kernel, &compiled, kernel.default_chunk())?;
        compiled
            .pipelines
            .lock()
            .map_err(|_| GpuError::Readback("pipeline cache poisoned".into()))?
            .insert(kernel.default_chunk(), default);
        Ok(compiled)
    }

    fn specialize(
        &self,
        kernel: Kernel,
        compiled: &Compiled,
        chunk: u32,
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let constants = [("CHUNK", f64::from(chunk))];
        let constants: &[(&str, f64)] = if kernel.has_chunk_constant() {
            &constants
        } else {
            &[]
        };
        self.scoped(kernel, || {
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel.name()),
                    layout: Some(&compiled.pipeline_layout),
                    module: &compiled.module,
                    entry_point: Some("main"),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants,
                        ..Default::default()
                    },
                    cache: None,
                })
        })
    }

    /// The pipeline of `kernel` specialized for `chunk` query heads per workgroup (ignored by
    /// kernels without the `CHUNK` constant), compiled on first use.
    pub(crate) fn pipeline(
        &self,
        kernel: Kernel,
        chunk: u32,
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let compiled = &self.kernels[&kernel];
        let chunk = if kernel.has_chunk_constant() {
            chunk
        } else {
            kernel.default_chunk()
        };
        let mut cache = compiled
            .pipelines
            .lock()
            .map_err(|_| GpuError::Readback("pipeline cache poisoned".into()))?;
        if let Some(pipeline) = cache.get(&chunk) {
            return Ok(pipeline.clone());
        }
        let pipeline = self.specialize(kernel, compiled, chunk)?;
        cache.insert(chunk, pipeline.clone());
        Ok(pipeline)
    }

    /// The adapter in use.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// Whether the adapter is a software rasterizer (lavapipe, WARP): timings from it measure
    /// correctness runs, not GPU speed.
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The split limits in force.
    pub fn split_limits(&self) -> SplitLimits {
        self.limits
    }

    /// The device's limits.
    pub fn device_limits(&self) -> &wgpu::Limits {
        &self.device_limits
    }

    /// The grid for `total` workgroups under the split limit.
    pub(crate) fn grid(&self, total: usize) -> Result<Grid, GpuError> {
        let max = self.limits.max_workgroups_per_dimension;
        u32::try_from(total)
            .ok()
            .and_then(|t| Grid::new(t, max))
            .ok_or(GpuError::TooLarge {
                what: "dispatch (workgroups)",
                needed: total as u64,
                limit: u64::from(max).pow(3),
            })
    }

    /// Alignment of storage binding offsets, in bytes.
    pub(crate) fn storage_alignment(&self) -> u64 {
        u64::from(self.device_limits.min_storage_buffer_offset_alignment)
    }

    /// Alignment of uniform binding offsets, in bytes.
    pub(crate) fn uniform_alignment(&self) -> u64 {
        u64::from(self.device_limits.min_uniform_buffer_offset_alignment)
    }

    /// Checks that one whole-buffer binding fits the device.
    pub(crate) fn check_binding(&self, what: &'static str, bytes: u64) -> Result<(), GpuError> {
        let limit = self
            .device_limits
            .max_storage_buffer_binding_size
            .min(self.device_limits.max_buffer_size);
        if bytes > limit {
            return Err(GpuError::TooLarge {
                what,
                needed: bytes,
                limit,
            });
        }
        Ok(())
    }

    /// A zero-filled storage buffer of at least `bytes` (rounded up to 16, never empty).
    pub(crate) fn storage_buffer(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).next_multiple_of(16),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `data` (padded to 16 bytes, never empty).
    pub(crate) fn storage_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded = data.to_vec();
        padded.resize(data.len().max(16).next_multiple_of(16), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &padded,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            })
    }

    /// A uniform buffer holding `data` (padded to 16 bytes).
    pub(crate) fn uniform_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded = data.to_vec();
        padded.resize(data.len().max(16).next_multiple_of(16), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &padded,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// Writes `data` into `buffer` at `offset`, padding the write to a multiple of 4 bytes.
    pub(crate) fn write(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(buffer, offset, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(4), 0);
            self.queue.write_buffer(buffer, offset, &padded);
        }
    }

    /// Runs `record` on a fresh command encoder, submits it, and reports any validation or
    /// out-of-memory error the driver raised (with its message).
    pub(crate) fn submit(
        &self,
        operation: &'static str,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(operation),
            });
        let recorded = record(&mut encoder);
        if recorded.is_ok() {
            self.queue.submit([encoder.finish()]);
        }
        let errors = [
            pollster::block_on(validation.pop()),
            pollster::block_on(oom.pop()),
        ];
        recorded?;
        if let Some(error) = errors.into_iter().flatten().next() {
            return Err(GpuError::Device {
                operation,
                message: error.to_string(),
            });
        }
        self.take_uncaptured(operation)
    }

    /// Reports (and clears) errors raised outside an error scope.
    pub(crate) fn take_uncaptured(&self, operation: &'static str) -> Result<(), GpuError> {
        let mut errors = self
            .uncaptured
            .lock()
            .map_err(|_| GpuError::Readback("error log poisoned".into()))?;
        if errors.is_empty() {
            return Ok(());
        }
        let message = errors.join("; ");
        errors.clear();
        Err(GpuError::Device { operation, message })
    }

    /// Copies `bytes` bytes of `source` from `offset` to the host (blocking).
    pub(crate) fn read(
        &self,
        source: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let size = bytes.next_multiple_of(4).max(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.submit("readback copy", |encoder| {
            encoder.copy_buffer_to_buffer(source, offset, &staging, 0, size);
            Ok(())
        })?;
        let (sender, receiver) = std::sync::mpsc::channel();
        staging
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |result| {
                // The receiver waits below; a failed send only means it gave up already.
                let _ = sender.send(result);
            });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        receiver
            .recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let data = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            view[..bytes as usize].to_vec()
        };
        staging.unmap();
        Ok(data)
    }

    /// A bind group for `kernel`'s pipeline: `(binding, buffer, offset, size)` entries
    /// (`size` `None`: the rest of the buffer).
    pub(crate) fn bind(
        &self,
        kernel: Kernel,
        entries: &[(u32, &wgpu::Buffer, u64, Option<u64>)],
    ) -> wgpu::BindGroup {
        let layout = &self.kernels[&kernel].layout;
        let entries: Vec<wgpu::BindGroupEntry<'_>> = entries
            .iter()
            .map(|&(binding, buffer, offset, size)| wgpu::BindGroupEntry {
                binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset,
                    size: size.and_then(wgpu::BufferSize::new),
                }),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.name()),
            layout,
            entries: &entries,
        })
    }

    /// Records one dispatch of `pipeline` with `bind_group` over `grid`.
    pub(crate) fn dispatch(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        pipeline: &wgpu::ComputePipeline,
        bind_group: &wgpu::BindGroup,
        grid: Grid,
    ) {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, bind_group, &[]);
        pass.dispatch_workgroups(grid.x, grid.y, grid.z);
    }
}
