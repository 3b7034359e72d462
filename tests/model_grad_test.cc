// Backward of the shared model against torch autograd: for tiny checkpoints of every family, the
// loss (Σ c·(−log p) − β Σ H) / N over four packed sequences and the gradient of every parameter,
// per-tensor relative error ≤ 1e-4 (goldens from scripts/make_grad_goldens.py). Also: gradients are
// bit-identical for 1 and 2 threads, and the training forward's logits are the inference forward's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
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
    if (!s.trainable) {  // a buffer (GLM-4 MoE's e_score_correction_bias): torch has no gradient
      EXPECT_EQ(c.golden.find("grad." + s.name), nullptr) << s.name;
      for (float g : std::as_const(r.grads).get(s.name)) ASSERT_EQ(g, 0.0f) << s.name;
      continue;
    }
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
    if (den == 0.0 && s.name.find(".mlp.experts.") != std::string::npos) {
      // An expert no token chose: torch gives it no gradient, and neither may we.
      EXPECT_EQ(num, 0.0) << s.name;
      continue;
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

// A training forward whose LM head runs on some rows only (ForwardOptions::logit_rows: a policy
// loss's response rows) against the whole forward whose other rows' d logits are zero: the same
// logits on those rows and every gradient bit for bit, but the head's weight gradient (a tied
// model's embedding gradient), whose sum runs over those rows only: equal to 1e-6.
TEST_P(GradParity, HeadOverSomeRowsGivesTheWholeForwardsGradients) {
  Case c = load_case(GetParam());
  ThreadPool pool(2);
  const int64_t t = c.tokens.size(), v = c.config.vocab_size;
  std::vector<int64_t> rows;  // the second half of each sequence but its last token
  int64_t first = 0;
  for (const SeqSpan& q : c.seqs) {
    for (int64_t j = q.n_tokens / 2; j + 1 < q.n_tokens; ++j) rows.push_back(first + j);
    first += q.n_tokens;
  }
  ASSERT_FALSE(rows.empty());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  std::vector<float> some(rows.size() * v), whole(static_cast<size_t>(t * v), 0.0f);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t k = 0; k < v; ++k) whole[rows[r] * v + k] = some[r * v + k] = nd(rng);
  auto grads = [&](std::span<const int64_t> logit_rows, std::span<const float> dlogits,
                   std::vector<float>& logits) {
    auto kv = c.model->make_kv_cache();
    ForwardTape tape;
    ForwardOptions opt;
    opt.tape = &tape;
    opt.logit_rows = logit_rows;
    auto out = c.model->forward(c.tokens, c.seqs, *kv, opt, &pool);
    EXPECT_TRUE(out.ok()) << out.message();
    logits = out->logits;
    FlatTensors g(ParamLayout::for_model(c.config, &c.weights));
    Status st = c.model->backward(tape, dlogits, g, &pool);
    EXPECT_TRUE(st.ok()) << st.message();
    return g;
  };
  std::vector<float> la, lb;
  const FlatTensors a = grads({}, whole, la), b = grads(rows, some, lb);
  ASSERT_EQ(lb.size(), some.size());
  for (size_t r = 0; r < rows.size(); ++r)
    ASSERT_EQ(0, std::memcmp(la.data() + rows[r] * v, lb.data() + r * v, v * sizeof(float))) << r;
  const std::string head =
      c.config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  for (const ParamSpec& s : a.layout().specs()) {
    const auto x = a.get(s.name), y = b.get(s.name);
    if (s.name != head) {
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << s.name;
      continue;
    }
    double num = 0, den = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      num += (double(x[k]) - y[k]) * (double(x[k]) - y[k]);
      den += double(x[k]) * x[k];
    }
    ASSERT_GT(den, 0.0);
    EXPECT_LE(std::sqrt(num / den), 1e-6) << s.name;
  }
  // Not ascending, or outside the batch: refused by name.
  std::vector<int64_t> bad = {rows[1], rows[0]};
  auto kv = c.model->make_kv_cache();
  ForwardOptions opt;
  opt.logit_rows = bad;
  auto out = c.model->forward(c.tokens, c.seqs, *kv, opt, &pool);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("logit_rows"), std::string::npos) << out.message();
}

