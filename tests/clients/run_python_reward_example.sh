#!/usr/bin/env bash
# The python reward example (examples/math_verify): its function agrees with math-verify's own
# answers in the venv's Python, then `miles run` imports it from the venv (VIRTUAL_ENV) in its
# embedded interpreter and scores a short run with it, no sample failing. Skips (77) without
# math-verify (scripts/setup.sh installs it) or stories260K.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
miles="$1"
venv="${MILES_VENV:-/root/.venvs/miles-ref}"
py="$venv/bin/python"
shared="${MILES_SHARED_DIR:-$root/../shared}"
if [ ! -f "$shared/models/stories260K/stories260K.bin" ]; then echo "skip: no stories260K"; exit 77; fi
if ! "$py" -c "import math_verify" 2>/dev/null; then echo "skip: no math-verify (scripts/setup.sh)"; exit 77; fi

# 1. The function on the answers a policy gives.
PYTHONPATH="$root/examples/math_verify" "$py" - <<'PY'
from math_reward import score
cases = [
    ("-31", -31, 1.0), ("The answer is 85.", 85, 1.0), ("$\\boxed{6}$", 6, 1.0),
    ("$\\frac{1}{2}$", 0.5, 1.0), ("0.5", "1/2", 1.0), ("85", 84, 0.0), ("no idea", 7, 0.0),
]
for response, label, want in cases:
    got = score({"prompt": "p", "response": response, "label": label,
                 "finish_reason": "stop", "response_tokens": 3})
    assert got == want, (response, label, got, want)
print(f"math_reward: {len(cases)} cases agree")
PY

# 2. In a run: imported from the venv by the embedded interpreter, every sample scored.
run="$(mktemp -d)"
trap 'rm -rf "$run"' EXIT
cd "$root"
VIRTUAL_ENV="$venv" MILES_SHARED_DIR="$shared" "$miles" run configs/quickstart_ci.yaml \
  --run-dir "$run" rollout.num_rollouts=1 logging.progress=none \
  'rewards=[{kind: python, name: math, function: "math_reward:score", python_path: examples/math_verify}]'
"$py" - "$run/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
assert len(steps) == 1, steps
assert steps[0]["reward_errors"] == 0, steps[0]
assert "reward_math_mean" in steps[0], sorted(steps[0])
print("miles run: 1 step scored by math_reward in the embedded interpreter, no reward errors")
PY
