#!/usr/bin/env bash
# Installs everything miles needs on a fresh Debian machine, idempotently.
#
#   scripts/setup.sh              system packages (compiler, CMake, libraries) and the light Python venv
#   scripts/setup.sh --reference  also torch + transformers in the venv (only to regenerate goldens or run
#                                 the live-reference tests; the default test run never needs them)
#   scripts/setup.sh --run-only   only what building and running `miles` needs (scripts/quickstart.sh):
#                                 no test libraries, browser, clang or Python venv
#
# The Python venv lives outside the repository (MILES_VENV, default /root/.venvs/miles-ref) so that it
# survives between checkouts.
set -euo pipefail

want_reference=0
run_only=0
for arg in "$@"; do
  case "$arg" in
    --reference) want_reference=1 ;;
    --run-only) run_only=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (known: --reference, --run-only)" >&2; exit 2 ;;
  esac
done

MILES_VENV="${MILES_VENV:-/root/.venvs/miles-ref}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# What building `miles` needs (MILES_TESTS=OFF); the rest is for tests, fuzzers and Python tools.
build_packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev
  libgloo-dev libzstd-dev libxxhash-dev libcli11-dev libcpp-httplib-dev
  libssl-dev libpython3-dev
  libonig-dev  # Oniguruma, the regex engine of tokenizer Split patterns (src/tokenizer/regex.h)
)
test_packages=(
  clang-14 libclang-rt-14-dev lld-14
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-pip unzip curl
  # tests/report_test.cc renders the `miles report` page in headless Chromium (skipped without it)
  chromium
)
apt_packages=("${build_packages[@]}")
if [ "$run_only" = 0 ]; then apt_packages+=("${test_packages[@]}"); fi

missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: system packages present"
fi

if [ "$run_only" = 1 ]; then
  echo "setup.sh: done (run-only: no Python venv)"
  exit 0
fi

python_bin="$(command -v python3)"
if [ ! -x "$MILES_VENV/bin/python" ]; then
  echo "setup.sh: creating venv $MILES_VENV"
  mkdir -p "$(dirname "$MILES_VENV")"
  "$python_bin" -m venv "$MILES_VENV"
fi
pip_install() {
  "$MILES_VENV/bin/python" -m pip install --disable-pip-version-check -q "$@"
}
# openai and sglang-router: the real clients the engine's API is tested with (tests/clients);
# tensorboard: its readers check the event files a run writes; math-verify: the python reward
# example (examples/math_verify).
light=(numpy safetensors jinja2 gguf openai sglang-router==0.3.2 tensorboard math-verify==0.8.0)
if ! "$MILES_VENV/bin/python" -c "import numpy, safetensors, jinja2, gguf, openai, sglang_router, tensorboard, math_verify" 2>/dev/null; then
  pip_install "${light[@]}"
fi
# The sglang package's own client (its frontend, sglang.RuntimeEndpoint): 0.5.5 is the newest release
# whose frontend imports without torch; its wheel is installed without the server's dependencies
# (torch, CUDA kernels), with what the frontend imports.
if ! "$MILES_VENV/bin/python" -c "import sglang; from sglang import RuntimeEndpoint" 2>/dev/null; then
  pip_install --no-deps sglang==0.5.5
  pip_install pybase64 IPython pydantic aiohttp requests tqdm
fi
if [ "$want_reference" = 1 ]; then
  if ! "$MILES_VENV/bin/python" -c "import torch, transformers, tokenizers, accelerate" 2>/dev/null; then
    pip_install torch transformers tokenizers accelerate
  fi
fi
echo "setup.sh: done (venv: $MILES_VENV)"