INSTANTIATE_TEST_SUITE_P(Models, GradParity,
                         ::testing::Values("deepseek_v3", "deepseek_v3_noq", "gemma3", "glm4_moe",
                                           "glm4_moe_nonorm", "llama", "llama_tied", "llama_bias",
                                           "mistral", "phi3", "qwen2", "qwen3", "qwen3_bf16",
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

namespace miles {
namespace {

// R3: a training forward that replays given expert ids uses exactly those ids for every token and
// MoE layer, and the router still gets a gradient (gate weights come from its current scores).
TEST(RoutingReplay, ReplayedIdsAreUsedAndTheRouterStillLearns) {
  test::Case c = test::load_case("qwen3_moe");
  const int64_t t = c.tokens.size(), k = c.config.moe.top_k, e = c.config.moe.num_experts;
  const int64_t per_token = c.config.num_moe_layers() * k;
  // The router's own choice, then shifted ids: a different, valid routing.
  auto kv0 = c.model->make_kv_cache();
  ForwardOptions probe;
  probe.return_experts = true;
  auto own = c.model->forward(c.tokens, c.seqs, *kv0, probe, nullptr);
  ASSERT_TRUE(own.ok());
  std::vector<int32_t> forced(own->experts.size());
  for (size_t i = 0; i < forced.size(); ++i) forced[i] = (own->experts[i] + 1) % e;
  int64_t differ = 0;
  for (size_t i = 0; i < forced.size(); ++i) differ += forced[i] != own->experts[i];
  ASSERT_EQ(differ, static_cast<int64_t>(forced.size()));

  auto kv = c.model->make_kv_cache();
  ForwardTape tape;
  ForwardOptions opt;
  opt.tape = &tape;
  opt.return_experts = true;
  opt.forced_experts = forced;
  auto out = c.model->forward(c.tokens, c.seqs, *kv, opt, nullptr);
  ASSERT_TRUE(out.ok()) << out.message();
  ASSERT_EQ(static_cast<int64_t>(out->experts.size()), t * per_token);
  int64_t same = 0;
  for (size_t i = 0; i < forced.size(); ++i) same += out->experts[i] == forced[i];
  EXPECT_EQ(same, static_cast<int64_t>(forced.size())) << "100% of replayed ids must be used";

  std::vector<float> dlogp(t, -1.0f / t), logp(t);
  token_logprobs(out->logits.data(), t, c.config.vocab_size, c.targets.data(), logp.data(), nullptr);
  std::vector<float> dlogits(static_cast<size_t>(t * c.config.vocab_size));
  token_logprobs_backward(out->logits.data(), t, c.config.vocab_size, c.targets.data(),
                          dlogp.data(), nullptr, dlogits.data());
  FlatTensors g(ParamLayout::for_model(c.config, &c.weights));
  ASSERT_TRUE(c.model->backward(tape, dlogits, g, nullptr).ok());
  for (int64_t layer = 0; layer < c.config.num_layers; ++layer) {
    if (!c.config.is_moe_layer(layer)) continue;
    double sq = 0;
    for (float x : std::as_const(g).get("model.layers." + std::to_string(layer) + ".mlp.gate.weight"))
      sq += double(x) * x;
    EXPECT_GT(sq, 0.0) << "router of layer " << layer << " got no gradient under replay";
  }
  // Replaying the router's own choice reproduces the unreplayed gradients bit for bit.
  test::GradRun plain = test::run_grad(c, nullptr);
  auto kv2 = c.model->make_kv_cache();
  ForwardTape tape2;
  ForwardOptions opt2;
  opt2.tape = &tape2;
  opt2.forced_experts = own->experts;
  auto out2 = c.model->forward(c.tokens, c.seqs, *kv2, opt2, nullptr);
  ASSERT_TRUE(out2.ok());
  EXPECT_EQ(0, std::memcmp(out2->logits.data(), plain.logits.data(), plain.logits.size() * 4));
}

}  // namespace
}  // namespace miles
