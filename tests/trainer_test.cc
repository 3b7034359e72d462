// Trainer: a whole step (micro-batches, tree-summed gradients, clipping, AdamW) reproduces torch's
// 10-step AdamW run on the gradient goldens' loss; SFT lowers its loss; bad batches are rejected.
#include "miles/trainer/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "grad_case.h"
#include "miles/thread_pool.h"

namespace miles {
namespace {

// The goldens' objective: (Σ c·(−log p) − β Σ H) / N, response = every token after the first.
TokenObjective golden_objective(const test::Case& c, std::vector<std::vector<float>> coef) {
  return [&c, coef](const TokenView& v) -> Result<TokenLoss> {
    TokenLoss l;
    l.dlogp.resize(v.logp.size());
    l.dentropy.resize(v.logp.size());
    const double n = static_cast<double>(c.n_targets);
    for (size_t s = 0; s < v.samples.size(); ++s)
      for (int64_t i = v.offsets[s]; i < v.offsets[s + 1]; ++i) {
        const float ci = coef[v.samples[s]][i - v.offsets[s]];
        l.loss += (ci * -static_cast<double>(v.logp[i]) - c.beta * v.entropy[i]) / n;
        l.dlogp[i] = static_cast<float>(-ci / n);
        l.dentropy[i] = static_cast<float>(-c.beta / n);
      }
    return l;
  };
}

std::vector<TrainSample> samples_of(const test::Case& c, std::vector<std::vector<float>>& coef) {
  std::vector<TrainSample> out;
  int64_t i = 0;
  for (const SeqSpan& s : c.seqs) {
    TrainSample x;
    x.tokens.assign(c.tokens.begin() + i, c.tokens.begin() + i + s.n_tokens);
    x.response_length = s.n_tokens - 1;
    x.loss_mask.assign(x.response_length, 1.0f);
    coef.emplace_back(c.coef.begin() + i, c.coef.begin() + i + s.n_tokens - 1);
    out.push_back(std::move(x));
    i += s.n_tokens;
  }
  return out;
}

TrainerConfig golden_config(int64_t micro_batch_size) {
  TrainerConfig tc;
  tc.optimizer.weight_decay = 0.1;
  tc.optimizer.clip_grad_norm = 1.0;
  tc.lr.lr = 1e-3;
  tc.lr.min_lr = 1e-4;
  tc.lr.warmup_steps = 3;
  tc.lr.total_steps = 10;
  tc.lr.decay = LrSchedule::Decay::kCosine;
  tc.micro_batch_size = micro_batch_size;
  tc.need_entropy = true;
  return tc;
}

class TrainerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerParity, TenStepsMatchTorchForAnyMicroBatchSize) {
  test::Case c = test::load_case(GetParam());
  auto ref =
      read_safetensors(test::data_dir() + "/grad_goldens/adamw_" + GetParam() + ".safetensors");
  ASSERT_TRUE(ref.ok());
  std::vector<std::vector<float>> coef;
  const std::vector<TrainSample> batch = samples_of(c, coef);
  for (int64_t mbs : {1, 2, 4}) {
    auto tr = Trainer::create(c.config, c.weights, golden_config(mbs), nullptr);
    ASSERT_TRUE(tr.ok()) << tr.message();
    const TokenObjective obj = golden_objective(c, coef);
    for (int k = 0; k < 10; ++k) {
      auto r = (*tr)->step(batch, obj);
      ASSERT_TRUE(r.ok()) << r.message();
      const float want_loss = ref->find("step.loss")->data<float>()[k];
      const float want_norm = ref->find("step.grad_norm")->data<float>()[k];
      EXPECT_NEAR(r->loss, want_loss, 1e-4 * std::max(1.0f, std::fabs(want_loss)))
          << mbs << " " << k;
      EXPECT_NEAR(r->grad_norm, want_norm, 1e-4 * want_norm) << mbs << " " << k;
      EXPECT_EQ(r->step, k + 1);
    }
    double worst = 0;
    for (const ParamSpec& s : (*tr)->params().layout().specs()) {
      const std::vector<float> w = ref->find("final." + s.name)->to_f32();
      std::span<const float> got = (*tr)->params().get(s.name);
      double num = 0, den = 0;
      for (int64_t i = 0; i < s.numel; ++i) {
        num += (double(got[i]) - w[i]) * (double(got[i]) - w[i]);
        den += double(w[i]) * w[i];
      }
      worst = std::max(worst, std::sqrt(num / den));
    }
    EXPECT_LE(worst, 1e-4);
    std::printf("%s, micro-batch %ld: worst relative parameter error after 10 steps %.2e\n",
                GetParam().c_str(), static_cast<long>(mbs), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainerParity, ::testing::Values("llama", "qwen3_moe"));

TEST(Trainer, SameInputsSameBits) {
  test::Case c = test::load_case("qwen3_moe");
  std::vector<std::vector<float>> coef;
  const std::vector<TrainSample> batch = samples_of(c, coef);
  std::vector<float> finals[2];
  for (int run = 0; run < 2; ++run) {
    ThreadPool pool(run + 1);
    auto tr = Trainer::create(c.config, c.weights, golden_config(2), &pool);
    ASSERT_TRUE(tr.ok());
    for (int k = 0; k < 3; ++k) ASSERT_TRUE((*tr)->step(batch, golden_objective(c, coef)).ok());
    finals[run].assign((*tr)->params().all().begin(), (*tr)->params().all().end());
  }
  EXPECT_EQ(0, std::memcmp(finals[0].data(), finals[1].data(), finals[0].size() * 4));
}

// A CPU trainer and an emulated-device trainer (the CUDA kernels' code as host loops) take `steps`
// steps of `batch`: the same losses, gradient norms and parameters bit for bit; then both score the
// batch (with routing replay when `replay`): the same logprobs and experts.
void expect_device_trainer_bits(const test::Case& c, const std::vector<TrainSample>& batch,
                                const std::vector<std::vector<float>>& coef, int steps,
                                bool replay) {
  ThreadPool pool(2);
  TrainerConfig dc = golden_config(2);
  dc.device = Device::kEmulated;
  auto cpu = Trainer::create(c.config, c.weights, golden_config(2), &pool);
  auto dev = Trainer::create(c.config, c.weights, dc, &pool);
  ASSERT_TRUE(cpu.ok() && dev.ok()) << dev.message();
  for (int k = 0; k < steps; ++k) {
    auto a = (*cpu)->step(batch, golden_objective(c, coef));
    auto b = (*dev)->step(batch, golden_objective(c, coef));
    ASSERT_TRUE(a.ok() && b.ok()) << b.message();
    EXPECT_EQ(a->loss, b->loss) << k;
    EXPECT_EQ(a->grad_norm, b->grad_norm) << k;
  }
  const auto pa = (*cpu)->params().all(), pb = (*dev)->params().all();
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * 4));
  auto sa = (*cpu)->score(batch, replay), sb = (*dev)->score(batch, replay);
  ASSERT_TRUE(sa.ok() && sb.ok());
  for (size_t s = 0; s < batch.size(); ++s) {
    EXPECT_EQ(0, std::memcmp((*sa)[s].logp.data(), (*sb)[s].logp.data(), 4 * (*sa)[s].logp.size()));
    EXPECT_EQ((*sa)[s].experts, (*sb)[s].experts);
    if (replay) {
      EXPECT_EQ((*sb)[s].experts, std::vector<int32_t>(batch[s].routed_experts.begin(),
                                                       batch[s].routed_experts.end()));
    }
  }
}

// Dense: 3 steps with micro-batches of 2, the entropy term included.
TEST(Trainer, DeviceTrainerStepsAreTheCpuTrainersBits) {
  test::Case c = test::load_case("llama");
  std::vector<std::vector<float>> coef;
  const std::vector<TrainSample> batch = samples_of(c, coef);
  expect_device_trainer_bits(c, batch, coef, 3, false);
}

// MoE with routing replay (R3): the device trainer replays the samples' expert ids.
TEST(Trainer, DeviceTrainerWithRoutingReplayIsTheCpuTrainersBits) {
  test::Case c = test::load_case("qwen3_moe");
  std::vector<std::vector<float>> coef;
  std::vector<TrainSample> batch = samples_of(c, coef);
  const int64_t e = c.config.moe.num_experts;
  uint32_t seed = 7;
  for (TrainSample& s : batch) {  // distinct experts per token and layer
    const int64_t rows = (static_cast<int64_t>(s.tokens.size()) - 1) * c.config.num_moe_layers();
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t first = static_cast<int32_t>((seed = seed * 1103515245u + 12345u) >> 16) % e;
      for (int64_t j = 0; j < c.config.moe.top_k; ++j)
        s.routed_experts.push_back((first + static_cast<int32_t>(j)) % static_cast<int32_t>(e));
    }
  }
  expect_device_trainer_bits(c, batch, coef, 2, true);
}

