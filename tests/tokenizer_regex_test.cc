// SplitRegex: Oniguruma run as HF `tokenizers` runs it, and the scanners that stand in for it.
//
// The scanners of split_pattern.h and the \p{N} class runs are fast paths only because these
// tests prove them identical to Oniguruma: every corpus string and 20000 random strings (letters
// of several scripts and cases, digits of several kinds, every kind of whitespace, apostrophe
// contractions, U+017F, marks, punctuation, symbols, CJK, emoji and ill-formed bytes) cut into
// the same parts by both. Also:
// the `onig` crate's find_iter around empty matches, ill-formed bytes, compile errors, and every
// pattern of llama.cpp's pre-tokenizer table compiling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"
#include "tokenizer/gguf_pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

using namespace std::string_literals;

struct Cut {
  size_t begin, end;
  bool match;
  bool operator==(const Cut&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Cut& c) {
  return os << "[" << c.begin << "," << c.end << (c.match ? ")m" : ")g");
}

std::vector<Cut> cuts(const SplitRegex& re, std::string_view text) {
  std::vector<Part> parts;
  re.find_parts(text, parts);
  std::vector<Cut> out;
  for (const Part& p : parts) out.push_back({p.span.begin, p.span.end, p.is_match});
  return out;
}

std::shared_ptr<const SplitRegex> compile(std::string_view pattern, SplitRegex::Engine engine) {
  auto re = SplitRegex::compile(pattern, engine);
  EXPECT_TRUE(re.ok()) << re.message();
  return re.ok() ? std::move(re).value() : nullptr;
}

std::vector<std::string> corpus() {
  std::ifstream f(test::data_dir() + "/tokenizers/corpus.jsonl");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

// Random text from pieces chosen to exercise every alternative of the three patterns.
std::vector<std::string> random_texts(size_t n) {
  static const std::vector<std::string> pieces = {
      "a",
      "Z",
      "q",
      "s",
      "t",
      "re",
      "ve",
      "m",
      "ll",
      "d",
      "S",
      "T",
      "RE",
      "Ve",
      "LL",
      "D",
      "'",
      "'",
      "\xC5\xBF" /* U+017F long s */,
      "K",
      "0",
      "7",
      "123",
      "\xD9\xA3" /* Arabic 3 */,
      "\xC2\xB2" /* superscript 2 */,
      "\xE2\x85\xAB" /* roman XII */,
      " ",
      " ",
      "  ",
      "\t",
      "\n",
      "\r",
      "\r\n",
      "\v",
      "\f",
      "\xC2\xA0" /* NBSP */,
      "\xE3\x80\x80" /* ideographic space */,
      "\xE2\x80\xA8" /* line separator */,
      "\xC2\x85" /* NEL */,
      ".",
      ",",
      "!",
      "?",
      "-",
      "$",
      "+",
      "<",
      "=",
      "/",
      "\\",
      "(",
      ")",
      "_",
      "`",
      "~",
      "|",
      "^",
      "\xC3\xA9" /* é */,
      "e\xCC\x81" /* e + combining acute */,
      "\xCC\x81",
      "\xC3\x9F" /* ß */,
      "\xCE\xA9",
      "\xD0\x96\xD0\xB6",
      "\xE4\xBD\xA0\xE5\xA5\xBD" /* 你好 */,
      "\xE3\x81\x82" /* あ */,
      "\xEA\xB0\x80" /* 가 */,
      "\xD8\xB9\xD8\xB1\xD8\xA8" /* Arabic */,
      "\xE0\xA4\xB9\xE0\xA4\xBF" /* Devanagari with a mark */,
      "\xF0\x9F\x98\x80" /* emoji */,
      "\xE2\x82\xAC" /* euro */,
      "\xEF\xBF\xBD",
      "\xFF",
      "\xC3",
      "\x80",
      "\x00"s,
      "\xE2\x80\x8B" /* zero-width space */,
      "\xEF\xBB\xBF" /* BOM */};
  std::mt19937 rng(29);
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    std::string s;
    const size_t len = 1 + rng() % 24;
    for (size_t k = 0; k < len; ++k) s += pieces[rng() % pieces.size()];
    out.push_back(std::move(s));
  }
  return out;
}

// Code points whose \p{L}, \p{N} or \s class in the Oniguruma we link differs from HF's (the
// tables of unicode.h, measured from HF `tokenizers` 0.23, whose bundled Oniguruma 6.9.10 has
// Unicode 16 data; Debian bookworm's 6.9.8 has Unicode 14's): the letters and digits Unicode 15
// and 16 added. The scanners follow HF on them; Oniguruma sees them as unassigned.
const std::vector<uint32_t>& engine_differs() {
  static const std::vector<uint32_t> out = [] {
    std::vector<uint32_t> v;
    const std::pair<const char*, uint8_t> classes[] = {
        {R"(\p{L})", unicode::kLetter}, {R"(\p{N})", unicode::kNumber}, {R"(\s)", unicode::kSpace}};
    std::vector<std::shared_ptr<const SplitRegex>> res;
    for (const auto& c : classes) res.push_back(compile(c.first, SplitRegex::Engine::kOniguruma));
    std::vector<Part> parts;
    for (uint32_t cp = 1; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string s;
      unicode::append_utf8(cp, s);
      for (size_t k = 0; k < res.size(); ++k) {
        parts.clear();
        res[k]->find_parts(s, parts);
        const bool onig = parts.size() == 1 && parts[0].is_match;
        if (onig != ((unicode::flags(cp) & classes[k].second) != 0)) {
          v.push_back(cp);
          break;
        }
      }
    }
    return v;
  }();
  return out;
}

bool has_differing(std::string_view text) {
  const auto& d = engine_differs();
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    i += unicode::decode_utf8(text.data() + i, text.size() - i, &cp);
    if (std::binary_search(d.begin(), d.end(), cp)) return true;
  }
  return false;
}

