//! # tq-attention-wgpu (planned)
//!
//! This crate will hold the WGSL compute kernels (encode and decode attention) that run
//! TurboQuant attention on a GPU through wgpu, reading the packed page layout of `tq-cache`
//! directly, each kernel beside its Rust dispatch code and tested against the CPU reference.
//!
//! Nothing is implemented yet: the crate exists so the workspace shows the whole pipeline
//! (`lloyd-max` → `rotation` → `qjl` → `cache` → `attention-wgpu` → `models`).
