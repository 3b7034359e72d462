#!/usr/bin/env bash
# Live reference check (ctest label "reference"): trainer checkpoints are Hugging Face model
# directories. The train_checkpoint_test gtest ExportForTransformers trains tiny models two steps,
# saves checkpoints and our logits on a fixed prompt into $MILES_EXPORT_DIR; transformers'
# AutoModelForCausalLM.from_pretrained loads each (no missing / unexpected keys) and its logits must
# match ours within 1e-4. Skips (exit 77) where the venv has no torch/transformers.
# Usage: check_hf_export.sh PATH/TO/train_checkpoint_test
set -euo pipefail
test_bin="${1:?usage: check_hf_export.sh PATH/TO/train_checkpoint_test}"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
if ! "$py" -c "import torch, transformers, safetensors" 2>/dev/null; then
  echo "skip: no torch/transformers in the venv (run scripts/setup.sh --reference)"
  exit 77
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
MILES_EXPORT_DIR="$out" "$test_bin" --gtest_filter='TrainCheckpoint.ExportForTransformers' \
  >"$out/gtest.log" 2>&1 || { cat "$out/gtest.log"; exit 1; }
"$py" - "$out" <<'PY'
import os, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

root = sys.argv[1]
dirs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
if not dirs:
    sys.exit("no exported checkpoints")
bad = 0
for name in dirs:
    d = os.path.join(root, name)
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                       output_loading_info=True)
    problems = {k: v for k, v in info.items() if k != "error_msgs" and v}
    ours = load_file(os.path.join(d, "miles_logits.safetensors"))
    with torch.no_grad():
        theirs = model(ours["input_ids"].long()[None]).logits[0]
    diff = (theirs - ours["logits"]).abs().max().item()
    ok = diff <= 1e-4 and not problems
    bad += not ok
    print(f"{name:20s} max|dlogits| {diff:.2e} {'ok' if ok else 'FAIL'} {problems or ''}")
sys.exit(1 if bad else 0)
PY
