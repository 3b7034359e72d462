// AdamW, clipping and the LR schedule against torch: 10 optimizer steps on tiny Llama and Qwen3-MoE
// checkpoints (scripts/make_grad_goldens.py: torch.optim.AdamW, clip_grad_norm_, warm-up + cosine),
// comparing every step's loss, pre-clip grad norm and lr, and every final parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "grad_case.h"
#include "miles/trainer/optimizer.h"
#include "miles/thread_pool.h"

namespace miles {
namespace {

class AdamWParity : public ::testing::TestWithParam<std::string> {};

TEST_P(AdamWParity, TenStepsMatchTorch) {
  test::Case c = test::load_case(GetParam());
  auto ref =
      read_safetensors(test::data_dir() + "/grad_goldens/adamw_" + GetParam() + ".safetensors");
  ASSERT_TRUE(ref.ok()) << ref.message();
  auto layout = ParamLayout::for_model(c.config, &c.weights);
  auto params = FlatTensors::from_tensor_map(layout, c.weights);
  ASSERT_TRUE(params.ok()) << params.message();
  const std::vector<float> initial(params->all().begin(), params->all().end());
  AdamWConfig ac;
  ac.beta1 = 0.9;
  ac.beta2 = 0.95;
  ac.eps = 1e-8;
  ac.weight_decay = 0.1;
  ac.clip_grad_norm = 1.0;
  LrSchedule sched;
  sched.lr = 1e-3;
  sched.min_lr = 1e-4;
  sched.warmup_steps = 3;
  sched.total_steps = 10;
  sched.decay = LrSchedule::Decay::kCosine;
  AdamW opt(layout, ac);
  const float* want_loss = ref->find("step.loss")->data<float>();
  const float* want_norm = ref->find("step.grad_norm")->data<float>();
  const float* want_lr = ref->find("step.lr")->data<float>();
  for (int k = 0; k < 10; ++k) {
    const TensorMap view = params->as_tensor_map();
    auto model = Model::from_weights(c.config, view);
    ASSERT_TRUE(model.ok()) << model.message();
    test::GradRun r = test::run_grad(c, nullptr, model->get(), &c.weights);
    const double norm = clip_grad_norm(r.grads, ac.clip_grad_norm);
    const double lr = sched.at(k);
    EXPECT_NEAR(r.loss, want_loss[k], 1e-4 * std::max(1.0, std::fabs(double(want_loss[k])))) << k;
    EXPECT_NEAR(norm, want_norm[k], 1e-4 * want_norm[k]) << k;
    EXPECT_NEAR(lr, want_lr[k], 1e-9) << k;
    opt.step(*params, r.grads, lr);
  }
  // Every parameter after 10 steps, and its change from the start, per tensor.
  double worst_param = 0, worst_delta = 0;
  std::string worst_name;
  for (const ParamSpec& s : layout->specs()) {
    const Tensor* want = ref->find("final." + s.name);
    ASSERT_NE(want, nullptr) << s.name;
    const std::vector<float> w = want->to_f32();
    double dp = 0, np = 0, dd = 0, nd = 0;
    for (int64_t i = 0; i < s.numel; ++i) {
      const double got = params->all()[s.offset + i], init = initial[s.offset + i];
      dp += (got - w[i]) * (got - w[i]);
      np += double(w[i]) * w[i];
      nd += (w[i] - init) * (w[i] - init);
    }
    dd = dp;
    const double rel_p = std::sqrt(dp / np), rel_d = std::sqrt(dd / nd);
    EXPECT_LE(rel_p, 1e-4) << s.name;
    EXPECT_LE(rel_d, 1e-3) << s.name;
    worst_param = std::max(worst_param, rel_p);
    if (rel_d > worst_delta) {
      worst_delta = rel_d;
      worst_name = s.name;
    }
  }
  std::printf(
      "%s after 10 AdamW steps: worst relative error of a parameter %.2e, of its change %.2e "
      "(%s)\n",
      GetParam().c_str(), worst_param, worst_delta, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Models, AdamWParity, ::testing::Values("llama", "qwen3_moe"));

TEST(LrSchedule, WarmupConstantAndCosine) {
  LrSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  s.decay = LrSchedule::Decay::kCosine;
  s.total_steps = 8;
  s.min_lr = 0.5;
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);
  EXPECT_DOUBLE_EQ(s.at(6), 0.75);
  EXPECT_DOUBLE_EQ(s.at(8), 0.5);
  EXPECT_DOUBLE_EQ(s.at(50), 0.5);
  EXPECT_TRUE(s.validate().ok());
  s.total_steps = 2;
  EXPECT_FALSE(s.validate().ok());
  LrSchedule bad;
  bad.lr = -1;
  EXPECT_NE(bad.validate().message().find("lr"), std::string::npos);
  AdamWConfig ac;
  ac.beta2 = 1.0;
  EXPECT_NE(ac.validate().message().find("beta2"), std::string::npos);
}

TEST(AdamW, StepIsDeterministicAndClipScalesOnlyAboveTheLimit) {
  test::Case c = test::load_case("llama");
  test::GradRun a = test::run_grad(c, nullptr);
  FlatTensors g2 = a.grads;
  const double n = global_grad_norm(a.grads);
  EXPECT_EQ(clip_grad_norm(g2, 1e9), n);
  EXPECT_EQ(0, std::memcmp(g2.all().data(), a.grads.all().data(), g2.all().size() * 4));
  clip_grad_norm(g2, n / 2);
  EXPECT_NEAR(global_grad_norm(g2), n / 2, 1e-5 * n);
}

// GLM-4 MoE's e_score_correction_bias is not trainable: a step leaves it exactly as loaded, even
// with weight decay and a (hypothetical) gradient in its slot, while the router next to it moves.
TEST(AdamW, SkipsParametersThatAreNotTrainable) {
  test::Case c = test::load_case("glm4_moe");
  test::GradRun r = test::run_grad(c, nullptr);
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  const std::string router = "model.layers.1.mlp.gate.weight";
  ASSERT_FALSE(r.grads.layout().at(bias).trainable);
  for (float g : std::as_const(r.grads).get(bias)) ASSERT_EQ(g, 0.0f);  // no gradient reaches it
  auto params = FlatTensors::from_tensor_map(r.grads.layout_ptr(), c.weights);
  ASSERT_TRUE(params.ok()) << params.message();
  const std::vector<float> bias0(params->get(bias).begin(), params->get(bias).end());
  const std::vector<float> router0(params->get(router).begin(), params->get(router).end());
  std::fill(r.grads.get(bias).begin(), r.grads.get(bias).end(), 1.0f);
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  AdamW opt(r.grads.layout_ptr(), ac);
  opt.step(*params, r.grads, 1e-2);
  EXPECT_EQ(std::vector<float>(params->get(bias).begin(), params->get(bias).end()), bias0);
  EXPECT_NE(std::vector<float>(params->get(router).begin(), params->get(router).end()), router0);
}

// squared_norm's order spelled out one element at a time: the vectorised lanes give its bits, for
// every tail length, and a tensor sums its slices in ascending order.
double scalar_slice(const float* g, int64_t n) {
  double lane[16] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % 16] = lane[i % 16] + static_cast<double>(g[i]) * g[i];
  for (int half = 8; half >= 1; half /= 2)
    for (int j = 0; j < half; ++j) lane[j] = lane[j] + lane[j + half];
  return lane[0];
}

TEST(AdamW, SquaredNormIsItsDocumentedOrder) {
  std::vector<float> g(3 * kNormSlice + 5);
  uint32_t x = 12345;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    // Magnitudes 2^-20 .. 2^20: the squares' sums round, so another order shows in the bits.
    v = std::ldexp(static_cast<float>(static_cast<int32_t>(x)) * 0x1p-31f, (x >> 7) % 41 - 20);
  }
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1000},
                    kNormSlice - 1, kNormSlice}) {
    const double got = squared_norm_slice(g.data() + 3, n), want = scalar_slice(g.data() + 3, n);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "n = " << n;
  }
  double want = 0.0;
  for (int64_t b = 0; b < static_cast<int64_t>(g.size()); b += kNormSlice)
    want = want + scalar_slice(g.data() + b, std::min<int64_t>(kNormSlice, g.size() - b));
  const double got = squared_norm(g.data(), static_cast<int64_t>(g.size()));
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0);
  // The tree itself: 2^54 (ulp 4) in lane 0 keeps four 1s that meet each other first (lanes 1, 9,
  // 5, 13: pairs at the first two levels) and loses two that meet it one at a time (lanes 1, 2).
  for (const int64_t n : {int64_t{14}, int64_t{16}}) {  // the scalar tail and the vector loop
    std::vector<float> t(n, 0.0f);
    t[0] = 0x1p27f;
    t[1] = t[9] = t[5] = t[13] = 1.0f;
    EXPECT_EQ(squared_norm_slice(t.data(), n), 0x1p54 + 4) << "n = " << n;
    t[9] = t[5] = t[13] = 0.0f;
    t[2] = 1.0f;
    EXPECT_EQ(squared_norm_slice(t.data(), n), 0x1p54) << "n = " << n;
  }
  long double exact = 0;  // and it is the sum of squares
  for (float v : g) exact += static_cast<long double>(v) * v;
  EXPECT_NEAR(got, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
}

