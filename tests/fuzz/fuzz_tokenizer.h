// The tokenizer the request fuzzers decode and encode with: the synthetic GPT-2-style vocabulary
// under tests/data, loaded once per process (null if it cannot be read).
#pragma once

#include <memory>
#include <string>

#include "miles/tokenizer.h"

namespace miles::fuzz {

inline const Tokenizer* test_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = load_tokenizer(
        std::string(MILES_SOURCE_DIR) + "/tests/data/tokenizers/synthetic/gpt2_style.json", 0);
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return tok.get();
}

}  // namespace miles::fuzz
