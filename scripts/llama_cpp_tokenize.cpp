// llama.cpp's ids for each line of tests/data/tokenizers/corpus.jsonl: the reference for GGUF
// vocabularies llama.cpp ships no vectors for (tests/data/tokenizers/llama_cpp/*.ids).
//
//   ./llama_cpp_tokenize MODEL.gguf [special] < tests/data/tokenizers/corpus.jsonl > NAME.ids
//
// llama_tokenize(add_special=false, parse_special=argc > 2) on the vocabulary alone. Built against
// the llama.cpp that llama-cpp-python 0.3.36's sdist vendors (scripts/get_tokenizer_vectors.sh
// fetches that sdist): extract vendor/llama.cpp, then
//   cmake -S vendor/llama.cpp -B /tmp/lcpb -G Ninja -DCMAKE_BUILD_TYPE=Release
//   -DLLAMA_BUILD_TOOLS=OFF \
//     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_COMMON=OFF -DGGML_NATIVE=OFF
//     \ -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF && ninja -C /tmp/lcpb llama
//   g++ -O1 -std=c++17 scripts/llama_cpp_tokenize.cpp -Ivendor/llama.cpp/include \
//     -Ivendor/llama.cpp/ggml/include /tmp/lcpb/src/libllama.a /tmp/lcpb/ggml/src/libggml.a \
//     /tmp/lcpb/ggml/src/libggml-cpu.a /tmp/lcpb/ggml/src/libggml-base.a -fopenmp -lpthread -ldl
// The corpus lines are JSON strings; a small decoder below reads them (no JSON library needed).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "llama.h"

static std::string unjson(const std::string& s) {
  std::string out;
  for (size_t i = 1; i + 1 < s.size(); ++i) {
    char c = s[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    char e = s[++i];
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case '/':
        out += '/';
        break;
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case 'u': {
        unsigned cp = std::stoul(s.substr(i + 1, 4), nullptr, 16);
        i += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          unsigned lo = std::stoul(s.substr(i + 3, 4), nullptr, 16);
          i += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp < 0x80)
          out += char(cp);
        else if (cp < 0x800) {
          out += char(0xC0 | (cp >> 6));
          out += char(0x80 | (cp & 63));
        } else if (cp < 0x10000) {
          out += char(0xE0 | (cp >> 12));
          out += char(0x80 | ((cp >> 6) & 63));
          out += char(0x80 | (cp & 63));
        } else {
          out += char(0xF0 | (cp >> 18));
          out += char(0x80 | ((cp >> 12) & 63));
          out += char(0x80 | ((cp >> 6) & 63));
          out += char(0x80 | (cp & 63));
        }
        break;
      }
    }
  }
  return out;
}

int main(int argc, char** argv) {
  llama_backend_init();
  auto mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* m = llama_model_load_from_file(argv[1], mp);
  if (!m) return 1;
  const llama_vocab* v = llama_model_get_vocab(m);
  const bool special = argc > 2;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::string text = unjson(line);
    std::vector<llama_token> ids(text.size() * 2 + 16);
    int n = llama_tokenize(v, text.data(), text.size(), ids.data(), ids.size(), false, special);
    for (int i = 0; i < n; ++i) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
  }
  return 0;
}
