// The tokenizers' building blocks on their own: UTF-8 decoding, character classes and NFC as HF
// `tokenizers` has them, the pre-tokenizer regex scanners, HF's split behaviors, the added-token
// matcher and the BPE merge loop. The end-to-end parity with HF lives in tokenizer_hf_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/split_pattern.h"
#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

std::vector<std::string> pieces(SplitPattern p, const std::string& s) {
  std::vector<Span> spans;
  find_matches(p, s, spans);
  std::vector<std::string> out;
  for (const Span& sp : spans) out.push_back(s.substr(sp.begin, sp.end - sp.begin));
  return out;
}

using Strings = std::vector<std::string>;

TEST(Unicode, DecodesUtf8AndTreatsIllFormedBytesOneByOne) {
  uint32_t cp;
  EXPECT_EQ(unicode::decode_utf8("a", 1, &cp), 1);
  EXPECT_EQ(cp, 'a');
  EXPECT_EQ(unicode::decode_utf8("\xC3\xA9", 2, &cp), 2);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(unicode::decode_utf8("\xF0\x9F\xA6\x99", 4, &cp), 4);
  EXPECT_EQ(cp, 0x1F999u);
  for (const std::string bad : {"\xC0\x80", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                                "\x80", "\xC3", "\xE4\xB8", "\xFF"}) {
    EXPECT_EQ(unicode::decode_utf8(bad.data(), bad.size(), &cp), 1) << bad;
    EXPECT_EQ(cp, unicode::kInvalid);
  }
}

TEST(Unicode, AsciiFastPathAgreesWithTheTables) {
  for (uint32_t c = 0; c < 128; ++c)
    EXPECT_EQ(unicode::detail::ascii_flags(c), unicode::detail::flags_from_table(c)) << c;
}

TEST(Unicode, ClassesAreHfs) {
  using unicode::flags;
  EXPECT_TRUE(flags(0x4E2D) & unicode::kLetter);    // 中
  EXPECT_TRUE(flags(0x1C89) & unicode::kLetter);    // Unicode 16 letter (Oniguruma knows it)
  EXPECT_TRUE(flags(0x0663) & unicode::kNumber);    // Arabic-Indic three
  EXPECT_TRUE(flags(0x2167) & unicode::kNumber);    // Roman numeral eight (Nl)
  EXPECT_FALSE(flags(0x11DE0) & unicode::kNumber);  // Unicode 17 digit: unknown to Oniguruma
  EXPECT_TRUE(flags(0x11DE0) & unicode::kDigit);    // ...but numeric for Rust's std
  EXPECT_TRUE(flags(0x3000) & unicode::kSpace);
  EXPECT_TRUE(flags(0x0085) & unicode::kSpace);
  EXPECT_FALSE(flags(0x200B) & unicode::kSpace);  // zero width space is not \s
  EXPECT_FALSE(flags(0x180E) & unicode::kSpace);
  EXPECT_TRUE(flags(0x0301) & unicode::kWord);  // marks are \w for Rust regex
  EXPECT_EQ(flags(0x1F999), 0);                 // 🦙: no class
  EXPECT_EQ(flags(unicode::kInvalid), 0);
}

