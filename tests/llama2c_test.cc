// llama2.c checkpoints: both stories260K formats give the same HF-named tensors, the config of the
// README, q/k rows permuted to HF's half-split rotary pairs, and truncated or lying files give
// errors naming the file, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/llama2c_parse.h"
#include "miles/checkpoint.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace fs = std::filesystem;

std::string model_path(const std::string& file) {
  return test::shared_dir() + "/models/stories260K/" + file;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Result<Llama2cModel> parse_bytes(const std::string& bytes, const std::string& source) {
  return parse_llama2c(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), source,
                       nullptr);
}

void put_i32(std::string& bytes, size_t offset, int32_t v) { std::memcpy(&bytes[offset], &v, 4); }

TEST(Llama2c, ConfigAsInTheReadme) {
  MILES_REQUIRE_SHARED();
  for (const char* file : {"checkpoint_v1.bin", "stories260K.bin"}) {
    auto m = read_llama2c(model_path(file));
    ASSERT_TRUE(m.ok()) << m.message();
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, Arch::kLlama);
    EXPECT_EQ(c.arch_name, "LlamaForCausalLM");
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.intermediate_size, 172);
    EXPECT_EQ(c.num_layers, 5);
    EXPECT_EQ(c.num_heads, 8);
    EXPECT_EQ(c.num_kv_heads, 4);
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.max_position_embeddings, 512);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.bos_token_id, 1);
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
    EXPECT_TRUE(c.validate(file).ok());
    EXPECT_FALSE(m->weights.contains("lm_head.weight"));
    EXPECT_EQ(m->weights.size(), 2u + 5u * 9u);
    int64_t params = 0;
    for (const auto& name : m->weights.names()) params += m->weights.find(name)->numel();
    EXPECT_EQ(params, 260032) << file;  // the README's parameter count
    EXPECT_TRUE(m->weights.get("model.layers.4.self_attn.k_proj.weight", {32, 64}).ok());
    EXPECT_TRUE(m->weights.get("model.layers.4.mlp.down_proj.weight", {64, 172}).ok());
  }
}

TEST(Llama2c, BothFormatsGiveIdenticalTensors) {
  MILES_REQUIRE_SHARED();
  auto v1 = read_llama2c(model_path("checkpoint_v1.bin"));
  auto legacy = read_llama2c(model_path("stories260K.bin"));
  ASSERT_TRUE(v1.ok()) << v1.message();
  ASSERT_TRUE(legacy.ok()) << legacy.message();
  ASSERT_EQ(v1->weights.names(), legacy->weights.names());
  for (const auto& name : v1->weights.names()) {
    const Tensor* a = v1->weights.find(name);
    const Tensor* b = legacy->weights.find(name);
    ASSERT_EQ(a->shape(), b->shape()) << name;
    EXPECT_EQ(std::memcmp(a->raw(), b->raw(), a->nbytes()), 0) << name;
  }
}

// Rows of q/k move from interleaved pairs (2i, 2i+1) to half-split pairs (i, i + hd/2).
TEST(Llama2c, RotaryRowPermutationAgainstTheRawFile) {
  MILES_REQUIRE_SHARED();
  const std::string raw = slurp(model_path("checkpoint_v1.bin"));
  auto m = read_llama2c(model_path("checkpoint_v1.bin"));
  ASSERT_TRUE(m.ok()) << m.message();
  const int64_t L = 5, D = 64, V = 512, KV = 32, hd = 8;
  const size_t wq = 256 + 4 * (2 * L * D + D + V * D);
  const size_t wk = wq + 4 * (L * D * D);
  const size_t wv = wk + 4 * (L * KV * D);
  auto raw_row = [&](size_t base, int64_t row) {
    std::vector<float> r(D);
    std::memcpy(r.data(), raw.data() + base + 4 * row * D, 4 * D);
    return r;
  };
  auto row = [&](const std::string& name, int64_t r) {
    const float* p = m->weights.find(name)->data<float>();
    return std::vector<float>(p + r * D, p + (r + 1) * D);
  };
  const int64_t layer = 1, head = 3, i = 2;
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  EXPECT_EQ(row(q, head * hd + i), raw_row(wq + 4 * layer * D * D, head * hd + 2 * i));
  EXPECT_EQ(row(q, head * hd + hd / 2 + i), raw_row(wq + 4 * layer * D * D, head * hd + 2 * i + 1));
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  EXPECT_EQ(row(k, head * hd + i), raw_row(wk + 4 * layer * KV * D, head * hd + 2 * i));
  EXPECT_EQ(row(k, head * hd + hd / 2 + i),
            raw_row(wk + 4 * layer * KV * D, head * hd + 2 * i + 1));
  // v_proj is not rotated: a plain view of the file.
  EXPECT_EQ(row("model.layers.1.self_attn.v_proj.weight", 5), raw_row(wv + 4 * layer * KV * D, 5));
}

