// Parity with Hugging Face transformers: logits of tiny random-weight Llama, Qwen3 and Qwen3-MoE
// checkpoints (tests/data/models, made by scripts/make_goldens.py) within 1e-4 of HF's, MoE expert choices
// identical to HF's router; and batch invariance of the whole model: every sequence gives the same bits
// alone, packed with the others, decoded token by token, and with routing replay of its own choices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "miles/kernels.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "test_paths.h"

namespace miles {
namespace {

struct GoldenSeq {
  std::vector<int32_t> ids;
  std::vector<float> logits;         // [T, V]
  std::vector<int32_t> experts;      // [T, L_moe, k]
  std::vector<float> expert_weights;
};

std::vector<GoldenSeq> load_goldens(const std::string& name) {
  auto map = read_safetensors(test::data_dir() + "/goldens/" + name + ".safetensors");
  EXPECT_TRUE(map.ok()) << map.message();
  std::vector<GoldenSeq> out;
  if (!map.ok()) return out;
  for (int i = 0;; ++i) {
    const std::string p = "seq" + std::to_string(i) + ".";
    const Tensor* ids = map->find(p + "ids");
    if (!ids) break;
    GoldenSeq g;
    g.ids.assign(ids->data<int32_t>(), ids->data<int32_t>() + ids->numel());
    g.logits = map->find(p + "logits")->to_f32();
    if (const Tensor* e = map->find(p + "experts")) {
      g.experts.assign(e->data<int32_t>(), e->data<int32_t>() + e->numel());
      g.expert_weights = map->find(p + "expert_weights")->to_f32();
    }
    out.push_back(std::move(g));
  }
  return out;
}

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

ForwardOutput run_one(const Model& m, const std::vector<int32_t>& ids, ThreadPool* pool,
                      std::span<const int32_t> forced = {}) {
  auto kv = m.make_kv_cache();
  SeqSpan s{0, 0, static_cast<int64_t>(ids.size())};
  ForwardOptions o;
  o.return_experts = true;
  o.forced_experts = forced;
  auto r = m.forward(ids, {&s, 1}, *kv, o, pool);
  EXPECT_TRUE(r.ok()) << r.message();
  return std::move(r).value();
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, LogitsAndExpertsMatchTransformers) {
  const std::string name = GetParam();
  auto model = Model::load(test::data_dir() + "/models/" + name);
  ASSERT_TRUE(model.ok()) << model.message();
  const Model& m = **model;
  auto goldens = load_goldens(name);
  ASSERT_FALSE(goldens.empty());
  ThreadPool pool(2);
  float worst = 0;
  for (size_t si = 0; si < goldens.size(); ++si) {
    const GoldenSeq& g = goldens[si];
    ForwardOutput out = run_one(m, g.ids, &pool);
    ASSERT_EQ(out.logits.size(), g.logits.size());
    const float diff = max_abs_diff(out.logits.data(), g.logits.data(), g.logits.size());
    EXPECT_LE(diff, 1e-4f) << name << " seq " << si << " (T=" << g.ids.size() << ")";
    worst = std::max(worst, diff);
    if (!g.experts.empty()) {
      ASSERT_EQ(out.experts, g.experts) << name << " seq " << si << ": expert choices differ";
      // 1e-6 relative to the weights' scale (GLM-4 MoE's reach routed_scaling_factor).
      const float scale = std::max(1.0f, static_cast<float>(m.config().moe.routed_scaling_factor));
      EXPECT_LE(
          max_abs_diff(out.expert_weights.data(), g.expert_weights.data(), g.expert_weights.size()),
          1e-6f * scale);
    }
  }
  std::printf("%s: max |logit - HF| = %.3g over %zu sequences\n", name.c_str(), worst,
              goldens.size());
}

// All sequences packed in one batch (with fresh KV slots), then each decoded token by token after a
// prefill of its first half: identical bits to the sequence run alone.
TEST_P(Parity, PackedBatchAndDecodeAreBitIdenticalToAlone) {
  const std::string name = GetParam();
  auto model = Model::load(test::data_dir() + "/models/" + name);
  ASSERT_TRUE(model.ok()) << model.message();
  const Model& m = **model;
  auto goldens = load_goldens(name);
  ThreadPool pool(2);
  std::vector<ForwardOutput> alone;
  for (auto& g : goldens) alone.push_back(run_one(m, g.ids, nullptr));

  std::vector<int32_t> packed;
  std::vector<SeqSpan> spans;
  for (size_t si = 0; si < goldens.size(); ++si) {
    spans.push_back({static_cast<int32_t>(si), 0, static_cast<int64_t>(goldens[si].ids.size())});
    packed.insert(packed.end(), goldens[si].ids.begin(), goldens[si].ids.end());
  }
  auto kv = m.make_kv_cache(8);
  ForwardOptions o;
  o.return_experts = true;
  auto batch = m.forward(packed, spans, *kv, o, &pool);
  ASSERT_TRUE(batch.ok()) << batch.message();
  size_t row = 0, erow = 0;
  for (size_t si = 0; si < goldens.size(); ++si) {
    const size_t n = alone[si].logits.size();
    ASSERT_EQ(std::memcmp(alone[si].logits.data(), batch->logits.data() + row, n * 4), 0)
        << name << " seq " << si << " differs inside the packed batch";
    row += n;
    const size_t ne = alone[si].experts.size();
    ASSERT_TRUE(std::equal(alone[si].experts.begin(), alone[si].experts.end(),
                           batch->experts.begin() + erow));
    erow += ne;
  }

  // Prefill half, then decode one token at a time, all sequences interleaved in each step.
  auto kv2 = m.make_kv_cache(4);
  const int64_t v = m.config().vocab_size;
  for (size_t si = 0; si < goldens.size(); ++si) {
    const auto& ids = goldens[si].ids;
    const int64_t half = std::max<int64_t>(1, ids.size() / 2);
    SeqSpan s{static_cast<int32_t>(si), 0, half};
    auto r = m.forward(std::span(ids).first(half), {&s, 1}, *kv2, ForwardOptions{}, &pool);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(std::memcmp(r->logits.data(), alone[si].logits.data(), half * v * 4), 0);
  }
  for (size_t step = 0;; ++step) {
    std::vector<int32_t> toks;
    std::vector<SeqSpan> ss;
    std::vector<size_t> which;
    for (size_t si = 0; si < goldens.size(); ++si) {
      const auto& ids = goldens[si].ids;
      const int64_t pos = std::max<int64_t>(1, ids.size() / 2) + step;
      if (pos >= static_cast<int64_t>(ids.size())) continue;
      toks.push_back(ids[pos]);
      ss.push_back({static_cast<int32_t>(si), pos, 1});
      which.push_back(si);
    }
    if (toks.empty()) break;
    auto r = m.forward(toks, ss, *kv2, ForwardOptions{}, &pool);
    ASSERT_TRUE(r.ok());
    for (size_t j = 0; j < which.size(); ++j)
      ASSERT_EQ(std::memcmp(r->logits.data() + j * v,
                            alone[which[j]].logits.data() + ss[j].start_pos * v, v * 4),
                0)
          << name << " seq " << which[j] << " decode at position " << ss[j].start_pos;
  }
}

// Routing replay with the router's own choices changes nothing; replaying other ids uses exactly them.
// RoPE tables as transformers computes them (inv_freq and attention scaling stored with the goldens).
TEST_P(Parity, RopeTableMatchesTransformers) {
  const std::string name = GetParam();
  auto cfg = load_model_config(test::data_dir() + "/models/" + name + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  // MLA rotates qk_rope_head_dim of each latent head.
  auto table = kernels::make_rope_table(cfg->rope,
                                        cfg->is_mla() ? cfg->mla.qk_rope_head_dim : cfg->head_dim);
  ASSERT_TRUE(table.ok()) << table.message();
  auto golden = read_safetensors(test::data_dir() + "/goldens/" + name + ".safetensors");
  ASSERT_TRUE(golden.ok());
  const std::vector<float> inv = golden->find("rope.inv_freq")->to_f32();
  ASSERT_EQ(inv.size(), table->inv_freq.size());
  for (size_t i = 0; i < inv.size(); ++i)
    EXPECT_NEAR(table->inv_freq[i], inv[i], 2e-7 * std::fabs(inv[i])) << name << " inv_freq[" << i << "]";
  EXPECT_NEAR(table->attention_scaling, golden->find("rope.attention_scaling")->to_f32()[0], 1e-7);
}

class Replay : public Parity {};
TEST_P(Replay, OwnChoicesChangeNothingOtherIdsAreUsed) {
  const std::string name = GetParam();
  auto model = Model::load(test::data_dir() + "/models/" + name);
  ASSERT_TRUE(model.ok());
  const Model& m = **model;
  ASSERT_GT(m.config().num_moe_layers(), 0);
  auto goldens = load_goldens(name);
  const auto& ids = goldens.back().ids;
  ForwardOutput free_run = run_one(m, ids, nullptr);
  ForwardOutput replay = run_one(m, ids, nullptr, free_run.experts);
  EXPECT_EQ(std::memcmp(free_run.logits.data(), replay.logits.data(), free_run.logits.size() * 4), 0);
  std::vector<int32_t> other = free_run.experts;
  const int64_t e = m.config().moe.num_experts;
  for (auto& x : other) x = static_cast<int32_t>((x + 3) % e);
  ForwardOutput forced = run_one(m, ids, nullptr, other);
  EXPECT_EQ(forced.experts, other);
  EXPECT_NE(std::memcmp(free_run.logits.data(), forced.logits.data(), free_run.logits.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(HfModels, Parity,
                         ::testing::Values("gemma3", "llama", "llama_tied", "llama_bias",
                                           "llama_rope_llama3", "llama_rope_yarn",
                                           "llama_rope_linear", "llama_sharded", "mistral", "phi3",
                                           "qwen2", "qwen3", "qwen3_bf16", "qwen3_moe",
                                           "qwen3_moe_nonorm", "glm4_moe", "glm4_moe_nonorm",
                                           "deepseek_v3", "deepseek_v3_noq"));

INSTANTIATE_TEST_SUITE_P(HfMoeModels, Replay,
                         ::testing::Values("qwen3_moe", "qwen3_moe_nonorm", "glm4_moe",
                                           "glm4_moe_nonorm", "deepseek_v3", "deepseek_v3_noq"));

// 64 sequences of different lengths in one packed forward (2 threads) against each alone (1 thread):
// identical logits and expert ids for every sequence, for a dense and an MoE model.
TEST(BatchInvariance, SequenceAloneEqualsInsideBatchOf64) {
  for (const char* name : {"qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3"}) {
    auto model = Model::load(test::data_dir() + "/models/" + name);
    ASSERT_TRUE(model.ok()) << model.message();
    const Model& m = **model;
    std::mt19937 rng(7);
    std::vector<std::vector<int32_t>> seqs(64);
    std::vector<int32_t> packed;
    std::vector<SeqSpan> spans;
    for (int i = 0; i < 64; ++i) {
      const int len = 1 + static_cast<int>(rng() % 40);
      for (int j = 0; j < len; ++j) seqs[i].push_back(static_cast<int32_t>(rng() % 1024));
      spans.push_back({i, 0, len});
      packed.insert(packed.end(), seqs[i].begin(), seqs[i].end());
    }
    ThreadPool pool(2);
    auto kv = m.make_kv_cache(16);
    ForwardOptions o;
    o.return_experts = true;
    auto batch = m.forward(packed, spans, *kv, o, &pool);
    ASSERT_TRUE(batch.ok()) << batch.message();
    const int64_t v = m.config().vocab_size, per_tok = m.config().num_moe_layers() * m.config().moe.top_k;
    int64_t row = 0;
    for (int i = 0; i < 64; ++i) {
      ForwardOutput alone = run_one(m, seqs[i], nullptr);
      ASSERT_EQ(std::memcmp(alone.logits.data(), batch->logits.data() + row * v, alone.logits.size() * 4), 0)
          << name << " sequence " << i << " (length " << seqs[i].size() << ")";
      if (per_tok > 0) {
        ASSERT_TRUE(std::equal(alone.experts.begin(), alone.experts.end(),
                               batch->experts.begin() + row * per_tok));
      }
      row += seqs[i].size();
    }
  }
}

TEST(ModelErrors, BadBatchesAreRejected) {
  auto model = Model::load(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(model.ok()) << model.message();
  const Model& m = **model;
  auto kv = m.make_kv_cache();
  std::vector<int32_t> ids = {1, 2, 5000};
  SeqSpan s{0, 0, 3};
  auto r = m.forward(ids, {&s, 1}, *kv, {}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("5000"), std::string::npos);
  ids[2] = 3;
  SeqSpan past{0, 255, 3};
  r = m.forward(ids, {&past, 1}, *kv, {}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("context length"), std::string::npos);
  ForwardOptions o;
  std::vector<int32_t> forced(3 * 2 * 2, 1);  // repeated id per token
  o.forced_experts = forced;
  r = m.forward(ids, {&s, 1}, *kv, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("repeated"), std::string::npos);
}

TEST(ModelErrors, MissingTensorAndUnknownArchitectureAreNamed) {
  auto cfg = load_model_config(test::data_dir() + "/models/llama/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.message();
  TensorMap empty;
  auto m = Model::from_weights(*cfg, empty);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("model.embed_tokens.weight"), std::string::npos) << m.message();
  auto bad = Model::load(test::data_dir() + "/no/such/model");
  ASSERT_FALSE(bad.ok());
}

}  // namespace
}  // namespace miles