TEST(Unicode, NfcMatchesHfUnicode9Normaliser) {
  using unicode::to_nfc;
  EXPECT_EQ(to_nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(to_nfc("\u212b"), "\u00c5");               // singleton
  EXPECT_EQ(to_nfc("a\u0302\u0323"), "\u1ead");        // reordered, then composed
  EXPECT_EQ(to_nfc("\u1100\u1161\u11a8"), "\uac01");   // Hangul L V T
  EXPECT_EQ(to_nfc("\uac00\u11a8"), "\uac01");         // LV + T
  EXPECT_EQ(to_nfc("\u0958"), "\u0915\u093c");         // composition exclusion
  EXPECT_EQ(to_nfc("\u0b47\u0b3e"), "\u0b4b");         // two starters compose
  EXPECT_EQ(to_nfc("a\u0301\u0301"), "\u00e1\u0301");  // the second acute is blocked
  // U+1AC1 is newer than HF's Unicode 9 tables: ccc 0 there, so it blocks and is not reordered.
  EXPECT_EQ(to_nfc("a\u1ac1\u0301"), "a\u1ac1\u0301");
  EXPECT_EQ(to_nfc("\U00011935\U00011930"), "\U00011935\U00011930");  // Unicode 13: not composed
  EXPECT_EQ(to_nfc("x\xC3\x28\xCC\x81y"), "x\xC3(\xCC\x81y");  // ill-formed bytes pass through
  EXPECT_EQ(to_nfc("plain ascii"), "plain ascii");
  EXPECT_TRUE(unicode::is_nfc_quick("caf\u00e9 中文 🦙"));
  EXPECT_FALSE(unicode::is_nfc_quick("cafe\u0301"));
}

TEST(SplitPattern, RecognisesOnlyTheKnownRegexes) {
  EXPECT_EQ(pattern_from_regex(
                R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"),
            SplitPattern::kGpt2);
  EXPECT_FALSE(pattern_from_regex(R"(\p{L}+)").has_value());
  EXPECT_FALSE(pattern_from_regex("").has_value());
}

TEST(SplitPattern, Gpt2BacktracksWhitespaceLikeOniguruma) {
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "  Hello  world\t\tx 3rd's"),
            (Strings{" ", " Hello", " ", " world", "\t", "\t", "x", " 3", "rd", "'s"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "a   "), (Strings{"a", "   "}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "it'S"), (Strings{"it", "'", "S"}));  // case-sensitive
}

TEST(SplitPattern, Qwen2AndLlama3) {
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "it'S 12345 .format\n\n  x"),
            (Strings{"it", "'S", " ", "1", "2", "3", "4", "5", " .", "format", "\n\n", " ", " x"}));
  EXPECT_EQ(pieces(SplitPattern::kLlama3, "12345 'ſa"), (Strings{"123", "45", " '", "ſa"}));
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "x'ſa"), (Strings{"x", "'ſ", "a"}));
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "a;\r\n\r\n b"), (Strings{"a", ";\r\n\r\n", " b"}));
}