// AdamW with grad_scale (the trainer's clipping without a pass over the gradients) gives the bits
// of clip_grad_norm's scaled gradients followed by a plain step.
TEST(AdamW, GradScaleIsClippingTheGradientsFirst) {
  test::Case c = test::load_case("llama");
  test::GradRun a = test::run_grad(c, nullptr);
  auto layout = ParamLayout::for_model(c.config, &c.weights);
  auto p0 = FlatTensors::from_tensor_map(layout, c.weights);
  ASSERT_TRUE(p0.ok());
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  const double norm = global_grad_norm(a.grads);
  const double max_norm = norm / 3;
  const float coef = static_cast<float>(max_norm / (norm + 1e-6));
  FlatTensors clipped = a.grads;
  clip_grad_norm(clipped, max_norm);
  FlatTensors want = *p0, got = *p0;
  AdamW first(layout, ac), second(layout, ac);
  ThreadPool pool(2);
  for (int k = 0; k < 3; ++k) {
    first.step(want, clipped, 1e-3, nullptr, &pool);
    second.step(got, a.grads, 1e-3, nullptr, &pool, coef);
  }
  EXPECT_EQ(0, std::memcmp(want.all().data(), got.all().data(), want.all().size() * 4));
  EXPECT_EQ(0, std::memcmp(first.exp_avg_sq().all().data(), second.exp_avg_sq().all().data(),
                           want.all().size() * 4));
  FlatTensors unscaled = *p0;
  AdamW third(layout, ac);
  third.step(unscaled, a.grads, 1e-3, nullptr, &pool);
  EXPECT_NE(0, std::memcmp(unscaled.all().data(), got.all().data(), want.all().size() * 4));
}

}  // namespace
}  // namespace miles
