#!/usr/bin/env bash
# Starts `miles serve` on SmolLM2-135M-Instruct (scripts/get_models.sh) on a free loopback port and
# runs a real client's check script against it: run_against_serve.sh MILES PACKAGE SCRIPT, where
# PACKAGE is the Python package the script drives (openai, sglang) and SCRIPT takes the base URL.
# Skips (77) without the model or the client package.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
miles="$1" package="$2" script="$3"
model="$root/models/smollm2-135m-instruct"
py="${MILES_VENV:-/root/.venvs/miles-ref}/bin/python"
if [ ! -f "$model/config.json" ]; then echo "skip: $model missing (scripts/get_models.sh)"; exit 77; fi
if ! "$py" -c "import $package" 2>/dev/null; then echo "skip: no $package package (scripts/setup.sh)"; exit 77; fi
port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
log="$(mktemp)"
"$miles" serve --model "$model" --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
  if "$py" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then break; fi
  if ! kill -0 $pid 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.2
done
"$py" "$root/tests/clients/$script" "http://127.0.0.1:$port"