TEST(PreTokenizer, BehaviorsFollowHf) {
  // "a-b--c" cut at "-": parts a | - | b | - | - | c; expectations printed by HF tokenizers.
  const std::vector<Part> parts = {{{0, 1}, false}, {{1, 2}, true}, {{2, 3}, false},
                                   {{3, 4}, true},  {{4, 5}, true}, {{5, 6}, false}};
  auto cut = [&](SplitBehavior b) {
    std::vector<Span> out;
    apply_behavior(parts, b, out);
    std::vector<std::pair<size_t, size_t>> r;
    for (const Span& s : out) r.emplace_back(s.begin, s.end);
    return r;
  };
  using V = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(cut(SplitBehavior::kRemoved), (V{{0, 1}, {2, 3}, {5, 6}}));
  EXPECT_EQ(cut(SplitBehavior::kIsolated), (V{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(cut(SplitBehavior::kMergedWithPrevious), (V{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(cut(SplitBehavior::kMergedWithNext), (V{{0, 1}, {1, 3}, {3, 4}, {4, 6}}));
  EXPECT_EQ(cut(SplitBehavior::kContiguous), (V{{0, 1}, {1, 2}, {2, 3}, {3, 5}, {5, 6}}));
}

TEST(PreTokenizer, ByteLevelPrefixSpaceAndDigits) {
  PreTokenizerStep digits;
  digits.kind = PreTokenizerStep::Kind::kDigits;
  digits.individual_digits = true;
  PreTokenizerStep bl;
  bl.kind = PreTokenizerStep::Kind::kByteLevel;
  bl.add_prefix_space = true;
  const PreTokenizer pre({digits, bl});
  Strings got;
  auto sink = [&](std::string_view s) { got.emplace_back(s); };
  pre.run("ab12 c", sink);
  // Every piece the Digits step produced gets its own prefix space, as in HF.
  EXPECT_EQ(got, (Strings{" ab", " 1", " 2", " c"}));
}

TEST(AddedTokens, LeftmostLongestWithHfFlags) {
  std::vector<AddedToken> toks = {{"<a>", 10},
                                  {"<a><b>", 11},
                                  {"<b>", 12, true},
                                  {"x", 13, false, /*single_word=*/true},
                                  {"[M]", 14, false, false, /*lstrip=*/true, /*rstrip=*/true}};
  const AddedTokenMatcher m(toks, AddedTokenMatcher::Strategy::kLeftmostLongest);
  auto split = [&](const std::string& s, bool parse_special) {
    std::vector<Segment> segs;
    m.split(s, parse_special, segs);
    std::vector<std::pair<std::string, int32_t>> r;
    for (const Segment& g : segs) r.emplace_back(s.substr(g.begin, g.end - g.begin), g.id);
    return r;
  };
  using R = std::vector<std::pair<std::string, int32_t>>;
  EXPECT_EQ(split("q<a><b><b>", true), (R{{"q", -1}, {"<a><b>", 11}, {"<b>", 12}}));
  EXPECT_EQ(split("<a><b><b>", false), (R{{"<a><b>", 11}, {"<b>", -1}}));
  // single_word: "ax" and "x1" are inside words; a refused match stays plain text.
  EXPECT_EQ(split("x ax x1 (x)", true), (R{{"x", 13}, {" ax x1 (", -1}, {"x", 13}, {")", -1}}));
  EXPECT_EQ(split("a  [M]  b", true), (R{{"a", -1}, {"  [M]  ", 14}, {"b", -1}}));
}

TEST(AddedTokens, LongestFirstLikeLlamaCpp) {
  std::vector<AddedToken> toks = {{"ab", 1}, {"bcd", 2}};
  std::vector<Segment> segs;
  AddedTokenMatcher(toks, AddedTokenMatcher::Strategy::kLongestFirst).split("abcd", true, segs);
  ASSERT_EQ(segs.size(), 2u);  // "bcd" is longer, so it is cut out first
  EXPECT_EQ(segs[1].id, 2);
  segs.clear();
  AddedTokenMatcher(toks, AddedTokenMatcher::Strategy::kLeftmostLongest).split("abcd", true, segs);
  EXPECT_EQ(segs[0].id, 1);  // HF: the leftmost match wins
}

TEST(BpeModel, LowestRankFirstLeftmostOnTies) {
  // Tokens: a b ab aab; merges (a,b) rank 0, (a,ab) rank 1.
  const BpeModel m({{"a", 0}, {"b", 1}, {"ab", 2}, {"aab", 3}, {"ba", 4}},
                   {{0, 1, 2}, {0, 2, 3}, {1, 0, 4}}, BpeOptions{});
  std::vector<int32_t> ids;
  m.encode_word("aab", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{3}));
  ids.clear();
  m.encode_word("bab", ids);  // (a,b) at 1 ranks before (b,a) at 0
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  ids.clear();
  m.encode_word("xab", ids);  // no token for x and no unk: dropped, as HF does
  EXPECT_EQ(ids, (std::vector<int32_t>{2}));
}

TEST(BpeModel, ByteFallbackAndUnknowns) {
  BpeOptions o;
  o.byte_level = false;
  o.byte_fallback = true;
  o.unk_id = 0;
  const BpeModel m({{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}}, {}, o);
  std::vector<int32_t> ids;
  m.encode_word("a\u00e9z", ids);  // é by its bytes, z unknown
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 0}));
}

}  // namespace
}  // namespace miles::tokenizer
