//! The aarch64 step of `cargo xtask verify`: the NEON kernels of `tq-models` (row kernels, and
//! the `sdot` matrix products) built for `aarch64-unknown-linux-gnu` and their tests run under
//! QEMU's user-mode emulator — once on a CPU with the DotProd extension (QEMU's default `max`
//! CPU), once on a Cortex-A53 without it (the row-kernel fallback); then the NEON attention
//! kernels of `tq-cache` (the fused kernel's primitives and the fast scan's `tbl` scoring),
//! whose tests compare every instruction set with the scalar loops, once. This machine kind has no
//! aarch64 hardware; without this step the NEON code would be compiled by nobody.
//!
//! Needs `qemu-aarch64`, the `aarch64-linux-gnu-gcc` linker (Debian: `qemu-user`,
//! `gcc-aarch64-linux-gnu`, `libc6-dev-arm64-cross`) and the Rust target
//! (`rustup target add aarch64-unknown-linux-gnu`); `.ci/run` installs them. Without them the
//! step is skipped with the reason printed, unless `TQ_REQUIRE_AARCH64=1`. Clippy runs on the
//! target too (`-D warnings`): code behind `cfg(target_arch = "aarch64")` is invisible to the
//! x86-64 clippy step. Builds go to the workspace's target directory, under
//! `aarch64-unknown-linux-gnu/`, beside the host's.

use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{cargo, run};

/// The Rust target the step builds for.
const TARGET: &str = "aarch64-unknown-linux-gnu";
/// The cross linker (and C compiler, for any build script that needs one).
const LINKER: &str = "aarch64-linux-gnu-gcc";
/// Where the cross libc lives, for QEMU's dynamic loader.
const SYSROOT: &str = "/usr/aarch64-linux-gnu";
/// The test files that exercise the quantized kernels on every instruction set.
const TESTS: &[&str] = &["quant_dot", "quant_matrix", "quant_kquant"];
/// The `tq-cache` test files that run every instruction set against the scalar loops.
const CACHE_TESTS: &[&str] = &[
    "simd_primitives",
    "simd_kernels",
    "simd_fused",
    "fast_scan",
    "fast_scan_cache",
    "basis",
    "centering",
];

/// Runs the step, or explains why it is skipped.
pub(crate) fn verify() -> Result<(), String> {
    if let Err(reason) = tools() {
        if std::env::var("TQ_REQUIRE_AARCH64").is_ok_and(|v| v == "1") {
            return Err(format!(
                "the aarch64 step needs its tools, and TQ_REQUIRE_AARCH64=1: {reason}"
            ));
        }
        eprintln!(
            "==> aarch64: skipped ({reason}; set TQ_REQUIRE_AARCH64=1 to make this an error)"
        );
        return Ok(());
    }
    let started = Instant::now();
    let mut clippy = cross(None);
    clippy.args([
        "clippy",
        "-p",
        "tq-models",
        "-p",
        "tq-cache",
        "--all-targets",
    ]);
    clippy.arg("--release");
    clippy.args(["--target", TARGET, "--", "-D", "warnings"]);
    run(&mut clippy)?;
    for cpu in [None, Some("cortex-a53")] {
        let mut test = cross(cpu);
        test.args([
            "test",
            "-p",
            "tq-models",
            "--release",
            "--target",
            TARGET,
            "--lib",
        ]);
        for name in TESTS {
            test.args(["--test", name]);
        }
        run(&mut test)?;
        eprintln!(
            "==> aarch64: tests passed under qemu-aarch64 ({}) ({:.1} s)",
            cpu.unwrap_or("max: NEON + DotProd"),
            started.elapsed().as_secs_f64()
        );
    }
    let mut test = cross(None);
    test.args(["test", "-p", "tq-cache", "--release", "--target", TARGET]);
    for name in CACHE_TESTS {
        test.args(["--test", name]);
    }
    run(&mut test)?;
    eprintln!(
        "==> aarch64: tq-cache's kernel tests passed under qemu-aarch64 ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A cargo command set up to link for the target and run its binaries under QEMU emulating
/// `cpu` (QEMU's default, `max`, when `None`).
fn cross(cpu: Option<&str>) -> Command {
    let mut command = cargo();
    let runner = match cpu {
        Some(cpu) => format!("qemu-aarch64 -cpu {cpu} -L {SYSROOT}"),
        None => format!("qemu-aarch64 -L {SYSROOT}"),
    };
    command
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", LINKER)
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", runner)
        .env("CC_aarch64_unknown_linux_gnu", LINKER);
    command
}

/// Whether the emulator, the linker and the Rust target are there.
fn tools() -> Result<(), String> {
    for (tool, arg) in [("qemu-aarch64", "--version"), (LINKER, "--version")] {
        let found = Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(format!("no `{tool}` on PATH"));
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .map_err(|e| format!("could not run rustc: {e}"))?;
    let dir = String::from_utf8_lossy(&libdir.stdout).trim().to_string();
    let has_std = std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
    });
    if !libdir.status.success() || !has_std {
        return Err(format!("the Rust target {TARGET} is not installed"));
    }
    Ok(())
}
