#!/usr/bin/env bash
# The GPU check of the device path, for a lent GPU machine (bare: nvcc, CMake, ninja and Python, but
# none of miles' other dependencies). Two modes:
#
#   bash scripts/device_check.sh prepare   # here, before the call: fills .device/ (ignored by git)
#                                          # with nlohmann/json's headers, stories260K, and the whole
#                                          # `miles` (this machine's CUDA build, stripped) with the
#                                          # shared libraries it needs beyond glibc (miles.tar.xz)
#   bash scripts/device_check.sh run       # there, with .device carried:
#     1. builds tests/device (core sources + CUDA backend, Release, sm_90) and runs
#        miles_device_check: every test model and stories260K bit for bit against the CPU model
#        (inference, routed experts, the training pass's gradients), then SmolLM2- and
#        Qwen3-0.6B-shaped models bit for bit and timed;
#     2. runs the bundled `miles` itself: `miles sft --device cuda` against `--device cpu` (the
#        same losses and grad norms), `miles bench train` on both, and the CI RL job with engines
#        and trainer on the GPU against the CPU run (the same numbers, |Δlogp| = 0).
#
# The device tool's call:  run(command="bash scripts/device_check.sh run", carry=[".device"],
#                              timeout_s=540)
# MILES_DEVICE=emulated runs the same script on a machine without a GPU (the device kernels as host
# loops; the timed shapes are skipped), which is how it is checked here.
# Output: the log on stdout and in $OUT/device_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"

if [[ "$mode" == prepare ]]; then
  shared="${MILES_SHARED_DIR:-../shared}"
  [[ -x build/bin/miles ]] || { echo "build miles first (cmake --build build)" >&2; exit 1; }
  rm -rf .device && mkdir -p .device/include .device/models
  cp -r /usr/include/nlohmann .device/include/
  cp -r "$shared/models/stories260K" .device/models/
  bundle=$(mktemp -d)
  mkdir -p "$bundle/lib"
  strip -o "$bundle/miles" build/bin/miles
  ldd build/bin/miles | awk '/=>/ {print $3}' |
    grep -v -E '/lib(c|m|pthread|dl|rt)\.so|ld-linux' | xargs -I{} cp -L {} "$bundle/lib/"
  tar -C "$bundle" -cJf .device/miles.tar.xz .
  rm -rf "$bundle"
  du -sh .device .device/miles.tar.xz
  exit 0
fi
[[ "$mode" == run ]] || { echo "usage: $0 prepare|run" >&2; exit 2; }
[[ -f .device/include/nlohmann/json.hpp ]] || { echo "no .device/: run '$0 prepare' here first and carry .device" >&2; exit 2; }

