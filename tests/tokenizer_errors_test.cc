// Malformed tokenizer.json files: each is refused with an error that names the file and the field
// at fault, never a crash or a tokenizer that silently ignores what it does not understand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "miles/tokenizer.h"

namespace miles {
namespace {

using json = nlohmann::json;

// A small valid byte-level tokenizer: "a", "b", "Ġ" (space), "ab"; one merge; one added token.
json valid() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [{"id": 4, "content": "<|x|>", "special": true, "normalized": false,
                      "single_word": false, "lstrip": false, "rstrip": false}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                      "use_regex": true},
    "post_processor": {"type": "ByteLevel"},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "\u0120": 2, "ab": 3}, "merges": ["a b"]}
  })");
}

Result<std::unique_ptr<Tokenizer>> parse(const json& j) {
  return parse_hf_tokenizer(j.dump(), "bad.json");
}

void expect_error(const json& j, const std::string& field, const std::string& detail = "") {
  auto r = parse(j);
  ASSERT_FALSE(r.ok()) << "accepted: " << j.dump();
  EXPECT_NE(r.message().find("bad.json"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find(field), std::string::npos) << r.message();
  if (!detail.empty()) {
    EXPECT_NE(r.message().find(detail), std::string::npos) << r.message();
  }
}

TEST(HfTokenizerErrors, TheValidBaseWorks) {
  auto r = parse(valid());
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->encode("ab a<|x|>", false), (std::vector<int32_t>{3, 2, 0, 4}));
  EXPECT_EQ((*r)->decode(std::vector<int32_t>{3, 2, 0, 4}), "ab a<|x|>");
  // Merges given as pairs mean the same.
  json pairs = valid();
  pairs["model"]["merges"] = json::parse(R"([["a", "b"]])");
  ASSERT_TRUE(parse(pairs).ok());
}

TEST(HfTokenizerErrors, NotJson) {
  for (const std::string text : {"", "{", "not json", "{\"model\": }", "[1, 2]"}) {
    auto r = parse_hf_tokenizer(text, "bad.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.message().find("bad.json"), std::string::npos) << r.message();
  }
}

TEST(HfTokenizerErrors, Model) {
  json j = valid();
  j["model"]["type"] = "Unigram";
  expect_error(j, "model.type", "Unigram");
  j = valid();
  j.erase("model");
  expect_error(j, "model");
  j = valid();
  j["model"]["vocab"] = json::array();
  expect_error(j, "model.vocab");
  j = valid();
  j["model"]["vocab"]["c"] = -1;
  expect_error(j, "model.vocab[\"c\"]");
  j = valid();
  j["model"]["vocab"]["c"] = 3;
  expect_error(j, "model.vocab", "id 3");
  j = valid();
  j["model"]["vocab"]["far"] = 100000000;
  expect_error(j, "model.vocab", "100000000");
  j = valid();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "model.dropout");
  j = valid();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_error(j, "model.continuing_subword_prefix");
  j = valid();
  j["model"]["unk_token"] = "<unk>";
  expect_error(j, "model.unk_token", "<unk>");
  j = valid();
  j["model"]["byte_fallback"] = "yes";
  expect_error(j, "model.byte_fallback");
}

TEST(HfTokenizerErrors, MergesNamingMissingTokens) {
  json j = valid();
  j["model"]["merges"] = {"a b", "a zz"};
  expect_error(j, "model.merges[1]", "zz");
  j["model"]["merges"] = json::parse(R"([["a", "b"], ["b", "q"]])");
  expect_error(j, "model.merges[1]", "\"q\"");
  j["model"]["merges"] = {"b a"};  // both exist, "ba" does not
  expect_error(j, "model.merges[0]", "\"ba\"");
  j["model"]["merges"] = {"a b c"};
  expect_error(j, "model.merges[0]");
  j["model"]["merges"] = {42};
  expect_error(j, "model.merges[0]");
  j["model"].erase("merges");
  expect_error(j, "model.merges");
}

