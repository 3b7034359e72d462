#!/usr/bin/env bash
# Live reference check (ctest label "reference"): regenerates the draft head goldens with transformers and torch
# autograd (scripts/make_draft_goldens.py, from the committed tiny checkpoints) into a temporary folder and
# requires them to equal the committed tests/data/draft_goldens/ byte for byte. Skips (exit 77) where the
# venv has no torch/transformers (scripts/setup.sh --reference installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
if ! "$py" -c "import torch, transformers" 2>/dev/null; then
  echo "skip: no torch/transformers in the venv (run scripts/setup.sh --reference)"
  exit 77
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$py" "$root/scripts/make_draft_goldens.py" --out "$out" >"$out/log.txt" 2>&1 || { cat "$out/log.txt"; exit 1; }
status=0
for f in "$root"/tests/data/draft_goldens/*.safetensors; do
  rel="${f#"$root"/tests/data/}"
  if ! cmp -s "$f" "$out/$rel"; then
    echo "differs from live torch: tests/data/$rel"
    status=1
  fi
done
for f in "$out"/draft_goldens/*.safetensors; do
  rel="${f#"$out"/}"
  if [ ! -e "$root/tests/data/$rel" ]; then
    echo "not committed: tests/data/$rel"
    status=1
  fi
done
[ "$status" = 0 ] && echo "all draft goldens equal a fresh torch run"
exit "$status"
