// The pre-tokenizer regexes we know, as hand-written scanners.
//
// Why scanners beside a regex engine: HF runs these patterns through Oniguruma, which is several
// times slower than the rest of tokenization; llama.cpp hand-writes them too. Each scanner
// reproduces Oniguruma's leftmost-first alternation and backtracking for its one pattern over UTF-8
// code points, with the character classes of unicode.h. They are fast paths of SplitRegex
// (regex.h) only: every other pattern runs through Oniguruma, and tests/tokenizer_regex_test.cc
// runs each scanner and Oniguruma side by side over the corpus and random text.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace miles::tokenizer {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // (GPT-2; the ByteLevel pre-tokenizer's built-in regex; SmolLM2)
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+  (Llama 3)
  kLlama3,
  // The same with \p{N} instead of \p{N}{1,3} (Qwen2, Qwen2.5, Qwen3).
  kQwen2,
};

// The pattern whose regex source is exactly `regex`, or nothing.
std::optional<SplitPattern> pattern_from_regex(std::string_view regex);
// The regex source of `p`.
std::string_view regex_of(SplitPattern p);

struct Span {
  size_t begin, end;  // byte offsets
};

// A span of a text cut by a pattern, flagged as a match of the pattern or a gap between matches.
struct Part {
  Span span;
  bool is_match;
};

// Appends the matches of `p` in `text`, in order, as Oniguruma's find_iter returns them. Every
// byte of `text` lies in exactly one match (these patterns match any code point), so the spans
// tile the text.
void find_matches(SplitPattern p, std::string_view text, std::vector<Span>& out);

}  // namespace miles::tokenizer