TEST(HfTokenizerErrors, PreTokenizers) {
  json j = valid();
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_error(j, "pre_tokenizer.type", "UnicodeScripts");
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  expect_error(j, "pre_tokenizer.replacement", "one character");
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "often"}};
  expect_error(j, "pre_tokenizer.prepend_scheme");
  // A regex Oniguruma does not compile: the error names the field and the pattern.
  j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "Split", "pattern": {"Regex": "(\\w+"}, "behavior": "Isolated", "invert": false}]})");
  expect_error(j, "pre_tokenizer.pretokenizers[1].pattern.Regex", "(\\w+");
  j["pre_tokenizer"]["pretokenizers"][1]["pattern"] = {{"String", " "}};
  j["pre_tokenizer"]["pretokenizers"][1]["behavior"] = "Sideways";
  expect_error(j, "pre_tokenizer.pretokenizers[1].behavior", "Sideways");
  j["pre_tokenizer"]["pretokenizers"][1]["behavior"] = "Isolated";
  j["pre_tokenizer"]["pretokenizers"][1]["pattern"] = {{"Glob", "*"}};
  expect_error(j, "pre_tokenizer.pretokenizers[1].pattern");
  j["pre_tokenizer"]["pretokenizers"][1]["pattern"] = {{"String", ""}};
  expect_error(j, "pre_tokenizer.pretokenizers[1].pattern.String");
  j["pre_tokenizer"] = {{"type", "Sequence"}};
  expect_error(j, "pre_tokenizer.pretokenizers");
  j["pre_tokenizer"] = "ByteLevel";
  expect_error(j, "pre_tokenizer");
}

TEST(HfTokenizerErrors, NormalizerPostProcessorDecoder) {
  json j = valid();
  j["normalizer"] = {{"type", "Precompiled"}};
  expect_error(j, "normalizer.type", "Precompiled");
  j["normalizer"] =
      json::parse(R"({"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]})");
  expect_error(j, "normalizer.normalizers[0].type", "BertNormalizer");
  j["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"Regex": "["}, "content": ""})");
  expect_error(j, "normalizer.pattern.Regex", "[");
  j["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"String": "a"}})");
  expect_error(j, "normalizer.content");
  j = valid();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder.type", "WordPiece");
  // Decoder chains decode_token cannot run exactly are refused, naming the field.
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"},
      {"type": "Fuse"}]})");
  expect_error(j, "decoder", "ByteLevel together");
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "Fuse"},
      {"type": "ByteFallback"}]})");
  expect_error(j, "decoder.decoders[1]", "after Fuse");
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 1}]})");
  expect_error(j, "decoder.decoders[1]", "stop 0");
  j["decoder"] = json::parse(R"({"type": "Replace", "pattern": {"Regex": "x"}, "content": ""})");
  expect_error(j, "decoder.pattern.Regex");
  j = valid();
  j["post_processor"] = {{"type", "Magic"}};
  expect_error(j, "post_processor.type", "Magic");
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A"}}],
      "special_tokens": {}})");
  expect_error(j, "post_processor.special_tokens", "<s>");
  j["post_processor"] = json::parse(R"({"type": "RobertaProcessing", "cls": ["<s>", 0],
      "sep": ["</s>", 77]})");
  expect_error(j, "post_processor", "77");
}

TEST(HfTokenizerErrors, AddedTokens) {
  json j = valid();
  j["added_tokens"] = {{{"id", 5}}};
  expect_error(j, "added_tokens[0].content");
  j["added_tokens"] = {{{"id", -3}, {"content", "x"}}};
  expect_error(j, "added_tokens[0].id");
  j["added_tokens"] = {{{"id", 5}, {"content", 7}}};
  expect_error(j, "added_tokens[0].content");
  j["added_tokens"] = {{{"id", 5}, {"content", "<y>"}, {"special", "maybe"}}};
  expect_error(j, "added_tokens[0].special");
  j["added_tokens"] = {{"id", 5}};
  expect_error(j, "added_tokens");
  j["added_tokens"] = "tokens";
  expect_error(j, "added_tokens");
}

TEST(HfTokenizerErrors, AddedTokenIdsAreHfs) {
  // HF ignores the ids in added_tokens: an entry of the vocabulary keeps its id, a new token gets
  // the next free one, in file order.
  json j = valid();
  j["added_tokens"] = {{{"id", 40}, {"content", "<n>"}, {"special", true}},
                       {{"id", 41}, {"content", "ab"}, {"special", true}}};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->encode("<n>ab", false), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ((*r)->vocab_size(), 5);
}

TEST(HfTokenizerErrors, LoadTokenizerNamesMissingAndUnsupportedPaths) {
  auto r = load_tokenizer("/no/such/dir/tokenizer.json", 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("/no/such/dir/tokenizer.json"), std::string::npos);
  r = load_hf_tokenizer("/no/such/tokenizer.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("/no/such/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace miles