TEST(Trainer, DeviceTrainerRefusesModelParallelLayouts) {
  TrainerConfig dc = golden_config(1);
  dc.device = Device::kEmulated;
  test::Case c = test::load_case("llama");
  auto tr = Trainer::create(c.config, c.weights, dc, nullptr);
  ASSERT_TRUE(tr.ok());
  Status s = (*tr)->set_pipeline_stage(0, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pp=1"), std::string::npos) << s.message();
}

TEST(Trainer, SftLowersTheLossAndScoreMatchesIt) {
  test::Case c = test::load_case("llama");
  std::vector<std::vector<float>> coef;
  std::vector<TrainSample> batch = samples_of(c, coef);
  batch[3].response_length = 10;  // prompt + 10 response tokens, one of them masked
  batch[3].loss_mask.assign(10, 1.0f);
  batch[3].loss_mask[4] = 0.0f;
  double total = 0;
  for (const TrainSample& s : batch)
    for (float m : s.loss_mask) total += m;
  TrainerConfig tc;
  tc.lr.lr = 1e-2;
  auto tr = Trainer::create(c.config, c.weights, tc, nullptr);
  ASSERT_TRUE(tr.ok());
  // Step 0's loss equals the mean NLL from score().
  auto scored = (*tr)->score(batch, false);
  ASSERT_TRUE(scored.ok());
  double nll = 0;
  for (size_t s = 0; s < batch.size(); ++s)
    for (size_t i = 0; i < batch[s].loss_mask.size(); ++i)
      nll -= batch[s].loss_mask[i] * double((*scored)[s].logp[i]);
  double first = 0, last = 0;
  for (int k = 0; k < 20; ++k) {
    auto r = (*tr)->step(batch, sft_objective(batch, total));
    ASSERT_TRUE(r.ok()) << r.message();
    if (k == 0) {
      first = r->loss;
      EXPECT_NEAR(first, nll / total, 1e-6);
      EXPECT_EQ(r->sums.at("loss_tokens"), total);
    }
    last = r->loss;
  }
  EXPECT_LT(last, first * 0.5) << "SFT on 4 sequences for 20 steps at lr 1e-2 must overfit";
}

TEST(Trainer, RejectsBadBatchesWithAReason) {
  test::Case c = test::load_case("qwen3_moe");
  TrainerConfig tc;
  tc.micro_batch_size = 2;
  auto tr = Trainer::create(c.config, c.weights, tc, nullptr);
  ASSERT_TRUE(tr.ok());
  std::vector<std::vector<float>> coef;
  std::vector<TrainSample> batch = samples_of(c, coef);
  auto obj = sft_objective(batch, 10);
  std::vector<TrainSample> odd(batch.begin(), batch.begin() + 3);
  EXPECT_NE((*tr)->step(odd, obj).message().find("micro_batch_size"), std::string::npos);
  std::vector<TrainSample> bad = batch;
  bad[1].loss_mask.pop_back();
  EXPECT_NE((*tr)->step(bad, obj).message().find("loss_mask"), std::string::npos);
  bad = batch;
  bad[0].tokens[1] = 1 << 20;
  EXPECT_NE((*tr)->step(bad, obj).message().find("vocabulary"), std::string::npos);
  bad = batch;
  bad[2].routed_experts.assign(5, 0);
  EXPECT_NE((*tr)->step(bad, obj).message().find("routed_experts"), std::string::npos);
  bad = batch;
  bad[0].response_length = 0;
  EXPECT_NE((*tr)->step(bad, obj).message().find("response_length"), std::string::npos);
  EXPECT_EQ((*tr)->steps_done(), 0);
  TrainerConfig bad_tc;
  bad_tc.micro_batch_size = 0;
  EXPECT_FALSE(Trainer::create(c.config, c.weights, bad_tc, nullptr).ok());
}

}  // namespace
}  // namespace miles
