#!/usr/bin/env bash
# The whole CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (and LeakSanitizer):
# a separate build in build-asan/ (CUDA off), every undefined-behaviour report fatal, leaks fatal.
# The multi-process tests start the instrumented `miles` from that build, so the workers, engines
# and controllers they spawn are checked too. Takes ~25 min to build and ~10 min to test on two
# cores; not part of scripts/test.sh.
#
#   scripts/sanitize.sh [ctest arguments, e.g. -R Engine]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMILES_CUDA=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-asan -j "$(nproc)"
cd build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest -j "$(nproc)" --timeout 900 -LE reference --output-on-failure "$@"
