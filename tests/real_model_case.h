// A real model converted by `miles convert` (scripts/get_models.sh) against transformers' goldens
// for the same GGUF (scripts/make_real_model_goldens.py): the prompts' logits compared and greedy
// decoding through the KV cache, shared by tests/smollm2_test.cc and tests/gemma3_270m_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/model.h"
#include "miles/thread_pool.h"

namespace miles::test {

// The int32 golden `name` (a prompt's ids, the probe ids, the answer).
inline std::vector<int32_t> golden_ids(const TensorMap& goldens, const std::string& name) {
  const Tensor* t = goldens.find(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? std::vector<int32_t>(t->data<int32_t>(), t->data<int32_t>() + t->numel())
           : std::vector<int32_t>{};
}

// A suite's model and goldens, loaded once (the suite's SetUpTestSuite calls load) when the model
// has been fetched; `Suite` is the deriving fixture, so each suite has its own.
template <class Suite>
class RealModelSuite : public ::testing::Test {
 protected:
  static void load(const std::string& dir, const std::string& goldens) {
    if (!std::filesystem::exists(dir + "/model.safetensors")) return;
    auto m = Model::load(dir);
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(*m).release();
    auto g = read_safetensors(goldens);
    ASSERT_TRUE(g.ok()) << g.message();
    goldens_ = new TensorMap(std::move(*g));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete goldens_;
    model_ = nullptr;
    goldens_ = nullptr;
  }
  static std::vector<int32_t> ids(const std::string& name) { return golden_ids(*goldens_, name); }
  static inline Model* model_ = nullptr;
  static inline TensorMap* goldens_ = nullptr;
};

// Prompt p's forward against the goldens: the largest |Δlogit| over the last two positions (at
// every `last_stride`-th id when the goldens keep only those) and over the probe ids at every
// position, and at how many positions the argmax is transformers'.
struct PromptLogits {
  int64_t tokens = 0;
  float d_last = 0, d_probe = 0;
  int64_t argmax_same = 0;
};
inline PromptLogits compare_prompt_logits(const Model& model, const TensorMap& goldens, int p,
                                          ThreadPool* pool) {
  const std::string key = "prompt" + std::to_string(p);
  const std::vector<int32_t> prompt = golden_ids(goldens, key + ".ids");
  const std::vector<int32_t> probe = golden_ids(goldens, "probe_ids");
  const int64_t V = model.config().vocab_size, T = static_cast<int64_t>(prompt.size());
  const int64_t stride = goldens.find("last_stride") ? golden_ids(goldens, "last_stride")[0] : 1;
  PromptLogits r;
  r.tokens = T;
  auto kv = model.make_kv_cache();
  SeqSpan s{0, 0, T};
  auto out = model.forward(prompt, {&s, 1}, *kv, ForwardOptions{}, pool);
  EXPECT_TRUE(out.ok()) << out.message();
  if (!out.ok()) return r;
  const float* last = goldens.find(key + ".logits_last")->data<float>();
  const float* probed = goldens.find(key + ".probe_logits")->data<float>();
  const std::vector<int32_t> argmax = golden_ids(goldens, key + ".argmax");
  const int64_t kept = V / stride;
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t v = 0; v < kept; ++v)
      r.d_last = std::max(
          r.d_last, std::fabs(out->logits[(T - 2 + row) * V + v * stride] - last[row * kept + v]));
  for (int64_t t = 0; t < T; ++t) {
    const float* logits = out->logits.data() + t * V;
    for (size_t k = 0; k < probe.size(); ++k)
      r.d_probe = std::max(r.d_probe, std::fabs(logits[probe[k]] - probed[t * 256 + k]));
    r.argmax_same += std::max_element(logits, logits + V) - logits == argmax[t];
  }
  return r;
}

// Greedy decoding of `prompt`: the prefill, then one token per step through the KV cache, up to
// max_new tokens or `stop` (included).
inline std::vector<int32_t> greedy(const Model& model, const std::vector<int32_t>& prompt,
                                   size_t max_new, int32_t stop, ThreadPool* pool) {
  const int64_t V = model.config().vocab_size;
  auto kv = model.make_kv_cache();
  ForwardOptions o;
  o.all_logits = false;
  SeqSpan s{0, 0, static_cast<int64_t>(prompt.size())};
  std::vector<int32_t> feed = prompt, answer;
  while (answer.size() < max_new) {
    auto out = model.forward(feed, {&s, 1}, *kv, o, pool);
    EXPECT_TRUE(out.ok()) << out.message();
    if (!out.ok()) break;
    const float* row = out->logits.data();
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + V) - row);
    answer.push_back(next);
    if (next == stop) break;
    s.start_pos += s.n_tokens;
    s.n_tokens = 1;
    feed.assign(1, next);
  }
  return answer;
}

}  // namespace miles::test
