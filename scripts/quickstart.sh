#!/usr/bin/env bash
# The main job on an embedded default. For now: set up, build, and generate a story with stories260K
# (greedy: llama2.c's reference continuation). Later: the RL quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target miles

shared="${MILES_SHARED_DIR:-$(pwd)/../shared}"
model="$shared/models/stories260K/stories260K.bin"
if [ ! -f "$model" ]; then
  echo "quickstart: $model not found (set MILES_SHARED_DIR to the folder holding models/stories260K)" >&2
  exit 1
fi
build/bin/miles generate --model "$model" --prompt "${1:-Once upon a time}" --temperature 0 \
  --max-new-tokens 56
