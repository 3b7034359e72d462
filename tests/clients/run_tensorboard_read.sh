#!/usr/bin/env bash
# A short RL run (configs/quickstart_ci.yaml, 3 steps) whose RUN_DIR/tensorboard is read back by
# TensorBoard's own Python readers (tensorboard_read.py). Skips (77) without the model or tensorboard.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
miles="$1"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
shared="${MILES_SHARED_DIR:-$root/../shared}"
if [ ! -f "$shared/models/stories260K/stories260K.bin" ]; then echo "skip: no stories260K"; exit 77; fi
if ! "$py" -c "import tensorboard" 2>/dev/null; then echo "skip: no tensorboard package (scripts/setup.sh)"; exit 77; fi
run="$(mktemp -d)"
trap 'rm -rf "$run"' EXIT
cd "$root"
MILES_SHARED_DIR="$shared" "$miles" run configs/quickstart_ci.yaml --run-dir "$run" \
  rollout.num_rollouts=3 logging.progress=none
"$py" "$root/tests/clients/tensorboard_read.py" "$run"
