#!/usr/bin/env bash
# The main job on an embedded default: set up, build, and run the RL quickstart
# (configs/quickstart.yaml): GRPO on stories260K with one rollout engine process, on two CPU cores.
# The reward (a first sentence that mentions a dog and stays within 12 tokens) rises from about
# −0.12 to about 0.78; the last line compares the first 5 steps with the last 5.
# Metrics: runs/quickstart/metrics.jsonl. Extra arguments go to `miles run` (e.g. trainer.lr=1e-3,
# --run-dir DIR, async.mode=one_step_off).
set -euo pipefail
cd "$(dirname "$0")/.."

# Only what the job needs: the build's packages, a release build of the `miles` binary (no tests,
# no CUDA objects, no debug info; MILES_BUILD_TYPE=RelWithDebInfo to keep it) in build-quickstart/.
bash scripts/setup.sh --run-only
cmake -S . -B build-quickstart -G Ninja -DCMAKE_BUILD_TYPE="${MILES_BUILD_TYPE:-Release}" \
  -DMILES_TESTS=OFF -DMILES_CUDA=OFF >/dev/null
cmake --build build-quickstart -j "$(nproc)" --target miles

export MILES_SHARED_DIR="${MILES_SHARED_DIR:-$(pwd)/../shared}"
model="$MILES_SHARED_DIR/models/stories260K/stories260K.bin"
if [ ! -f "$model" ]; then
  echo "quickstart: $model not found (set MILES_SHARED_DIR to the folder holding models/stories260K)" >&2
  exit 1
fi
build-quickstart/bin/miles run configs/quickstart.yaml "$@"
