#!/usr/bin/env bash
# sglang-router (PyPI, the Rust router SGLang deployments put in front of their engines) over two
# `miles serve` engines on loopback: it registers both (health checks), balances /generate and
# /v1/completions round robin over them, and takes a killed engine out while the other keeps
# serving. Skips (77) without the router package (scripts/setup.sh installs it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
miles="$1"
model="$root/../shared/models/stories260K"
[ -n "${MILES_SHARED_DIR:-}" ] && model="$MILES_SHARED_DIR/models/stories260K"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
if [ ! -f "$model/stories260K.bin" ]; then echo "skip: $model missing"; exit 77; fi
if ! "$py" -c "import sglang_router" 2>/dev/null; then echo "skip: no sglang_router package (scripts/setup.sh)"; exit 77; fi
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p1="$(free_port)"; p2="$(free_port)"; pr="$(free_port)"
logs="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$logs"; }
trap cleanup EXIT
for p in "$p1" "$p2"; do
  "$miles" serve --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" --host 127.0.0.1 \
    --port "$p" --threads 1 --num-blocks 512 >"$logs/engine-$p.log" 2>&1 &
  pids+=($!)
done
engine2=${pids[1]}
wait_http() {
  for _ in $(seq 1 150); do
    if "$py" -c "import urllib.request,sys; urllib.request.urlopen('$1', timeout=1)" 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "no answer from $1"; cat "$logs"/*.log; return 1
}
wait_http "http://127.0.0.1:$p1/health"
wait_http "http://127.0.0.1:$p2/health"
"$py" -m sglang_router.launch_router --worker-urls "http://127.0.0.1:$p1" "http://127.0.0.1:$p2" \
  --host 127.0.0.1 --port "$pr" --policy round_robin --health-check-interval-secs 1 \
  --health-failure-threshold 1 --health-check-timeout-secs 1 --log-level warn >"$logs/router.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$pr/health" || { cat "$logs/router.log"; exit 1; }
MILES_ENGINES="$p1 $p2" MILES_ROUTER="$pr" MILES_ENGINE2_PID="$engine2" \
  "$py" "$root/tests/clients/sglang_router_check.py"
