//! Every kernel, as assembled, parses and validates with naga (the wgpu 30 front end), declares
//! exactly the bindings its `.rs` file documents, and translates to SPIR-V and to MSL with an
//! explicit per-entry-point binding map — so a shader Metal or Vulkan would reject fails here,
//! on any machine, without an adapter.

use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use tq_attention_wgpu::kernels::{Access, Kernel};

fn parse(kernel: Kernel) -> (naga::Module, naga::valid::ModuleInfo) {
    let source = kernel.source();
    let module = naga::front::wgsl::parse_str(&source)
        .unwrap_or_else(|e| panic!("{}: {}", kernel.name(), e.emit_to_string(&source)));
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", kernel.name(), e.emit_to_string(&source)));
    (module, info)
}

/// The module with its pipeline constants resolved (as wgpu does before a backend sees it),
/// for every `CHUNK` the crate compiles.
fn specialized(kernel: Kernel) -> Vec<(naga::Module, naga::valid::ModuleInfo)> {
    let (module, info) = parse(kernel);
    let chunks: Vec<u32> = if kernel.has_chunk_constant() {
        (1..=8).collect()
    } else {
        vec![0]
    };
    chunks
        .into_iter()
        .map(|chunk| {
            let mut constants = naga::back::PipelineConstants::default();
            if kernel.has_chunk_constant() {
                constants.insert("CHUNK".to_string(), f64::from(chunk));
            }
            let (m, i) =
                naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
                    .unwrap_or_else(|e| panic!("{} CHUNK={chunk}: {e}", kernel.name()));
            (m.into_owned(), i.into_owned())
        })
        .collect()
}

#[test]
fn every_kernel_validates_and_declares_its_documented_bindings() {
    for kernel in Kernel::ALL {
        let (module, _) = parse(kernel);
        let mut declared: Vec<(u32, String, Access)> = module
            .global_variables
            .iter()
            .filter_map(|(_, var)| {
                let binding = var.binding.as_ref()?;
                assert_eq!(binding.group, 0, "{}", kernel.name());
                let access = match var.space {
                    naga::AddressSpace::Uniform => Access::Uniform,
                    naga::AddressSpace::Storage { access } => {
                        if access.contains(naga::StorageAccess::STORE) {
                            Access::ReadWrite
                        } else {
                            Access::Read
                        }
                    }
                    other => panic!("{}: unexpected space {other:?}", kernel.name()),
                };
                Some((
                    binding.binding,
                    var.name.clone().unwrap_or_default(),
                    access,
                ))
            })
            .collect();
        declared.sort_by_key(|d| d.0);
        let documented: Vec<(u32, String, Access)> = kernel
            .bindings()
            .iter()
            .map(|b| (b.index, b.name.to_string(), b.access))
            .collect();
        assert_eq!(declared, documented, "{}", kernel.name());
        // Every kernel has exactly one entry point, a 64-thread compute `main`.
        assert_eq!(module.entry_points.len(), 1, "{}", kernel.name());
        let entry = &module.entry_points[0];
        assert_eq!(entry.name, "main");
        assert_eq!(entry.stage, naga::ShaderStage::Compute);
        assert_eq!(entry.workgroup_size, [64, 1, 1], "{}", kernel.name());
    }
}

/// WebGPU's default limits: 16 KiB of workgroup memory and 8 storage buffers per stage; a
/// kernel within them runs on every adapter wgpu exposes.
#[test]
fn kernels_fit_the_default_webgpu_limits() {
    for kernel in Kernel::ALL {
        let (module, _) = parse(kernel);
        let mut workgroup_bytes = 0u32;
        for (_, var) in module.global_variables.iter() {
            if var.space == naga::AddressSpace::WorkGroup {
                workgroup_bytes += module.types[var.ty].inner.size(module.to_ctx());
            }
        }
        assert!(
            workgroup_bytes <= 16384,
            "{}: {workgroup_bytes} bytes",
            kernel.name()
        );
        let storage = kernel
            .bindings()
            .iter()
            .filter(|b| b.access != Access::Uniform)
            .count();
        assert!(storage <= 8, "{}: {storage} storage buffers", kernel.name());
    }
}

#[test]
fn every_kernel_translates_to_spirv() {
    for (kernel, (module, info)) in Kernel::ALL
        .into_iter()
        .flat_map(|k| specialized(k).into_iter().map(move |m| (k, m)))
    {
        let words = spv::write_vec(&module, &info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        assert_eq!(words[0], 0x0723_0203, "{}: SPIR-V magic", kernel.name());
    }
}

#[test]
fn every_kernel_translates_to_msl_with_explicit_bindings() {
    for (kernel, (module, info)) in Kernel::ALL
        .into_iter()
        .flat_map(|k| specialized(k).into_iter().map(move |m| (k, m)))
    {
        let bindings = kernel.bindings();
        let mut resources = msl::BindingMap::default();
        for b in &bindings {
            resources.insert(
                naga::ResourceBinding {
                    group: 0,
                    binding: b.index,
                },
                msl::BindTarget {
                    buffer: Some(b.index as u8),
                    mutable: b.access == Access::ReadWrite,
                    ..Default::default()
                },
            );
        }
        let mut per_entry_point_map = msl::EntryPointResourceMap::default();
        per_entry_point_map.insert(
            "main".to_string(),
            msl::EntryPointResources {
                resources,
                immediates_buffer: None,
                sizes_buffer: Some(bindings.len() as u8),
            },
        );
        let options = msl::Options {
            lang_version: (2, 1),
            per_entry_point_map,
            fake_missing_bindings: false,
            ..Default::default()
        };
        let pipeline = msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".to_string())),
            ..Default::default()
        };
        let (source, translation) = msl::write_string(&module, &info, &options, &pipeline)
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        for name in translation.entry_point_names {
            name.unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        }
        assert!(source.contains("kernel void"), "{}", kernel.name());
        for b in &bindings {
            assert!(
                source.contains(&format!("[[buffer({})]]", b.index)),
                "{}: binding {} not at buffer({})",
                kernel.name(),
                b.name,
                b.index
            );
        }
    }
}

/// The kernels add one RoPE center correction per block of the CPU's size
/// (`tq_cache::rope_center::CENTER_BLOCK`).
#[test]
fn kernels_center_blocks_of_the_cpus_size() {
    let wgsl = format!(
        "const CENTER_BLOCK: u32 = {}u;",
        tq_cache::rope_center::CENTER_BLOCK
    );
    for kernel in [Kernel::Attend, Kernel::Scores, Kernel::Prepare] {
        assert!(kernel.source().contains(&wgsl), "{}", kernel.name());
    }
}
