// Scanners for the GPT-2, Llama-3 and Qwen2 pre-tokenizer regexes (see split_pattern.h).
//
// Why each branch reads as it does: a regex alternation tries its alternatives in order at the
// leftmost position and takes the first that matches, backtracking inside an alternative only.
// Since every code point starts some alternative here, the matches tile the text and the scanner
// only has to decide, at each position, which alternative matches first and how far it reaches.
// The two backtracking cases are spelled out where they happen: `\s+(?!\S)` gives back the last
// whitespace code point when a non-space follows, and `\s*[\r\n]+` ends after the last line break
// of the whitespace run. Case-insensitive contractions fold like Oniguruma: only ASCII letters,
// plus U+017F (long s) for 's'.
#include "tokenizer/split_pattern.h"

#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A cursor over the code points of a text.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : s_(text) {}
  size_t size() const { return s_.size(); }
  // The code point at byte offset i (i < size()) and its length.
  uint32_t at(size_t i, int* len) const {
    const auto b = static_cast<uint8_t>(s_[i]);
    if (b < 0x80) {
      *len = 1;
      return b;
    }
    uint32_t cp;
    *len = unicode::decode_utf8(s_.data() + i, s_.size() - i, &cp);
    return cp;
  }
  uint8_t flags_at(size_t i, int* len) const { return unicode::flags(at(i, len)); }
  char byte(size_t i) const { return i < s_.size() ? s_[i] : '\0'; }
  // End of the run of code points from i whose flags satisfy pred.
  template <typename Pred>
  size_t run(size_t i, Pred pred) const {
    while (i < s_.size()) {
      int len;
      if (!pred(flags_at(i, &len), i)) break;
      i += len;
    }
    return i;
  }

 private:
  std::string_view s_;
};

constexpr uint8_t kLN = unicode::kLetter | unicode::kNumber;
bool is_other(uint8_t f) { return (f & (kLN | unicode::kSpace)) == 0; }
bool is_line_break(char c) { return c == '\r' || c == '\n'; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0. Case-insensitive as Oniguruma:
// ASCII case pairs, and U+017F (UTF-8 C5 BF) folds to 's'.
size_t contraction(const Scanner& sc, size_t i, bool ignore_case) {
  if (sc.byte(i) != '\'') return 0;
  auto is = [&](size_t k, char lower) {
    const char c = sc.byte(k);
    return c == lower || (ignore_case && c == lower - 32);
  };
  if (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd')) return 2;
  if (ignore_case && sc.byte(i + 1) == '\xC5' && sc.byte(i + 2) == '\xBF') return 3;
  if ((is(i + 1, 'r') || is(i + 1, 'v')) && is(i + 2, 'e')) return 3;
  if (is(i + 1, 'l') && is(i + 2, 'l')) return 3;
  return 0;
}

// `\s+(?!\S)|\s+` at i (a whitespace code point): the run, less its last code point when a
// non-space follows and the run is longer than one.
size_t whitespace_tail(const Scanner& sc, size_t i) {
  size_t last = i;  // start of the last code point of the run
  size_t end = sc.run(i, [&](uint8_t f, size_t k) {
    if (!(f & unicode::kSpace)) return false;
    last = k;
    return true;
  });
  if (end < sc.size() && last > i) return last;
  return end;
}

// One match of the GPT-2 pattern starting at i; returns its end.
size_t match_gpt2(const Scanner& sc, size_t i) {
  if (const size_t c = contraction(sc, i, false)) return i + c;
  int len;
  size_t j = i;
  uint8_t f = sc.flags_at(i, &len);
  if (sc.byte(i) == ' ' && i + 1 < sc.size()) {
    int len2;
    const uint8_t f2 = sc.flags_at(i + 1, &len2);
    if (!(f2 & unicode::kSpace)) {  // " ?X+" with the space
      j = i + 1;
      f = f2;
    }
  }
  if (f & unicode::kLetter)
    return sc.run(j, [](uint8_t g, size_t) { return g & unicode::kLetter; });
  if (f & unicode::kNumber)
    return sc.run(j, [](uint8_t g, size_t) { return g & unicode::kNumber; });
  if (is_other(f)) return sc.run(j, [](uint8_t g, size_t) { return is_other(g); });
  return whitespace_tail(sc, i);
}

// One match of the Llama-3 / Qwen2 pattern starting at i; max_digits 3 or 1.
size_t match_llama3(const Scanner& sc, size_t i, int max_digits) {
  if (const size_t c = contraction(sc, i, true)) return i + c;
  int len;
  const uint8_t f = sc.flags_at(i, &len);
  auto letters = [&](size_t j) {
    return sc.run(j, [](uint8_t g, size_t) { return g & unicode::kLetter; });
  };
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (f & unicode::kLetter) return letters(i);
  if (!(f & kLN) && !is_line_break(sc.byte(i)) && i + len < sc.size()) {
    int len2;
    if (sc.flags_at(i + len, &len2) & unicode::kLetter) return letters(i + len);
  }
  // \p{N}{1,max}
  if (f & unicode::kNumber) {
    size_t j = i;
    for (int n = 0; n < max_digits && j < sc.size(); ++n) {
      int l;
      if (!(sc.flags_at(j, &l) & unicode::kNumber)) break;
      j += l;
    }
    return j;
  }
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  size_t j = i;
  uint8_t g = f;
  if (sc.byte(i) == ' ' && i + 1 < sc.size()) {
    int l;
    const uint8_t g2 = sc.flags_at(i + 1, &l);
    if (is_other(g2)) j = i + 1, g = g2;
  }
  if (is_other(g)) {
    size_t end = sc.run(j, [](uint8_t h, size_t) { return is_other(h); });
    while (is_line_break(sc.byte(end))) ++end;
    return end;
  }
  // \s*[\r\n]+ : the whitespace run up to and including its last line break.
  size_t last_break = SIZE_MAX;
  sc.run(i, [&](uint8_t h, size_t k) {
    if (!(h & unicode::kSpace)) return false;
    if (is_line_break(sc.byte(k))) last_break = k;
    return true;
  });
  if (last_break != SIZE_MAX) return last_break + 1;
  return whitespace_tail(sc, i);
}

}  // namespace

std::optional<SplitPattern> pattern_from_regex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

std::string_view regex_of(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2:
      return kGpt2Regex;
    case SplitPattern::kLlama3:
      return kLlama3Regex;
    case SplitPattern::kQwen2:
    default:
      return kQwen2Regex;
  }
}

void find_matches(SplitPattern p, std::string_view text, std::vector<Span>& out) {
  const Scanner sc(text);
  for (size_t i = 0; i < text.size();) {
    size_t end;
    switch (p) {
      case SplitPattern::kGpt2:
        end = match_gpt2(sc, i);
        break;
      case SplitPattern::kLlama3:
        end = match_llama3(sc, i, 3);
        break;
      case SplitPattern::kQwen2:
      default:
        end = match_llama3(sc, i, 1);
        break;
    }
    out.push_back({i, end});
    i = end;
  }
}

}  // namespace miles::tokenizer
