#!/usr/bin/env bash
# gpu-check.sh — the GPU checks of tq-attention-wgpu in one go, on a machine with a real GPU
# (Linux + Vulkan, e.g. NVIDIA with its Vulkan ICD; macOS uses Metal):
#
#   1. build the crate, its tests and the timing example in release;
#   2. run every test with CI=true, so a missing adapter fails instead of skipping;
#   3. run the model-level tests of the wgpu attention backend (tq-models `wgpu_*`; the ones
#      that need the reference model skip with a message when it is not in the model cache);
#   4. time one decode step (one query token, 32 query heads / 8 KV heads, d = 128) against
#      caches of 1K..128K tokens for the f16 baseline and the mse-k4v4 and k5v4 presets, and
#      print time per step, bytes of cache read per step and effective GB/s;
#   5. the same through `tq bench attention --backend wgpu` with tq3.5 and rec4.25 added (the CPU benchmark's table, plus
#      each output's difference from the CPU kernel on the same records).
#
# Usage: scripts/gpu-check.sh [PEAK_GB_PER_S] [TOKENS]
#   PEAK_GB_PER_S  the device's memory bandwidth (H200: 4800); adds a "% of peak" column.
#                  Without it, divide bytes/step by seconds yourself.
#   TOKENS         comma-separated cache sizes (default 1024,4096,16384,65536,131072).
#
# Environment: WGPU_BACKEND (default vulkan), CARGO_NET_OFFLINE=true on a machine without
# network (dependencies must then be in the local cargo registry or vendored).
# Budget: a cold release build of wgpu takes ~2-4 minutes on 16 cores; tests < 1 minute on a
# GPU; timing < 1 minute. Each stage has its own timeout; on an idle machine the whole run
# stays well under 10 minutes.
# Lines from a software adapter (llvmpipe) are labelled "correctness run, not a speed figure".
set -euo pipefail
cd "$(dirname "$0")/.."

PEAK="${1:-}"
TOKENS="${2:-1024,4096,16384,65536,131072}"
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"

echo "== machine"
uname -a
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L || true
if command -v vulkaninfo >/dev/null 2>&1; then
    vulkaninfo --summary 2>/dev/null | grep -E "deviceName|deviceType|driverName|apiVersion" || true
fi

echo "== build (release)"
start=$(date +%s)
timeout 420 cargo test --release -p tq-attention-wgpu --no-run
timeout 300 cargo build --release -p tq-attention-wgpu --example decode_timing
timeout 300 cargo build --release -p tq-cli
timeout 300 cargo test --release -p tq-models --test wgpu_backend --test wgpu_errors --no-run
echo "build: $(( $(date +%s) - start )) s"

echo "== tests (CI=true: the adapter is required)"
start=$(date +%s)
log="$(mktemp)"
status=0
CI=true timeout 300 cargo test --release -p tq-attention-wgpu -- --nocapture >"$log" 2>&1 || status=$?
grep -E "^test |test result|GPU tests on|panicked" "$log" | sort | uniq -c | sort -rn || true
echo "tests: $(( $(date +%s) - start )) s, exit status $status (full log: $log)"
if [[ $status -ne 0 ]]; then
    tail -n 60 "$log"
    exit "$status"
fi

echo "== model tests of the wgpu backend (CI=true)"
start=$(date +%s)
status=0
CI=true timeout 240 cargo test --release -p tq-models --test wgpu_backend --test wgpu_errors \
    -- --nocapture >"$log" 2>&1 || status=$?
grep -E "^test |test result|GPU tests on|skipped|largest|decode tok/s|panicked" "$log" || true
echo "model tests: $(( $(date +%s) - start )) s, exit status $status"
if [[ $status -ne 0 ]]; then
    tail -n 60 "$log"
    exit "$status"
fi

echo "== decode-step timing"
args=(--tokens "$TOKENS" --allocations f16,mse-k4v4,k5v4 --head-dim 128 --q-heads 32 --kv-heads 8 --steps 20)
if [[ -n "$PEAK" ]]; then
    args+=(--bandwidth-gbs "$PEAK")
fi
timeout 240 cargo run --release --quiet -p tq-attention-wgpu --example decode_timing -- "${args[@]}"

echo "== tq bench attention --backend wgpu (d = 128)"
bench=(bench attention --backend wgpu --shapes d128 --configs f16,mse-k4v4,k5v4,tq3.5,rec4.25 --tokens "$TOKENS" --repeats 11)
if [[ -n "$PEAK" ]]; then
    bench+=(--bandwidth-gbs "$PEAK")
fi
timeout 240 target/release/tq "${bench[@]}"
