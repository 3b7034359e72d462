// Backward of the shared model against torch autograd: for tiny Llama, Qwen3 and Qwen3-MoE
// checkpoints, the loss (Σ c·(−log p) − β Σ H) / N over four packed sequences and the gradient of
// every parameter, per-tensor relative error ≤ 1e-4 (goldens from scripts/make_grad_goldens.py).
// Also: gradients are bit-identical for 1 and 2 threads, and the training forward's logits are the
// inference forward's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "grad_case.h"
#include "miles/checkpoint.h"
#include "miles/flat_params.h"
#include "miles/logprob.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "test_paths.h"

namespace miles {
namespace {

using test::Case;
using test::GradRun;
using test::load_case;
using test::run_grad;

class GradParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GradParity, LossAndEveryGradientMatchTorch) {
  Case c = load_case(GetParam());
  GradRun r = run_grad(c, nullptr);
  const double ref_loss = c.golden.find("loss")->data<float>()[0];
  EXPECT_NEAR(r.loss, ref_loss, 1e-5 * std::max(1.0, std::fabs(ref_loss)));
  // logp and entropy per target token
  int64_t i = 0;
  double max_lp = 0;
  for (int s = 1; s <= 4; ++s) {
    const Tensor* lp = c.golden.find("seq" + std::to_string(s) + ".logp");
    const Tensor* en = c.golden.find("seq" + std::to_string(s) + ".entropy");
    for (int64_t j = 0; j < lp->numel(); ++j) {
      max_lp = std::max(max_lp, std::fabs(double(r.logp[i + j]) - lp->data<float>()[j]));
      max_lp = std::max(max_lp, std::fabs(double(r.entropy[i + j]) - en->data<float>()[j]));
    }
    i += lp->numel() + 1;
  }
  EXPECT_LT(max_lp, 1e-4);
  double worst = 0;
  std::string worst_name;
  for (const ParamSpec& s : r.grads.layout().specs()) {
    const Tensor* ref = c.golden.find("grad." + s.name);
    ASSERT_NE(ref, nullptr) << "golden lacks grad." << s.name;
    ASSERT_EQ(ref->numel(), s.numel) << s.name;
    const std::vector<float> want = ref->to_f32();
    std::span<const float> got = std::as_const(r.grads).get(s.name);
    double num = 0, den = 0;
    for (int64_t k = 0; k < s.numel; ++k) {
      const double d = double(got[k]) - want[k];
      num += d * d;
      den += double(want[k]) * want[k];
    }
    ASSERT_GT(den, 0.0) << s.name << " has an all-zero reference gradient";
    const double rel = std::sqrt(num / den);
    EXPECT_LE(rel, 1e-4) << s.name;
    if (rel > worst) {
      worst = rel;
      worst_name = s.name;
    }
  }
  std::printf("%s: loss %.7f (torch %.7f), worst relative gradient error %.2e (%s)\n",
              GetParam().c_str(), r.loss, ref_loss, worst, worst_name.c_str());
}

TEST_P(GradParity, GradientsAreIdenticalForOneAndTwoThreads) {
  Case c = load_case(GetParam());
  ThreadPool pool(2);
  GradRun a = run_grad(c, nullptr);
  GradRun b = run_grad(c, &pool);
  ASSERT_EQ(a.grads.all().size(), b.grads.all().size());
  EXPECT_EQ(0, std::memcmp(a.grads.all().data(), b.grads.all().data(),
                           a.grads.all().size() * sizeof(float)));
}

TEST_P(GradParity, TrainingForwardGivesTheInferenceLogits) {
  Case c = load_case(GetParam());
  GradRun r = run_grad(c, nullptr);
  auto kv = c.model->make_kv_cache();
  auto out = c.model->forward(c.tokens, c.seqs, *kv, ForwardOptions{}, nullptr);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(0, std::memcmp(out->logits.data(), r.logits.data(), r.logits.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Models, GradParity,
                         ::testing::Values("llama", "llama_tied", "qwen3", "qwen3_bf16",
                                           "qwen3_moe", "qwen3_moe_nonorm"));

TEST(ModelBackward, RejectsForwardsItCannotDifferentiate) {
  Case c = load_case("llama");
  auto kv = c.model->make_kv_cache();
  ForwardTape tape;
  ForwardOptions opt;
  opt.tape = &tape;
  opt.all_logits = false;
  auto out = c.model->forward(c.tokens, c.seqs, *kv, opt, nullptr);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("all_logits"), std::string::npos);
  FlatTensors g(ParamLayout::for_model(c.config));
  ForwardTape empty;
  EXPECT_FALSE(c.model->backward(empty, {}, g, nullptr).ok());
}

}  // namespace
}  // namespace miles
