#!/usr/bin/env bash
# Live reference check (ctest label "reference"): regenerates the HF checkpoints and goldens with
# torch + transformers into a temporary folder and requires them to equal the committed ones
# (scripts/compare_goldens.py: byte for byte, or within 1e-4 of each tensor's scale where another ISA
# or library version changes low bits) — so the goldens the default tests use are what transformers
# computes today. Skips (exit 77) where the venv has no torch/transformers (scripts/setup.sh
# --reference installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
if ! "$py" -c "import torch, transformers" 2>/dev/null; then
  echo "skip: no torch/transformers in the venv (run scripts/setup.sh --reference)"
  exit 77
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$py" "$root/scripts/make_goldens.py" --out "$out" >"$out/log.txt" 2>&1 || { cat "$out/log.txt"; exit 1; }
# Models derived from the generated ones (scripts/make_moe_check_model.py).
"$py" "$root/scripts/make_moe_check_model.py" --data-dir "$out" >>"$out/log.txt" 2>&1 ||
  { cat "$out/log.txt"; exit 1; }
files=()
for f in "$root"/tests/data/goldens/*.safetensors "$root"/tests/data/models/*/*.safetensors \
         "$root"/tests/data/models/*/config.json; do
  files+=("${f#"$root"/tests/data/}")
done
status=0
"$py" "$root/scripts/compare_goldens.py" "$root/tests/data" "$out" "${files[@]}" || status=1
[ "$status" = 0 ] && echo "all goldens equal a fresh transformers run (byte for byte, or within the tolerance above)"
exit "$status"
