// True on-policy: the rollout engine samples GRPO groups; the trainer, on the same weights,
// recomputes every response token's logprob bit for bit (|Δ| = 0), uses the same experts (R3: 100
// %, replay on or off), and step 0 of PPO has ppo_kl == 0 and clipfrac == 0 exactly — for a dense
// and an MoE model, whatever the trainer's micro-batch packing.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "miles/rollout/engine.h"
#include "miles/trainer/rl_objective.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"
#include "test_paths.h"

namespace miles {
namespace {

struct Rollout {
  std::vector<TrainSample> samples;
  std::vector<std::vector<float>> raw_logp;
  std::vector<int64_t> group;
};

Rollout generate(const ModelFiles& files, ThreadPool* pool) {
  auto model = Model::from_weights(files.config, files.weights);
  EXPECT_TRUE(model.ok());
  Engine e(make_model_runner(std::shared_ptr<const Model>(std::move(*model)), pool),
           EngineOptions{.num_blocks = 512, .block_tokens = 8});
  std::map<std::pair<uint64_t, int>, SampleEvent> finals;
  std::mt19937 rng(7);
  std::vector<uint64_t> ids;
  for (int p = 0; p < 3; ++p) {
    GenerateRequest r;
    for (int i = 0; i < 5 + 4 * p; ++i) r.input_ids.push_back(static_cast<int32_t>(rng() % 1024));
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 100 + p;
    r.max_new_tokens = 10 + p;
    r.ignore_eos = true;
    r.n = 4;
    auto id = e.submit(r, [&](const SampleEvent& ev) {
      if (ev.finished) finals[{ev.request_id, ev.sample_index}] = ev;
    });
    EXPECT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (int i = 0; i < 10000 && !e.idle(); ++i) e.step();
  EXPECT_TRUE(e.idle());
  Rollout out;
  rng.seed(7);
  for (int p = 0; p < 3; ++p) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 5 + 4 * p; ++i) prompt.push_back(static_cast<int32_t>(rng() % 1024));
    for (int s = 0; s < 4; ++s) {
      const SampleEvent& ev = finals.at({ids[p], s});
      TrainSample x;
      x.tokens = prompt;
      std::vector<float> lp;
      for (const TokenOutput& t : ev.output) {
        x.tokens.push_back(t.id);
        lp.push_back(t.raw_logprob);
      }
      x.response_length = ev.output.size();
      x.loss_mask.assign(x.response_length, 1.0f);
      x.routed_experts = ev.routed_experts;
      out.samples.push_back(std::move(x));
      out.raw_logp.push_back(std::move(lp));
      out.group.push_back(p);
    }
  }
  return out;
}

class OnPolicy : public ::testing::TestWithParam<std::string> {};

TEST_P(OnPolicy, TrainerLogprobsEqualRolloutBitForBitAndStepZeroIsExact) {
  auto files = load_model_files(test::data_dir() + "/models/" + GetParam());
  ASSERT_TRUE(files.ok()) << files.message();
  ThreadPool pool(2);
  const Rollout ro = generate(*files, &pool);
  const bool moe = files->config.num_moe_layers() > 0;
  for (int64_t mbs : {1, 4}) {
    TrainerConfig tc;
    tc.micro_batch_size = mbs;
    tc.lr.lr = 1e-3;
    auto tr = Trainer::create(files->config, files->weights, tc, &pool);
    ASSERT_TRUE(tr.ok()) << tr.message();
    for (bool replay : {true, false}) {
      auto scored = (*tr)->score(ro.samples, replay);
      ASSERT_TRUE(scored.ok()) << scored.message();
      int64_t tokens = 0, equal = 0, experts = 0, experts_equal = 0;
      for (size_t s = 0; s < ro.samples.size(); ++s) {
        for (size_t i = 0; i < ro.raw_logp[s].size(); ++i, ++tokens)
          equal += std::memcmp(&(*scored)[s].logp[i], &ro.raw_logp[s][i], 4) == 0;
        if (moe) {
          ASSERT_EQ((*scored)[s].experts.size(), ro.samples[s].routed_experts.size());
          for (size_t i = 0; i < (*scored)[s].experts.size(); ++i, ++experts)
            experts_equal += (*scored)[s].experts[i] == ro.samples[s].routed_experts[i];
        }
      }
      EXPECT_EQ(equal, tokens) << "replay " << replay << ": logprobs differing from the rollout's";
      if (moe) {
        EXPECT_EQ(experts_equal, experts) << "replay " << replay;
      }
    }
    // PPO step 0 with old = rollout logprobs: ratio exactly 1 everywhere.
    std::vector<float> rewards;
    std::mt19937 rng(3);
    for (size_t s = 0; s < ro.samples.size(); ++s) rewards.push_back(static_cast<float>(rng() % 2));
    std::vector<int64_t> offsets{0};
    std::vector<float> mask;
    for (const TrainSample& x : ro.samples) {
      offsets.push_back(offsets.back() + x.response_length);
      mask.insert(mask.end(), x.loss_mask.begin(), x.loss_mask.end());
    }
    auto adv = rl::compute_advantages(rl::AdvantageConfig{}, rewards, ro.group, offsets, mask);
    ASSERT_TRUE(adv.ok()) << adv.message();
    std::vector<RlSampleData> data(ro.samples.size());
    for (size_t s = 0; s < ro.samples.size(); ++s) {
      data[s].old_logp = ro.raw_logp[s];
      data[s].rollout_logp = ro.raw_logp[s];
      data[s].advantages.assign(adv->begin() + offsets[s], adv->begin() + offsets[s + 1]);
    }
    rl::LossConfig lc;
    lc.eps_high = 0.28;
    lc.correction = rl::IsCorrection::kTis;
    auto obj = rl_objective(ro.samples, data, lc);
    ASSERT_TRUE(obj.ok()) << obj.message();
    auto r = (*tr)->step(ro.samples, *obj);
    ASSERT_TRUE(r.ok()) << r.message();
    const auto m = rl_step_metrics(r->sums);
    EXPECT_EQ(m.at("ppo_kl"), 0.0);
    EXPECT_EQ(m.at("clipfrac"), 0.0);
    EXPECT_EQ(m.at("rollout_abs_diff_mean"), 0.0);
    EXPECT_EQ(m.at("is_ess"), 1.0);
    EXPECT_EQ(m.at("correction_frac"), 0.0);
    EXPECT_GT(r->grad_norm, 0.0);
    std::printf("%s micro-batch %ld: %ld tokens, ppo_kl %g clipfrac %g grad_norm %.4f\n",
                GetParam().c_str(), static_cast<long>(mbs), static_cast<long>(m.at("tokens")),
                m.at("ppo_kl"), m.at("clipfrac"), r->grad_norm);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, OnPolicy, ::testing::Values("llama", "qwen3", "qwen3_moe"));

TEST(RlObjective, RejectsMissingOrMisSizedInputs) {
  std::vector<TrainSample> batch(1);
  batch[0].tokens = {1, 2, 3};
  batch[0].response_length = 2;
  batch[0].loss_mask = {1, 1};
  std::vector<RlSampleData> data(1);
  data[0].old_logp = {0, 0};
  EXPECT_NE(rl_objective(batch, data, {}).status().message().find("advantages"), std::string::npos);
  data[0].advantages = {1, 1};
  EXPECT_TRUE(rl_objective(batch, data, {}).ok());
  rl::LossConfig lc;
  lc.kl = rl::KlEstimator::kK3;
  EXPECT_NE(rl_objective(batch, data, lc).status().message().find("ref_logp"), std::string::npos);
  EXPECT_FALSE(rl_objective(batch, std::span<const RlSampleData>(), {}).ok());
}

}  // namespace
}  // namespace miles
