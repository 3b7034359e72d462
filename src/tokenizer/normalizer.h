// Normalization: HF's normalizers, the text edits a tokenizer.json makes before pre-tokenizing.
//
// Why a list of steps: HF composes normalizers (Sequence of NFC, NFKC, Lowercase, Replace,
// Prepend, Strip, ...), each rewriting the whole text the previous one produced; the ids depend
// only on the final text, so each step here is a plain string function and the list runs in
// order. The common cases cost nothing: a text NFC leaves alone (quick check) is not copied.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace miles::tokenizer {

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend, kStrip };
  Kind kind = Kind::kNfc;
  std::string literal;                      // kReplace with a String pattern; kPrepend: the prefix
  std::shared_ptr<const SplitRegex> regex;  // kReplace with a Regex pattern
  std::string content;                      // kReplace: what each match becomes
  bool strip_left = false, strip_right = false;  // kStrip: whitespace at either end
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  // The normalized text: `text` itself when no step changes it, else a view of `buffer`.
  std::string_view run(std::string_view text, std::string& buffer) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace miles::tokenizer
