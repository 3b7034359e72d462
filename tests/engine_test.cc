// The rollout engine with the real shared model (tiny HF Qwen3-MoE from tests/data): every token's
// logprob and experts equal a teacher-forced forward; a request's outputs are bit-identical alone,
// among 63 others, and with a prefix-cache hit; GRPO groups prefill once; pause/retract/abort; the
// free-block count returns to idle.
#include "miles/rollout/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "miles/weight_sync/disk_delta.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"
#include "test_paths.h"

namespace miles {
namespace {

struct Collected {
  std::map<std::pair<uint64_t, int>, SampleEvent> finals;
  std::map<std::pair<uint64_t, int>, std::vector<TokenOutput>> streamed;
  SampleListener listener() {
    return [this](const SampleEvent& e) {
      auto& s = streamed[{e.request_id, e.sample_index}];
      s.insert(s.end(), e.new_tokens.begin(), e.new_tokens.end());
      if (e.finished) finals[{e.request_id, e.sample_index}] = e;
    };
  }
};

std::shared_ptr<const Model> load(const std::string& name) {
  auto m = Model::load(test::data_dir() + "/models/" + name);
  EXPECT_TRUE(m.ok()) << m.message();
  return std::shared_ptr<const Model>(std::move(m).value());
}

GenerateRequest make_request(std::vector<int32_t> ids, uint64_t seed, int64_t max_new = 12) {
  GenerateRequest r;
  r.input_ids = std::move(ids);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = seed;
  r.max_new_tokens = max_new;
  return r;
}

void run_until_idle(Engine& e) {
  for (int i = 0; i < 10000 && !e.idle(); ++i) e.step();
  ASSERT_TRUE(e.idle());
}

bool same_outputs(const SampleEvent& a, const SampleEvent& b) {
  if (a.output.size() != b.output.size() || a.routed_experts != b.routed_experts) return false;
  for (size_t i = 0; i < a.output.size(); ++i)
    if (a.output[i].id != b.output[i].id ||
        std::memcmp(&a.output[i].logprob, &b.output[i].logprob, 4) != 0 ||
        std::memcmp(&a.output[i].raw_logprob, &b.output[i].raw_logprob, 4) != 0)
      return false;
  return true;
}

std::vector<int32_t> random_ids(std::mt19937& rng, int n) {
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % 1024);
  return v;
}

TEST(Engine, LogprobsAndExpertsEqualTeacherForcedForward) {
  auto model = load("qwen3_moe");
  ThreadPool pool(2);
  Engine e(make_model_runner(model, &pool), EngineOptions{.num_blocks = 256, .block_tokens = 8});
  Collected c;
  std::mt19937 rng(1);
  auto prompt = random_ids(rng, 21);
  auto id = e.submit(make_request(prompt, 42, 16), c.listener());
  ASSERT_TRUE(id.ok()) << id.message();
  run_until_idle(e);
  const SampleEvent& ev = c.finals.at({*id, 0});
  ASSERT_EQ(ev.output.size(), 16u);
  EXPECT_EQ(ev.finish_reason, FinishReason::kLength);
  // Teacher-forced: prompt + output, one forward.
  std::vector<int32_t> all = prompt;
  for (auto& t : ev.output) all.push_back(t.id);
  auto kv = model->make_kv_cache();
  SeqSpan s{0, 0, static_cast<int64_t>(all.size())};
  ForwardOptions fo;
  fo.return_experts = true;
  auto out = model->forward(all, {&s, 1}, *kv, fo, nullptr);
  ASSERT_TRUE(out.ok());
  std::vector<float> lp(1024);
  for (size_t i = 0; i < ev.output.size(); ++i) {
    const int64_t pos = prompt.size() - 1 + i;
    kernels::log_softmax_row(out->logits.data() + pos * 1024, 1024, lp.data());
    EXPECT_EQ(std::memcmp(&lp[ev.output[i].id], &ev.output[i].raw_logprob, 4), 0) << "token " << i;
  }
  // Routed experts of positions 0..T-2 equal the teacher-forced ones.
  const size_t per = 2 * 2;
  ASSERT_EQ(ev.routed_experts.size(), (all.size() - 1) * per);
  EXPECT_TRUE(std::equal(ev.routed_experts.begin(), ev.routed_experts.end(), out->experts.begin()));
  // Streamed tokens equal the final record.
  ASSERT_EQ(c.streamed.at({*id, 0}).size(), ev.output.size());
}

// MoE (routing recorded per token) and Mistral (sliding window 5: decode and chunked prefill skip
// and mask the keys before the window over the paged cache).
class EngineBatchInvariance : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineBatchInvariance, RequestIsBitIdenticalAloneAmong63AndWithPrefixHit) {
  auto model = load(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(3);
  auto prompt = random_ids(rng, 37);
  SampleEvent alone;
  {
    Engine e(make_model_runner(model, &pool), EngineOptions{.num_blocks = 512, .block_tokens = 8});
    Collected c;
    auto id = e.submit(make_request(prompt, 7), c.listener());
    run_until_idle(e);
    alone = c.finals.at({*id, 0});
  }
  // Among 63 others of different lengths, with a small token budget (chunked prefill), twice: the
  // second time the prompt's whole blocks come from the prefix cache.
  Engine e(make_model_runner(model, &pool),
           EngineOptions{.num_blocks = 2048, .block_tokens = 8, .max_batch_tokens = 96});
  for (int round = 0; round < 2; ++round) {
    Collected c;
    std::vector<uint64_t> others;
    for (int i = 0; i < 63; ++i) {
      auto r = e.submit(make_request(random_ids(rng, 1 + static_cast<int>(rng() % 60)), 100 + i,
                                     1 + static_cast<int64_t>(rng() % 20)),
                        c.listener());
      ASSERT_TRUE(r.ok());
      if (i == 30) {
        auto mine = e.submit(make_request(prompt, 7), c.listener());
        others.push_back(*mine);
      }
    }
    run_until_idle(e);
    const SampleEvent& got = c.finals.at({others[0], 0});
    EXPECT_TRUE(same_outputs(alone, got)) << "round " << round;
    if (round == 1) {
      EXPECT_EQ(got.cached_tokens, 32);  // 4 whole blocks of 8 out of 37
    }
  }
  EXPECT_GT(e.stats().cached_prompt_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineBatchInvariance,
                         ::testing::Values("qwen3_moe", "mistral", "gemma3", "glm4_moe",
                                           "deepseek_v3"));

TEST(Engine, GroupPrefillsOnceAndEachSampleEqualsItsOwnRequest) {
  auto model = load("qwen3_moe");
  ThreadPool pool(2);
  std::mt19937 rng(5);
  auto prompt = random_ids(rng, 29);
  Engine e(make_model_runner(model, &pool),
           EngineOptions{.num_blocks = 512, .block_tokens = 8, .enable_prefix_cache = false});
  Collected c;
  GenerateRequest g = make_request(prompt, 11);
  g.n = 8;
  auto id = e.submit(g, c.listener());
  ASSERT_TRUE(id.ok());
  int64_t prefill_tokens = 0;
  while (!e.idle()) {
    e.step();
    for (auto& it : e.last_iteration().items)
      if (it.prefill) prefill_tokens += it.n_tokens;
  }
  EXPECT_EQ(prefill_tokens, 29);  // the prompt, once
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < 8; ++i) {
    const SampleEvent& s = c.finals.at({*id, i});
    std::vector<int32_t> ids;
    for (auto& t : s.output) ids.push_back(t.id);
    distinct.insert(ids);
    // The same sample as a request of its own (seed derived as the engine does).
    Engine solo(make_model_runner(model, &pool),
                EngineOptions{.num_blocks = 128, .block_tokens = 8});
    Collected sc;
    auto r = make_request(prompt, 11 + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
    auto sid = solo.submit(r, sc.listener());
    run_until_idle(solo);
    EXPECT_TRUE(same_outputs(sc.finals.at({*sid, 0}), s)) << "sample " << i;
  }
  EXPECT_GT(distinct.size(), 4u);
  EXPECT_EQ(e.stats().free_blocks, 512);
}

// n separate requests of one prompt submitted at the same instant (an async GRPO client): the first
// prefills the prompt, the others wait for it and reuse its whole blocks from the prefix cache; each
// output is still that request's alone, bit for bit.
TEST(Engine, SeparateRequestsOfOnePromptSentTogetherPrefillItOnce) {
  auto model = load("qwen3_moe");
  ThreadPool pool(2);
  std::mt19937 rng(9);
  auto prompt = random_ids(rng, 29);
  Engine e(make_model_runner(model, &pool), EngineOptions{.num_blocks = 512, .block_tokens = 8});
  Collected c;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = e.submit(make_request(prompt, 40 + i), c.listener());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  int64_t prefill_tokens = 0;
  while (!e.idle()) {
    e.step();
    for (auto& it : e.last_iteration().items)
      if (it.prefill) prefill_tokens += it.n_tokens;
  }
  // The leader's 29 positions, then 7 × 5: each follower reuses 3 whole blocks of 8 (it must
  // compute at least its last prompt token).
  EXPECT_EQ(prefill_tokens, 29 + 7 * 5);
  EXPECT_EQ(e.stats().cached_prompt_tokens, 7 * 24);
  for (int i = 0; i < 8; ++i) {
    Engine solo(make_model_runner(model, &pool),
                EngineOptions{.num_blocks = 128, .block_tokens = 8});
    Collected sc;
    auto sid = solo.submit(make_request(prompt, 40 + i), sc.listener());
    run_until_idle(solo);
    EXPECT_TRUE(same_outputs(sc.finals.at({*sid, 0}), c.finals.at({ids[i], 0}))) << i;
  }
}

TEST(Engine, PauseRetractResumeGivesTheSameOutputsAndVersionsAreRecorded) {
  auto model = load("qwen3_moe");
  ThreadPool pool(2);
  std::mt19937 rng(9);
  auto prompt = random_ids(rng, 19);
  SampleEvent straight;
  {
    Engine e(make_model_runner(model, &pool), EngineOptions{.num_blocks = 128, .block_tokens = 8});
    Collected c;
    auto id = e.submit(make_request(prompt, 3, 20), c.listener());
    run_until_idle(e);
    straight = c.finals.at({*id, 0});
  }
  Engine e(make_model_runner(model, &pool), EngineOptions{.num_blocks = 128, .block_tokens = 8});
  Collected c;
  auto id = e.submit(make_request(prompt, 3, 20), c.listener());
  for (int i = 0; i < 6; ++i) e.step();
  e.pause(PauseMode::kRetract);
  EXPECT_FALSE(e.step());
  ASSERT_TRUE(e.flush_cache().ok());  // retract freed every block
  EXPECT_EQ(e.stats().free_blocks, 128);
  ASSERT_TRUE(e.update_weights(make_model_runner(model, &pool)).ok());
  e.update_weight_version(1);
  e.resume();
  run_until_idle(e);
  const SampleEvent& got = c.finals.at({*id, 0});
  EXPECT_TRUE(same_outputs(straight, got));
  ASSERT_EQ(got.output.size(), 20u);
  EXPECT_EQ(got.output.front().weight_version, 0);
  EXPECT_EQ(got.output.back().weight_version, 1);
}

TEST(Engine, AbortAndPauseAbortFreeEveryBlock) {
  auto model = load("qwen3_moe");
  ThreadPool pool(2);
  Engine e(make_model_runner(model, &pool),
           EngineOptions{.num_blocks = 64, .block_tokens = 8, .enable_prefix_cache = false});
  const int64_t idle = e.stats().free_blocks;
  Collected c;
  std::mt19937 rng(2);
  auto a = e.submit(make_request(random_ids(rng, 30), 1, 50), c.listener());
  auto b = e.submit(make_request(random_ids(rng, 10), 2, 50), c.listener());
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_LT(e.stats().free_blocks, idle);
  EXPECT_TRUE(e.abort(*a));
  EXPECT_EQ(c.finals.at({*a, 0}).finish_reason, FinishReason::kAbort);
  e.pause(PauseMode::kAbort);
  EXPECT_EQ(c.finals.at({*b, 0}).finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(e.stats().free_blocks, idle);
  EXPECT_FALSE(e.abort(*a));
}

TEST(Engine, InvalidRequestsAreRejectedWithTheField) {
  auto model = load("qwen3_moe");
  Engine e(make_model_runner(model, nullptr), EngineOptions{.num_blocks = 8, .block_tokens = 8});
  auto check = [&](GenerateRequest r, const std::string& needle) {
    auto id = e.submit(r, nullptr);
    ASSERT_FALSE(id.ok());
    EXPECT_NE(id.message().find(needle), std::string::npos) << id.message();
  };
  check(make_request({}, 1), "empty");
  check(make_request({1, 5000}, 1), "input_ids[1]");
  check(make_request(std::vector<int32_t>(256, 1), 1), "context length");
  check(make_request({1, 2}, 1, -1), "max_new_tokens");
  auto r = make_request({1, 2}, 1);
  r.sampling.top_p = 0;
  check(r, "top_p");
  r = make_request({1, 2}, 1);
  r.n = 0;
  check(r, "n = 0");
  r = make_request({1, 2}, 1, 200);
  check(r, "KV blocks");
  r = make_request({1, 2}, 1);
  r.stop_strings = {"x"};
  check(r, "tokenizer");
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

TEST(Engine, WeightUpdateBracketHoldsIterationsUntilItEnds) {
  auto model = load("qwen3_moe");
  Engine e(make_model_runner(model, nullptr), EngineOptions{.num_blocks = 64, .block_tokens = 8});
  Collected c;
  auto id = e.submit(make_request({1, 2, 3, 4}, 5, 6), c.listener());
  ASSERT_TRUE(e.step());
  EXPECT_FALSE(e.begin_weight_update().ok());  // generating: pause first
  e.pause(PauseMode::kInPlace);
  ASSERT_TRUE(e.begin_weight_update().ok());
  EXPECT_FALSE(e.begin_weight_update().ok());
  e.resume();
  EXPECT_FALSE(e.step());  // still inside the bracket
  ASSERT_TRUE(e.update_weights(make_model_runner(model, nullptr)).ok());
  e.update_weight_version(2);
  ASSERT_TRUE(e.end_weight_update().ok());
  EXPECT_FALSE(e.end_weight_update().ok());
  run_until_idle(e);
  const SampleEvent& fin = c.finals.at({*id, 0});
  ASSERT_EQ(fin.output.size(), 6u);
  EXPECT_EQ(fin.output.front().weight_version, 0);  // sampled before the update (in-place pause)
  EXPECT_EQ(fin.output.back().weight_version, 2);
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

// The same architecture with other weights: every float of model.norm.weight scaled.
std::shared_ptr<const Model> perturbed(const std::string& name) {
  auto files = load_model_files(test::data_dir() + "/models/" + name);
  EXPECT_TRUE(files.ok()) << files.message();
  WeightSet ws = weight_set_from_tensor_map(files->weights);
  for (NamedTensor& t : ws) {
    if (t.name != "model.norm.weight") continue;
    EXPECT_EQ(t.dtype, "F32");
    auto* f = reinterpret_cast<float*>(t.bytes.data());
    for (size_t i = 0; i < t.bytes.size() / 4; ++i) f[i] *= 1.5f;
  }
  auto map = tensor_map_from_weight_set(std::move(ws));
  EXPECT_TRUE(map.ok()) << map.message();
  auto m = Model::from_weights(files->config, *map);
  EXPECT_TRUE(m.ok()) << m.message();
  return std::shared_ptr<const Model>(std::move(m).value());
}

// A weight update must drop the prefix cache: KV computed with the old weights, reused under the
// new ones, would give logprobs no trainer can reproduce (found by `miles run`: the mismatch
// appeared when prompts repeated in the second epoch). A sample kept across an in-place update
// finishes on its old KV, which is never cached either.
TEST(Engine, WeightUpdateDropsThePrefixCacheAndNeverCachesOldKv) {
  auto model = load("qwen3_moe");
  auto next = perturbed("qwen3_moe");
  ThreadPool pool(2);
  std::mt19937 rng(5);
  auto prompt = random_ids(rng, 37);
  SampleEvent fresh;
  {
    Engine e(make_model_runner(next, &pool), EngineOptions{.num_blocks = 256, .block_tokens = 8});
    Collected c;
    auto id = e.submit(make_request(prompt, 7), c.listener());
    run_until_idle(e);
    fresh = c.finals.at({*id, 0});
  }
  Engine e(make_model_runner(model, &pool), EngineOptions{.num_blocks = 256, .block_tokens = 8});
  Collected c;
  auto first = e.submit(make_request(prompt, 7), c.listener());
  run_until_idle(e);
  EXPECT_FALSE(same_outputs(c.finals.at({*first, 0}), fresh));  // the weights do differ
  // In flight across an in-place update: it finishes on the old KV.
  auto kept = e.submit(make_request(prompt, 8, 30), c.listener());
  for (int i = 0; i < 3; ++i) e.step();
  e.pause(PauseMode::kInPlace);
  ASSERT_TRUE(e.update_weights(make_model_runner(next, &pool)).ok());
  e.resume();
  run_until_idle(e);
  EXPECT_EQ(c.finals.at({*kept, 0}).output.size(), 30u);
  auto again = e.submit(make_request(prompt, 7), c.listener());
  run_until_idle(e);
  const SampleEvent& got = c.finals.at({*again, 0});
  EXPECT_EQ(got.cached_tokens, 0);
  EXPECT_TRUE(same_outputs(got, fresh));
  // Now computed under the new weights: cached and reused, same bits.
  auto third = e.submit(make_request(prompt, 7), c.listener());
  run_until_idle(e);
  EXPECT_EQ(c.finals.at({*third, 0}).cached_tokens, 32);
  EXPECT_TRUE(same_outputs(c.finals.at({*third, 0}), fresh));
}

}  // namespace
}  // namespace miles
