#!/usr/bin/env bash
# Installs everything miles needs on a fresh Debian machine, idempotently.
#
#   scripts/setup.sh              system packages (compiler, CMake, libraries) and the light Python venv
#   scripts/setup.sh --reference  also torch + transformers in the venv (only to regenerate goldens or run
#                                 the live-reference tests; the default test run never needs them)
#   scripts/setup.sh --run-only   only what building and running `miles` needs (scripts/quickstart.sh):
#                                 no test libraries, browser, clang or Python venv
#   scripts/setup.sh --trl        also a venv of its own with torch, transformers, accelerate, datasets
#                                 and TRL, for the TRL GRPO baseline (scripts/trl_grpo.py); combines with
#                                 the others (--run-only --trl: the build packages and that venv only)
#
# The Python venvs live outside the repository (MILES_VENV, default /root/.venvs/miles-ref; the TRL one
# MILES_TRL_VENV, default /root/.venvs/trl) so that they survive between checkouts. The TRL venv is kept
# apart so that TRL's pins never move the torch / transformers the goldens (--reference) are made with.
# Its torch: from MILES_TORCH_INDEX_URL when set (a pip index of CPU-only torch wheels, where one can
# be reached), else PyPI's wheel (its CUDA build, which runs on the CPU as well; a larger download).
set -euo pipefail

want_reference=0
run_only=0
want_trl=0
for arg in "$@"; do
  case "$arg" in
    --reference) want_reference=1 ;;
    --run-only) run_only=1 ;;
    --trl) want_trl=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (known: --reference, --run-only, --trl)" >&2; exit 2 ;;
  esac
done

MILES_VENV="${MILES_VENV:-/root/.venvs/miles-ref}"
MILES_TRL_VENV="${MILES_TRL_VENV:-/root/.venvs/trl}"
# scripts/trl_grpo.py hooks into GRPOTrainer's internals (see its docstring): the TRL release it was
# written against.
TRL_VERSION="1.16.0"
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
if [ "$want_trl" = 1 ]; then apt_packages+=(python3 python3-venv python3-pip); fi

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

# The TRL baseline's venv (--trl): torch, transformers, accelerate, datasets, PyYAML and TRL.
install_trl_venv() {
  if [ ! -x "$MILES_TRL_VENV/bin/python" ]; then
    echo "setup.sh: creating venv $MILES_TRL_VENV"
    mkdir -p "$(dirname "$MILES_TRL_VENV")"
    python3 -m venv "$MILES_TRL_VENV"
  fi
  local py="$MILES_TRL_VENV/bin/python"
  if "$py" -c "import torch, transformers, accelerate, datasets, yaml, trl; assert trl.__version__ == '$TRL_VERSION'" 2>/dev/null; then
    echo "setup.sh: TRL venv present ($MILES_TRL_VENV)"
    return
  fi
  if ! "$py" -c "import torch" 2>/dev/null; then
    if [ -n "${MILES_TORCH_INDEX_URL:-}" ]; then
      "$py" -m pip install --disable-pip-version-check -q --index-url "$MILES_TORCH_INDEX_URL" torch
    else
      "$py" -m pip install --disable-pip-version-check -q torch
    fi
  fi
  "$py" -m pip install --disable-pip-version-check -q transformers accelerate datasets pyyaml "trl==$TRL_VERSION"
  "$py" -c "import torch, transformers, trl; print('setup.sh: TRL venv: torch', torch.__version__, '/ transformers', transformers.__version__, '/ trl', trl.__version__)"
}
if [ "$want_trl" = 1 ]; then install_trl_venv; fi

if [ "$run_only" = 1 ]; then
  echo "setup.sh: done (run-only: no Python venv$(if [ "$want_trl" = 1 ]; then echo " but the TRL one"; fi))"
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
if [ "$want_trl" = 1 ]; then
  echo "setup.sh: done (venv: $MILES_VENV, TRL venv: $MILES_TRL_VENV)"
else
  echo "setup.sh: done (venv: $MILES_VENV)"
fi