TEST(SplitRegex, OnigurumaClassesDifferFromHfOnlyOnUnicode15And16) {
  const auto& d = engine_differs();
  // Debian bookworm's Oniguruma 6.9.8 (Unicode 14) against HF 0.23's tables (Unicode 16): exactly
  // the 9392 code points unassigned in Unicode 14 that HF classes as letters, digits or spaces
  // (counted with Python's unicodedata 14.0), none below U+1C89. A newer Oniguruma differs less.
  EXPECT_LE(d.size(), 9392u);
  if (!d.empty()) {
    EXPECT_GE(d.front(), 0x1C89u);
  }
  std::printf("Oniguruma and HF classify %zu code points differently\n", d.size());
}

class ScannerVsOniguruma : public ::testing::TestWithParam<std::string_view> {};

TEST_P(ScannerVsOniguruma, SameCutsOnTheCorpusAndRandomText) {
  const auto fast = compile(GetParam(), SplitRegex::Engine::kFastest);
  const auto onig = compile(GetParam(), SplitRegex::Engine::kOniguruma);
  ASSERT_TRUE(fast && onig);
  ASSERT_TRUE(fast->fast()) << "the pattern lost its fast path";
  ASSERT_FALSE(onig->fast());
  std::vector<std::string> texts = corpus();
  ASSERT_GT(texts.size(), 500u);
  const std::vector<std::string> random = random_texts(20000);
  texts.insert(texts.end(), random.begin(), random.end());
  size_t differ = 0, skipped = 0;
  for (const std::string& t : texts) {
    if (has_differing(t)) {  // Unicode 15-16 characters: see engine_differs
      ++skipped;
      continue;
    }
    const auto a = cuts(*fast, t), b = cuts(*onig, t);
    if (a != b && ++differ <= 5)
      ADD_FAILURE() << nlohmann::json(t).dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace)
                    << "\n scanner:   " << ::testing::PrintToString(a)
                    << "\n oniguruma: " << ::testing::PrintToString(b);
  }
  EXPECT_EQ(differ, 0u) << "of " << texts.size() << " texts";
  EXPECT_LT(skipped, 100u) << "texts with Unicode 15-16 characters";
}

INSTANTIATE_TEST_SUITE_P(Patterns, ScannerVsOniguruma,
                         ::testing::Values(regex_of(SplitPattern::kGpt2),
                                           regex_of(SplitPattern::kLlama3),
                                           regex_of(SplitPattern::kQwen2), R"(\p{N})",
                                           R"(\p{N}{1,3})", R"(\p{N}+)"));