class Llama2cBadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("miles_llama2c_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Writes `bytes` to a temporary file and expects read_llama2c to fail naming it and `needle`.
  void expect_bad(const std::string& bytes, const std::string& needle) {
    const std::string path = (dir_ / ("bad_" + std::to_string(n_++) + ".bin")).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    auto r = read_llama2c(path);
    ASSERT_FALSE(r.ok()) << "accepted " << bytes.size() << " bytes; expected: " << needle;
    EXPECT_NE(r.message().find(path), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(needle), std::string::npos) << r.message();
  }
  fs::path dir_;
  int n_ = 0;
};

TEST_F(Llama2cBadFiles, TruncatedCopies) {
  MILES_REQUIRE_SHARED();
  for (const char* file : {"checkpoint_v1.bin", "stories260K.bin"}) {
    const std::string bytes = slurp(model_path(file));
    expect_bad("", "shorter than");
    expect_bad(bytes.substr(0, 20), "shorter than");
    expect_bad(bytes.substr(0, 300), "runs past the end");
    expect_bad(bytes.substr(0, bytes.size() / 2), "'w");
    expect_bad(bytes.substr(0, bytes.size() - 4), "runs past the end");
    expect_bad(bytes + "xxxx", "bytes follow the last tensor");
  }
}

TEST_F(Llama2cBadFiles, LyingHeaders) {
  MILES_REQUIRE_SHARED();
  const std::string v1 = slurp(model_path("checkpoint_v1.bin"));
  const std::string legacy = slurp(model_path("stories260K.bin"));
  auto v1_with = [&](size_t field, int32_t value) {  // field i of the 7 ints after magic+version
    std::string b = v1;
    put_i32(b, 8 + 4 * field, value);
    return b;
  };
  auto legacy_with = [&](size_t field, int32_t value) {
    std::string b = legacy;
    put_i32(b, 4 * field, value);
    return b;
  };
  expect_bad(v1_with(2, 1 << 30), "header is wrong");    // n_layers: absurd, nothing allocated
  expect_bad(v1_with(0, 1 << 30), "runs past the end");  // dim
  expect_bad(v1_with(5, 1 << 20), "runs past the end");  // vocab
  expect_bad(v1_with(2, 6), "runs past the end");        // n_layers too large
  expect_bad(v1_with(2, 4), "bytes follow");             // n_layers too small
  expect_bad(v1_with(3, 0), "n_heads");
  expect_bad(v1_with(3, 7), "n_heads");
  expect_bad(v1_with(4, 3), "n_kv_heads");
  expect_bad(v1_with(5, -512), "vocab_size");
  expect_bad(v1_with(6, 0), "seq_len");
  std::string b = v1;
  put_i32(b, 4, 2);
  expect_bad(b, "version 2");
  b = v1;
  b[36] = 7;
  expect_bad(b, "shared_classifier");
  expect_bad(legacy_with(5, -512), "wcls");  // separate classifier announced, not in the file
  expect_bad(legacy_with(5, INT32_MIN), "header is wrong");   // |vocab| = 2^31
  expect_bad(legacy_with(1, 0x7fffffff), "header is wrong");  // hidden_dim
  expect_bad(legacy_with(6, 100000), "runs past the end");    // seq_len: freq_cis grows
}

TEST(Llama2c, SeparateClassifierAndMisalignedBuffer) {
  MILES_REQUIRE_SHARED();
  std::string v1 = slurp(model_path("checkpoint_v1.bin"));
  v1[36] = 0;  // not shared: a wcls [V, D] must follow; append the embedding table as it
  const size_t emb = 256 + 4 * (2 * 5 * 64 + 64);
  v1 += v1.substr(emb, 4 * 512 * 64);
  std::string shifted = "x" + v1;  // parse from an odd address: copied, still correct
  auto m = parse_bytes(shifted.substr(0, 0), "empty");
  EXPECT_FALSE(m.ok());
  m = parse_llama2c(reinterpret_cast<const uint8_t*>(shifted.data()) + 1, v1.size(), "shifted",
                    nullptr);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_FALSE(m->config.tie_word_embeddings);
  auto head = m->weights.get("lm_head.weight", {512, 64});
  ASSERT_TRUE(head.ok()) << head.message();
  EXPECT_EQ(head->to_f32(), m->weights.find("model.embed_tokens.weight")->to_f32());
  EXPECT_EQ(m->weights.source("lm_head.weight"), "shifted");
}

// The fuzzer's committed seeds (tests/fuzz/make_seeds.py): tiny valid models in both formats, and
// the truncated head of stories260K.bin.
TEST(Llama2c, FuzzSeeds) {
  const fs::path seeds = test::source_dir() + "/tests/fuzz/corpus/llama2c";
  int valid = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    auto r = parse_bytes(slurp(e.path().string()), e.path().string());
    if (e.path().filename() == "stories260K_head") {
      EXPECT_FALSE(r.ok());
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(r->config.hidden_size, 8);
    EXPECT_EQ(r->weights.contains("lm_head.weight"), !r->config.tie_word_embeddings);
    ++valid;
  }
  EXPECT_EQ(valid, 4);
}

}  // namespace
}  // namespace miles
