// model_config_to_hf_json: parse_model_config gives back every field, for every tiny HF model, the
// llama2.c stories260K model, and configs with every optional field set away from its default.
#include <gtest/gtest.h>

#include <filesystem>

#include "miles/checkpoint.h"
#include "miles/model_config.h"
#include "test_paths.h"

namespace miles {
namespace {

void expect_same(const ModelConfig& a, const ModelConfig& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.arch_name, b.arch_name);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  const RopeConfig &r = a.rope, &s = b.rope;
  EXPECT_EQ(r.type, s.type);
  EXPECT_EQ(r.theta, s.theta);
  EXPECT_EQ(r.partial_rotary_factor, s.partial_rotary_factor);
  EXPECT_EQ(r.factor, s.factor);
  EXPECT_EQ(r.low_freq_factor, s.low_freq_factor);
  EXPECT_EQ(r.high_freq_factor, s.high_freq_factor);
  EXPECT_EQ(r.original_max_position_embeddings, s.original_max_position_embeddings);
  EXPECT_EQ(r.beta_fast, s.beta_fast);
  EXPECT_EQ(r.beta_slow, s.beta_slow);
  EXPECT_EQ(r.attention_factor, s.attention_factor);
  EXPECT_EQ(r.mscale, s.mscale);
  EXPECT_EQ(r.mscale_all_dim, s.mscale_all_dim);
  EXPECT_EQ(r.truncate, s.truncate);
  EXPECT_EQ(r.max_position_embeddings, s.max_position_embeddings);
  EXPECT_EQ(a.moe.num_experts, b.moe.num_experts);
  EXPECT_EQ(a.moe.top_k, b.moe.top_k);
  EXPECT_EQ(a.moe.moe_intermediate_size, b.moe.moe_intermediate_size);
  EXPECT_EQ(a.moe.norm_topk_prob, b.moe.norm_topk_prob);
  EXPECT_EQ(a.moe.decoder_sparse_step, b.moe.decoder_sparse_step);
  EXPECT_EQ(a.moe.mlp_only_layers, b.moe.mlp_only_layers);
}

void expect_round_trip(const ModelConfig& c, const std::string& what) {
  const std::string text = model_config_to_hf_json(c);
  auto back = parse_model_config(text, what + " (written)");
  ASSERT_TRUE(back.ok()) << back.message() << "\n" << text;
  expect_same(c, *back, what);
  EXPECT_EQ(model_config_to_hf_json(*back), text) << what;
}

TEST(ModelConfigJson, RoundTripsEveryTinyModel) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::data_dir() + "/models")) {
    auto c = load_model_config(e.path().string() + "/config.json");
    ASSERT_TRUE(c.ok()) << c.message();
    expect_round_trip(*c, e.path().filename().string());
    ++n;
  }
  EXPECT_GE(n, 10);
}

TEST(ModelConfigJson, RoundTripsLlama2c) {
  MILES_REQUIRE_SHARED();
  auto m = read_llama2c(test::shared_dir() + "/models/stories260K/stories260K.bin");
  ASSERT_TRUE(m.ok()) << m.message();
  expect_round_trip(m->config, "stories260K");
}

TEST(ModelConfigJson, RoundTripsOptionalFieldsAwayFromDefaults) {
  auto base = load_model_config(test::data_dir() + "/models/qwen3_moe/config.json");
  ASSERT_TRUE(base.ok());
  ModelConfig c = *base;
  c.arch_name = "Qwen3MoeForCausalLM";
  c.eos_token_ids = {2, 7, 9};
  c.bos_token_id = -1;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  c.rms_norm_eps = 1.0 / 3.0;
  c.rope.theta = 123456.789;
  c.rope.partial_rotary_factor = 0.5;
  c.rope.type = RopeConfig::Type::kYarn;
  c.rope.factor = 3.25;
  c.rope.original_max_position_embeddings = 64;
  c.rope.beta_fast = 16;
  c.rope.beta_slow = 2;
  c.rope.attention_factor = 1.1;
  c.rope.mscale = 0.7;
  c.rope.mscale_all_dim = 0.9;
  c.rope.truncate = false;
  c.moe.norm_topk_prob = false;
  c.moe.decoder_sparse_step = 2;
  c.moe.mlp_only_layers = {0};
  expect_round_trip(c, "qwen3_moe, every optional field set");
  for (auto type :
       {RopeConfig::Type::kLinear, RopeConfig::Type::kDynamic, RopeConfig::Type::kLlama3}) {
    ModelConfig d = *base;
    d.rope.type = type;
    d.rope.factor = 8;
    d.rope.low_freq_factor = 1.5;
    d.rope.high_freq_factor = 5;
    d.rope.original_max_position_embeddings = 32;
    expect_round_trip(d, "rope type " + std::to_string(static_cast<int>(type)));
  }
}

}  // namespace
}  // namespace miles