// The `onig` crate's find_iter: an empty match right after a match is skipped and the search goes
// on one code point further; HF keeps the other empty matches as (empty) parts.
TEST(SplitRegex, EmptyMatchesAsTheOnigCrateFindsThem) {
  const auto re = compile("a*", SplitRegex::Engine::kFastest);
  ASSERT_TRUE(re);
  EXPECT_EQ(
      cuts(*re, "baac"),
      (std::vector<Cut>{{0, 0, true}, {0, 1, false}, {1, 3, true}, {3, 4, false}, {4, 4, true}}));
  // One code point further means a whole UTF-8 sequence.
  EXPECT_EQ(cuts(*re, "\xC3\xA9"), (std::vector<Cut>{{0, 0, true}, {0, 2, false}, {2, 2, true}}));
}

TEST(SplitRegex, GapsBetweenMatchesAndIllFormedBytes) {
  const auto re = compile(R"(\p{L}+)", SplitRegex::Engine::kFastest);
  ASSERT_TRUE(re);
  EXPECT_FALSE(re->scanner().has_value());
  EXPECT_EQ(cuts(*re, "ab, cd"), (std::vector<Cut>{{0, 2, true}, {2, 4, false}, {4, 6, true}}));
  // An ill-formed byte is matched as U+FFFD (not a letter), alone, at its own offset.
  EXPECT_EQ(cuts(*re, "ab\xFF\xC3\xA9x"),
            (std::vector<Cut>{{0, 2, true}, {2, 3, false}, {3, 6, true}}));
  const auto any = compile(".", SplitRegex::Engine::kFastest);
  ASSERT_TRUE(any);
  EXPECT_EQ(cuts(*any, "\xC3\xA9\xFF"), (std::vector<Cut>{{0, 2, true}, {2, 3, true}}));
}

TEST(SplitRegex, OnigurumaSyntaxAsHfUsesIt) {
  // Case folding is Unicode's: (?i) lets 's match U+017F, as HF's Oniguruma does.
  const auto re = compile("(?i:'s)", SplitRegex::Engine::kOniguruma);
  ASSERT_TRUE(re);
  EXPECT_EQ(cuts(*re, "'\xC5\xBF"), (std::vector<Cut>{{0, 3, true}}));
  // Possessive quantifiers and look-behind compile.
  EXPECT_TRUE(SplitRegex::compile(R"(\p{N}++(?<=9))").ok());
}

TEST(SplitRegex, APatternOnigurumaRefusesIsAnErrorNamingIt) {
  auto re = SplitRegex::compile("(ab");
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.message().find("\"(ab\""), std::string::npos) << re.message();
  EXPECT_NE(re.message().find("Oniguruma"), std::string::npos) << re.message();
}

// Every name of llama.cpp's table is either a list of patterns that compile or refused with a
// reason; the common ones keep their fast paths.
TEST(GgufPreTokenizerTable, EveryNameCompilesOrIsRefused) {
  const auto names = gguf_pre_tokenizer_names();
  EXPECT_GE(names.size(), 90u);
  size_t supported = 0;
  for (const std::string_view name : names) {
    auto def = gguf_pre_tokenizer(name);
    if (!def.ok()) {
      EXPECT_NE(def.message().find("is not supported"), std::string::npos) << def.message();
      continue;
    }
    ++supported;
    ASSERT_FALSE(def->regexes.empty()) << name;
    for (const std::string_view r : def->regexes) {
      auto re = SplitRegex::compile(r);
      EXPECT_TRUE(re.ok()) << name << ": " << re.message();
    }
  }
  EXPECT_EQ(supported, names.size() - 3);  // kimi-k2, afmoe, whitespace
  for (const char* name : {"gpt-2", "llama-bpe", "qwen2"}) {
    auto def = gguf_pre_tokenizer(name);
    ASSERT_TRUE(def.ok());
    auto re = SplitRegex::compile(def->regexes.back());
    ASSERT_TRUE(re.ok());
    EXPECT_TRUE((*re)->scanner().has_value()) << name;
  }
  EXPECT_FALSE(gguf_pre_tokenizer("no-such-name").ok());
  EXPECT_TRUE(gguf_pre_tokenizer("").ok());  // llama.cpp's "default"
}

}  // namespace
}  // namespace miles::tokenizer
