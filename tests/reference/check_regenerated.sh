#!/usr/bin/env bash
# Live reference check (ctest label "reference"): runs the golden generator scripts/GENERATOR (from
# the committed tiny checkpoints) into a temporary folder and requires its FOLDER to equal the
# committed tests/data/FOLDER/ (scripts/compare_goldens.py: byte for byte, or within 1e-4 of each
# tensor's scale where another ISA or library version changes low bits), every file of either side
# present in the other. Skips
# (exit 77) where the venv has no torch/transformers (scripts/setup.sh --reference installs them).
# Usage: check_regenerated.sh GENERATOR FOLDER
set -euo pipefail
generator="$1"
folder="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
if ! "$py" -c "import torch, transformers" 2>/dev/null; then
  echo "skip: no torch/transformers in the venv (run scripts/setup.sh --reference)"
  exit 77
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$py" "$root/scripts/$generator" --out "$out" >"$out/log.txt" 2>&1 || { cat "$out/log.txt"; exit 1; }
status=0
files=()
for f in "$root/tests/data/$folder"/*.safetensors; do files+=("${f#"$root"/tests/data/}"); done
"$py" "$root/scripts/compare_goldens.py" "$root/tests/data" "$out" "${files[@]}" || status=1
for f in "$out/$folder"/*.safetensors; do
  rel="${f#"$out"/}"
  if [ ! -e "$root/tests/data/$rel" ]; then
    echo "not committed: tests/data/$rel"
    status=1
  fi
done
[ "$status" = 0 ] && echo "all of tests/data/$folder equal a fresh torch run (byte for byte, or within the tolerance above)"
exit "$status"
