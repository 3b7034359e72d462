#!/usr/bin/env bash
# Fingerprints what a miles binary trains: six `miles sft` runs whose losses and grad norms (every
# digit printed) and checkpoint bytes (sha256 of every file) go into one file. Two binaries whose
# fingerprints differ compute different bits; a kernel change meant to keep the bits must leave
# the fingerprint unchanged.
#
#   scripts/same_bits.sh BIN OUT             writes OUT/fingerprint.txt (and the runs' logs)
#   scripts/same_bits.sh BIN OUT BASE_OUT    ... then compares it with BASE_OUT/fingerprint.txt
#
# The runs: stories260K (4 steps, micro-batch 1), SmolLM2-135M (7 micro-batches of 255 ids, so
# attention's blocks and every GEMM shape of the benchmark run; skipped with a note when
# models/smollm2-135m-instruct is absent: scripts/get_models.sh), a tied Llama at pp=2, Qwen3-MoE on
# the CPU and on the emulated device, Qwen3 at micro-batch 2. Needs ../shared (or MILES_SHARED_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 2 ] || { echo "usage: $0 BIN OUT [BASE_OUT]" >&2; exit 2; }
bin="$(realpath "$1")"
out="$2"
base="${3:-}"
shared="${MILES_SHARED_DIR:-$(pwd)/../shared}"
models="tests/data/models"
ids="tests/data/sft/ids.jsonl"
[ -x "$bin" ] || { echo "same_bits.sh: $bin is not an executable" >&2; exit 2; }
[ -f "$shared/models/stories260K/stories260K.bin" ] || {
  echo "same_bits.sh: no stories260K under $shared" >&2
  exit 2
}

rm -rf "$out"
mkdir -p "$out"

# 7 samples of 256 ids in [3, 512) from MINSTD (s * 48271 mod 2^31 - 1: every product below 2^47,
# exact in any awk's doubles, so every awk makes the same ids; no Python needed).
long_ids="$out/long_ids.jsonl"
awk 'BEGIN { s = 12345; for (n = 0; n < 7; ++n) { line = "{\"input_ids\": [1";
       for (i = 1; i < 256; ++i) { s = (s * 48271) % 2147483647;
         line = line ", " (3 + int(s / 65536) % 509) } print line "]}" } }' > "$long_ids"

run() {  # name, then the sft arguments
  local name="$1"
  shift
  local dir="$out/$name"
  "$bin" sft "$@" --save-dir "$dir/ckpt" > "$dir.log" 2> "$dir.err" || {
    echo "same_bits.sh: run $name failed:" >&2
    tail -5 "$dir.err" >&2
    exit 1
  }
  {
    echo "## $name"
    # Every field but the step's wall time.
    sed -E 's/,?"step_time_s":[^,}]*//' "$dir.log"
    (cd "$dir/ckpt" && find . -type f | sort | xargs sha256sum)
  } >> "$out/fingerprint.txt"
  rm -rf "$dir/ckpt"  # SmolLM2's is 1.6 GB
  echo "same_bits.sh: $name done"
}

run stories260k --model "$shared/models/stories260K/stories260K.bin" \
  --data tests/data/sft/stories.jsonl --steps 4 --lr 1e-3 --batch-size 4 --micro-batch-size 1 \
  --save-every 4
if [ -f models/smollm2-135m-instruct/config.json ]; then
  run smollm2 --model models/smollm2-135m-instruct --data "$long_ids" --steps 2 --lr 1e-4 \
    --batch-size 7 --micro-batch-size 1 --save-every 2
else
  echo "same_bits.sh: no models/smollm2-135m-instruct (scripts/get_models.sh): SmolLM2 skipped" |
    tee -a "$out/fingerprint.txt"
fi
run llama_tied_pp2 --model "$models/llama_tied" --data "$ids" --steps 3 --lr 1e-3 \
  --batch-size 4 --micro-batch-size 2 --layout pp=2 --save-every 3
run qwen3_moe --model "$models/qwen3_moe" --data "$ids" --steps 3 --lr 1e-3 --batch-size 4 \
  --micro-batch-size 1 --save-every 3
run qwen3_moe_emulated --model "$models/qwen3_moe" --data "$ids" --steps 3 --lr 1e-3 \
  --batch-size 4 --micro-batch-size 1 --save-every 3 --device emulated
run qwen3 --model "$models/qwen3" --data "$ids" --steps 3 --lr 1e-3 --batch-size 4 \
  --micro-batch-size 2 --save-every 3

echo "same_bits.sh: fingerprint $(sha256sum < "$out/fingerprint.txt" | cut -c1-16) in $out/fingerprint.txt"
if [ -n "$base" ]; then
  if diff -q "$base/fingerprint.txt" "$out/fingerprint.txt" > /dev/null; then
    echo "same_bits.sh: the same bits as $base"
  else
    echo "same_bits.sh: DIFFERENT bits from $base:" >&2
    diff "$base/fingerprint.txt" "$out/fingerprint.txt" | head -20 >&2
    exit 1
  fi
fi
