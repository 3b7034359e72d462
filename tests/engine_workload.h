// An engine workload for comparing two engines bit for bit (engine_tp_test, device_model_test):
// a GRPO group whose prompt leaves a partial block to copy into each sibling, two requests sharing
// a prefix (the second hits the prefix cache), long prompts prefilled in chunks, greedy and
// sampled.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "miles/draft_head.h"
#include "miles/flat_params.h"
#include "miles/rollout/drafter.h"
#include "miles/rollout/engine.h"

namespace miles::test {

struct Finals {
  std::map<std::pair<uint64_t, int>, SampleEvent> by_sample;
  SampleListener listener() {
    return [this](const SampleEvent& e) {
      if (e.finished) by_sample[{e.request_id, e.sample_index}] = e;
    };
  }
};

// Six requests: a GRPO group of 4 (its 11-token prompt leaves a partial block to copy into each
// sibling), two sharing a 24-token prefix (the second hits the prefix cache), long prompts
// prefilled in chunks, greedy and sampled.
inline Finals run_workload(Engine& e, uint32_t seed, uint32_t vocab = 1024) {
  std::mt19937 rng(seed);
  auto ids = [&](int n) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = static_cast<int32_t>(rng() % vocab);
    return v;
  };
  std::vector<GenerateRequest> reqs;
  auto add = [&](std::vector<int32_t> prompt, float temperature, int32_t n, int64_t max_new) {
    GenerateRequest r;
    r.input_ids = std::move(prompt);
    r.sampling.temperature = temperature;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = rng();
    r.max_new_tokens = max_new;
    r.n = n;
    reqs.push_back(std::move(r));
  };
  add(ids(11), 1.0f, 4, 10);
  const std::vector<int32_t> shared = ids(24);
  auto with_tail = [&](int n) {
    std::vector<int32_t> p = shared;
    const auto t = ids(n);
    p.insert(p.end(), t.begin(), t.end());
    return p;
  };
  add(with_tail(5), 0.8f, 1, 12);
  add(ids(40), 0.0f, 1, 8);
  add(ids(3), 1.0f, 2, 14);
  Finals f;
  for (auto& r : reqs) EXPECT_TRUE(e.submit(r, f.listener()).ok());
  for (int i = 0; i < 10000 && !e.idle(); ++i) e.step();
  EXPECT_TRUE(e.idle());
  // After the first wave has filled the prefix cache: the second request of the shared prefix.
  add(with_tail(7), 0.8f, 1, 9);
  EXPECT_TRUE(e.submit(reqs.back(), f.listener()).ok());
  for (int i = 0; i < 10000 && !e.idle(); ++i) e.step();
  EXPECT_TRUE(e.idle());
  return f;
}

// `same_cache`: both engines started the workload with the same prefix cache (else only the bits
// are compared: a warm cache serves more prompt positions, with the same results).
inline void expect_same_bits(const Finals& a, const Finals& b, bool same_cache = true) {
  // In submission order (request ids differ between engines that ran different workloads before).
  ASSERT_EQ(a.by_sample.size(), b.by_sample.size());
  auto it = b.by_sample.begin();
  for (const auto& [key, x] : a.by_sample) {
    const SampleEvent& y = (it++)->second;
    ASSERT_EQ(x.sample_index, y.sample_index);
    ASSERT_EQ(x.output.size(), y.output.size()) << "request " << key.first;
    for (size_t i = 0; i < x.output.size(); ++i) {
      EXPECT_EQ(x.output[i].id, y.output[i].id) << "request " << key.first << " token " << i;
      EXPECT_EQ(std::memcmp(&x.output[i].logprob, &y.output[i].logprob, 4), 0);
      EXPECT_EQ(std::memcmp(&x.output[i].raw_logprob, &y.output[i].raw_logprob, 4), 0);
    }
    EXPECT_EQ(x.routed_experts, y.routed_experts);
    if (same_cache) {
      EXPECT_EQ(x.cached_tokens, y.cached_tokens);
    }
  }
}

inline const EngineOptions kEngine{.num_blocks = 128, .block_tokens = 8, .max_batch_tokens = 16};

// A drafter that knows the plain rollout's outputs (speculative decoding's tests): it proposes the
// continuation of the first known output that the sample's output so far begins (GRPO siblings
// share a start, so some guesses are a sibling's and get rejected), and with wrong_every > 0 turns
// every wrong_every-th proposed position (counted over the sample's output) into another id, so
// verify steps accept everything, a prefix, or nothing.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(const Finals& plain, int wrong_every, int32_t vocab)
      : wrong_every_(wrong_every), vocab_(vocab) {
    for (const auto& [key, e] : plain.by_sample) {
      std::vector<int32_t> ids;
      for (const TokenOutput& t : e.output) ids.push_back(t.id);
      outputs_.push_back(std::move(ids));
    }
  }
  Draft propose(const DraftQuery& q) override {
    Draft d;
    const auto done = q.tokens.subspan(static_cast<size_t>(q.prompt_len));
    for (const auto& o : outputs_) {
      if (o.size() <= done.size() || !std::equal(done.begin(), done.end(), o.begin())) continue;
      for (size_t j = done.size(); j < o.size() && d.tokens.size() < size_t(q.max_tokens); ++j) {
        const bool wrong = wrong_every_ > 0 && (j + 1) % static_cast<size_t>(wrong_every_) == 0;
        d.tokens.push_back(wrong ? (o[j] + 1) % vocab_ : o[j]);
        d.confidence.push_back(0.9f);
      }
      break;
    }
    return d;
  }

 private:
  std::vector<std::vector<int32_t>> outputs_;
  int wrong_every_;
  int32_t vocab_;
};

