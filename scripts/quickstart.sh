#!/usr/bin/env bash
# The main job on an embedded default: set up, build, and run the RL quickstart
# (configs/quickstart.yaml): GRPO on stories260K with one rollout engine process, on two CPU cores,
# in well under 10 minutes. The reward (a story that mentions a dog and stays short) rises from
# about 0.1 to about 0.9; the last line compares the first 5 steps with the last 5.
# Metrics: runs/quickstart/metrics.jsonl. Extra arguments go to `miles run` (e.g. trainer.lr=1e-3,
# --run-dir DIR, async.mode=one_step_off).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target miles

export MILES_SHARED_DIR="${MILES_SHARED_DIR:-$(pwd)/../shared}"
model="$MILES_SHARED_DIR/models/stories260K/stories260K.bin"
if [ ! -f "$model" ]; then
  echo "quickstart: $model not found (set MILES_SHARED_DIR to the folder holding models/stories260K)" >&2
  exit 1
fi
build/bin/miles run configs/quickstart.yaml "$@"