device="${MILES_DEVICE:-cuda}"
# One deadline for the whole run (the device tool allows 600 s a call): each step gets at most its
# own limit and what is left, and is skipped, saying so, when under 20 s are left.
deadline=$(( $(date +%s) + ${MILES_DEVICE_CHECK_SECONDS:-500} ))
bounded() {  # bounded MAX_SECONDS COMMAND...: run it within MAX_SECONDS and the deadline
  local max=$1 left
  shift
  left=$(( deadline - $(date +%s) ))
  (( left < 20 )) && { echo "(skipped, out of time: $*)"; return 1; }
  timeout $(( max < left ? max : left )) "$@"
}
out="${OUT:-/tmp/device_check_out}"
mkdir -p "$out"
log="$out/device_check.log"
exec > >(tee "$log") 2>&1
echo "== $(date -u +%FT%TZ) device $device: $(nvidia-smi -L 2>/dev/null | head -1)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>/dev/null || true
nvcc --version | tail -2
build=/tmp/miles_devcheck
t0=$(date +%s)
cuda_flag=ON
[[ "$device" == cuda ]] || cuda_flag=OFF
cmake -S tests/device -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMILES_DEVICE_CUDA=$cuda_flag \
  -DMILES_JSON_INCLUDE="$PWD/.device/include" > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C "$build" -j"$(nproc)" miles_device_check > "$out/build.log" 2>&1 || { grep -B2 -A8 -m5 "error" "$out/build.log"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
check="$build/miles_device_check"
rc=0
echo "== 1. bits: test models and stories260K"
# Each run bounded, so that a slow kernel still leaves the others' results in the log.
bounded 120 "$check" --device "$device" --train tests/data/models/llama tests/data/models/llama_tied \
  tests/data/models/llama_rope_yarn tests/data/models/llama_rope_llama3 tests/data/models/qwen3 \
  tests/data/models/qwen3_bf16 tests/data/models/qwen3_moe tests/data/models/qwen3_moe_nonorm \
  .device/models/stories260K/stories260K.bin || rc=1
if [[ "$device" == cuda ]]; then
  echo "== 1. bits and time: SmolLM2-135M and Qwen3-0.6B shapes (random weights)"
  bounded 100 "$check" --device cuda --time --train smollm2-shape || rc=1
  echo "== 1. the same with one thread per GEMM output (MILES_DEVICE_GEMM=simple), to compare"
  MILES_DEVICE_GEMM=simple bounded 100 "$check" --device cuda --time --train smollm2-shape || rc=1
  bounded 80 "$check" --device cuda --time qwen3-0.6b-shape || rc=1
fi

echo "== 2. the whole program: miles sft and miles run with --device $device against the CPU"
bundle=/tmp/miles_bundle
rm -rf "$bundle" && mkdir -p "$bundle" && tar -C "$bundle" -xJf .device/miles.tar.xz
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MILES_SHARED_DIR="$PWD/.device"
miles="$bundle/miles"
sft=(sft --model .device/models/stories260K/stories260K.bin --data tests/data/sft/stories.jsonl
     --steps 5 --lr 2e-3 --batch-size 4)
for d in cpu "$device"; do
  bounded 60 "$miles" "${sft[@]}" --device "$d" > "$out/sft_$d.jsonl" 2> "$out/sft_$d.err" ||
    { echo "miles sft --device $d failed:"; tail -5 "$out/sft_$d.err"; rc=1; }
done
for d in cpu "$device"; do
  bounded 100 "$miles" run configs/quickstart_ci.yaml --run-dir "$out/rl_$d" logging.progress=lines \
    rollout.engine_device="$d" trainer.device="$d" > "$out/rl_$d.log" 2>&1 ||
    { echo "miles run on $d failed:"; tail -8 "$out/rl_$d.log"; rc=1; }
done
echo "== 2. miles bench train (stories260K, 4 x 256 tokens per step) on the CPU and on $device"
for d in cpu "$device"; do
  bounded 60 "$miles" bench train --model .device/models/stories260K/stories260K.bin --steps 3 \
    --device "$d" --no-breakdown 2>&1 | grep -E "^miles bench train|tokens/s \(median|step time" || true
done
python3 - "$out" "$device" <<'EOF' || rc=1
import json, sys
out, dev = sys.argv[1], sys.argv[2]
def lines(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")]
    except OSError:
        return []
a, b = lines(f"{out}/sft_cpu.jsonl"), lines(f"{out}/sft_{dev}.jsonl")
same = len(a) == 5 and [(x["loss"], x["grad_norm"]) for x in a] == [(x["loss"], x["grad_norm"]) for x in b]
print(f"sft: {len(b)} steps on {dev}, losses and grad norms {'EQUAL to' if same else 'NOT equal to'} the CPU's")
for x, y in zip(a, b):
    print(f"  step {x['step']}: loss {x['loss']:.6f} / {y['loss']:.6f}, step time {x.get('step_time_s', 0):.3f} s / {y.get('step_time_s', 0):.3f} s")
skip = {"step_time_s", "generate_s", "train_s", "sync_s", "idle_s", "time", "wall_s", "tokens_per_s",
        "samples_per_s", "elapsed_s"}
ma, mb = lines(f"{out}/rl_cpu/metrics.jsonl"), lines(f"{out}/rl_{dev}/metrics.jsonl")
num = lambda m: {k: v for k, v in m.items() if isinstance(v, (int, float)) and not k.endswith("_s") and k not in skip}
rl_same = len(ma) == 8 and len(mb) == 8 and all(num(x) == num(y) for x, y in zip(ma, mb))
diff = max((m.get("logp_abs_diff_max", 1) for m in mb), default=1)
print(f"rl: {len(mb)} steps on {dev}, numbers {'EQUAL to' if rl_same else 'NOT equal to'} the CPU run's, max |dlogp| {diff}")
for x, y in zip(ma, mb):
    print(f"  step {x.get('step')}: reward {x.get('reward_mean', 0):.3f} / {y.get('reward_mean', 0):.3f}, "
          f"step time {x.get('time_step_s', 0):.2f} s / {y.get('time_step_s', 0):.2f} s")
sys.exit(0 if same and rl_same and diff == 0 else 1)
EOF
echo "== done: rc=$rc"
exit $rc