// kEngine with speculation on, every proposal verified (no cost model in the way).
inline EngineOptions speculative(EngineOptions e, int64_t max_draft_tokens = 4) {
  e.speculative.enabled = true;
  e.speculative.adaptive = false;
  e.speculative.max_draft_tokens = max_draft_tokens;
  return e;
}

inline std::unique_ptr<ModelRunner> one_process_runner(const ModelFiles& files, ThreadPool* pool) {
  auto model = Model::from_weights(files.config, files.weights);
  EXPECT_TRUE(model.ok()) << model.message();
  return make_model_runner(std::shared_ptr<const Model>(std::move(model).value()), pool);
}

// Every weight nudged (as an optimizer step would), as a flat buffer whose tensor views are the
// update.
inline FlatTensors nudged_weights(const ModelFiles& files) {
  auto layout = ParamLayout::for_model(files.config, &files.weights);
  auto flat = FlatTensors::from_tensor_map(layout, files.weights);
  EXPECT_TRUE(flat.ok()) << flat.message();
  std::mt19937 rng(3);
  for (float& x : flat->all()) x += 0.02f * (static_cast<float>(rng() % 1000) / 1000.0f - 0.5f);
  return std::move(flat).value();
}

// The same update through each engine's weight-update lifecycle.
inline void update_all(std::initializer_list<Engine*> engines, const TensorMap& next) {
  for (Engine* e : engines) {
    ASSERT_TRUE(e->begin_weight_update().ok());
    ASSERT_TRUE(e->update_weights(next).ok());
    ASSERT_TRUE(e->end_weight_update().ok());
  }
}

// The co-trained draft head (a fresh one over 256 of the model's ids) drafting run_workload(…, 5)
// in a one-process CPU engine and in `other` (an engine of the same model with
// speculative(kEngine) over another runner: tensor-parallel, a device): both give the plain
// engine's bits, and `other`'s head drafts, gets accepted and scores exactly as the one-process
// engine's (what it reads, the hidden states, are the same bits). With `layers`, the head reads
// those layers' outputs (EAGLE-3), its projection P moved off [0 | I] so that every layer counts.
inline void expect_head_drafts_as_one_process(const ModelFiles& files, Engine& other,
                                              ThreadPool* pool,
                                              std::span<const int64_t> layers = {}) {
  const std::vector<uint64_t> counts(static_cast<size_t>(files.config.vocab_size), 1);
  auto created = DraftHead::create(files.config, files.weights, top_ids(counts, 256), layers);
  ASSERT_TRUE(created.ok()) << created.message();
  if (layers.size() > 1) {
    FlatTensors p = (*created)->params();
    std::span<float> proj = p.get("draft.feature_fc.weight");
    for (size_t i = 0; i < proj.size(); ++i) proj[i] += 0.05f * std::sin(static_cast<float>(i));
    ASSERT_TRUE((*created)->set_params(p).ok());
  }
  const std::shared_ptr<const DraftHead> head = std::move(created).value();
  Engine plain(one_process_runner(files, pool), kEngine);
  const Finals want = run_workload(plain, 5);
  Engine one(one_process_runner(files, pool), speculative(kEngine));
  auto one_head = make_head_drafter(head, pool);
  const HeadDrafter* one_scores = one_head.get();
  one.set_drafter(std::move(one_head));
  expect_same_bits(want, run_workload(one, 5));
  auto other_head = make_head_drafter(head, pool);
  const HeadDrafter* other_scores = other_head.get();
  other.set_drafter(std::move(other_head));
  expect_same_bits(want, run_workload(other, 5));
  const EngineStats a = one.stats(), b = other.stats();
  EXPECT_GT(a.spec_draft_tokens, 20u);
  EXPECT_EQ(b.spec_draft_tokens, a.spec_draft_tokens);
  EXPECT_EQ(b.spec_accepted_tokens, a.spec_accepted_tokens);
  EXPECT_EQ(b.spec_verifies, a.spec_verifies);
  EXPECT_GT(other_scores->stats().scored, 0u);
  EXPECT_EQ(other_scores->stats().hits, one_scores->stats().hits);
  EXPECT_EQ(b.free_blocks, plain.stats().free_blocks);
}

}  // namespace miles::test
