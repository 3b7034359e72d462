#!/usr/bin/env bash
# The GPU check of the device forward, for a lent GPU machine (bare: nvcc, CMake and ninja but none
# of miles' other dependencies). Two modes:
#
#   bash scripts/device_check.sh prepare   # here, before the call: fills .device/ (ignored by git)
#                                          # with nlohmann/json's headers and stories260K
#   bash scripts/device_check.sh run       # there, with .device carried: builds
#                                          # tests/device (core + CUDA backend, Release, sm_90) and
#                                          # runs miles_device_check: every test model and stories260K
#                                          # bit for bit against the CPU model (inference and the
#                                          # training pass's gradients), then SmolLM2- and
#                                          # Qwen3-0.6B-shaped models bit for bit and timed
#
# The device tool's call:  run(command="bash scripts/device_check.sh run", carry=[".device"],
#                              timeout_s=540)
# Output: the log on stdout and in $OUT/device_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"

if [[ "$mode" == prepare ]]; then
  shared="${MILES_SHARED_DIR:-../shared}"
  rm -rf .device && mkdir -p .device/include .device/models
  cp -r /usr/include/nlohmann .device/include/
  cp -r "$shared/models/stories260K" .device/models/
  du -sh .device
  exit 0
fi
[[ "$mode" == run ]] || { echo "usage: $0 prepare|run" >&2; exit 2; }
[[ -f .device/include/nlohmann/json.hpp ]] || { echo "no .device/: run '$0 prepare' here first and carry .device" >&2; exit 2; }

out="${OUT:-/tmp/device_check_out}"
mkdir -p "$out"
log="$out/device_check.log"
exec > >(tee "$log") 2>&1
echo "== $(date -u +%FT%TZ) $(nvidia-smi -L 2>/dev/null | head -1)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>/dev/null || true
nvcc --version | tail -2
build=/tmp/miles_devcheck
t0=$(date +%s)
cmake -S tests/device -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMILES_JSON_INCLUDE="$PWD/.device/include" > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C "$build" -j"$(nproc)" miles_device_check > "$out/build.log" 2>&1 || { grep -B2 -A8 -m5 "error" "$out/build.log"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
check="$build/miles_device_check"
rc=0
echo "== bits: test models and stories260K"
# Each run bounded, so that a slow kernel still leaves the others' results in the log.
timeout 180 "$check" --device cuda --train tests/data/models/llama tests/data/models/llama_tied \
  tests/data/models/llama_rope_yarn tests/data/models/llama_rope_llama3 tests/data/models/qwen3 \
  tests/data/models/qwen3_bf16 tests/data/models/qwen3_moe tests/data/models/qwen3_moe_nonorm \
  .device/models/stories260K/stories260K.bin || rc=1
echo "== bits and time: SmolLM2-135M and Qwen3-0.6B shapes (random weights)"
timeout 200 "$check" --device cuda --time --train smollm2-shape || rc=1
timeout 120 "$check" --device cuda --time qwen3-0.6b-shape || rc=1
echo "== done: rc=$rc"
exit $rc
