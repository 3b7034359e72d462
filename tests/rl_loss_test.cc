// RL loss math (include/miles/trainer/rl_loss.h) against an independent torch reference
// (tests/data/rl/goldens.json from scripts/make_rl_goldens.py, gradients by autograd), a
// finite-difference check of d loss / d logp, the step-0 on-policy property, micro-batch additivity
// and bad inputs.
//
// Tolerance for goldens: |got - want| <= 1e-5 |want| + 1e-9 (relative 1e-5; the absolute floor only
// matters for values that are exactly 0 in one and rounding noise in the other). Both sides compute
// in double from the same float32 inputs, so the observed error is float32 rounding of per-token
// outputs.
#include "miles/trainer/rl_loss.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_paths.h"

namespace miles::rl {
namespace {

using nlohmann::json;

constexpr double kRelTol = 1e-5;
constexpr double kAbsTol = 1e-9;

struct Inputs {
  std::vector<int64_t> offsets, group_index;
  std::vector<float> rewards, loss_mask, logp, old_logp, ref_logp, rollout_logp, entropy;
  TokenBatch batch(const std::vector<float>& adv) const {
    return TokenBatch{offsets, logp, old_logp, ref_logp, rollout_logp, entropy, adv, loss_mask};
  }
};

const json& goldens() {
  static const json j = [] {
    std::ifstream f(test::data_dir() + "/rl/goldens.json");
    EXPECT_TRUE(f.good()) << "missing tests/data/rl/goldens.json";
    return json::parse(f);
  }();
  return j;
}

Inputs load_inputs() {
  const json& in = goldens()["inputs"];
  Inputs x;
  x.offsets = in["offsets"].get<std::vector<int64_t>>();
  x.group_index = in["group_index"].get<std::vector<int64_t>>();
  for (auto [name, dst] : {std::pair{"rewards", &x.rewards},
                           {"loss_mask", &x.loss_mask},
                           {"logp", &x.logp},
                           {"old_logp", &x.old_logp},
                           {"ref_logp", &x.ref_logp},
                           {"rollout_logp", &x.rollout_logp},
                           {"entropy", &x.entropy}}) {
    *dst = in[name].get<std::vector<float>>();
  }
  return x;
}

AdvantageConfig parse_advantage(const json& j) {
  AdvantageConfig c;
  const std::string e = j.value("estimator", "grpo");
  c.estimator = e == "grpo"           ? AdvantageEstimator::kGrpo
                : e == "dr_grpo"      ? AdvantageEstimator::kDrGrpo
                : e == "reinforce_pp" ? AdvantageEstimator::kReinforcePlusPlus
                                      : AdvantageEstimator::kReinforcePlusPlusBaseline;
  c.std_normalize = j.value("std_normalize", true);
  return c;
}

LossConfig parse_loss(const json& j) {
  LossConfig c;
  c.policy = j.value("policy", "ppo") == "gspo" ? PolicyLossKind::kGspo : PolicyLossKind::kPpoClip;
  c.eps_low = j.value("eps_low", 0.2);
  c.eps_high = j.value("eps_high", 0.2);
  c.dual_clip_c = j.value("dual_clip_c", 0.0);
  const std::string kl = j.value("kl", "none");
  c.kl = kl == "k1"   ? KlEstimator::kK1
         : kl == "k2" ? KlEstimator::kK2
         : kl == "k3" ? KlEstimator::kK3
                      : KlEstimator::kNone;
  c.kl_coef = j.value("kl_coef", 0.0);
  c.entropy_coef = j.value("entropy_coef", 0.0);
  const std::string red = j.value("reduction", "token_mean");
  c.reduction = red == "sample_mean" ? LossReduction::kSampleMean
                : red == "constant"  ? LossReduction::kConstant
                                     : LossReduction::kTokenMean;
  c.token_normaliser = j.value("token_normaliser", 0.0);
  c.sample_normaliser = j.value("sample_normaliser", 0.0);
  c.constant_normaliser = j.value("constant_normaliser", 0.0);
  const std::string corr = j.value("correction", "none");
  c.correction = corr == "tis"            ? IsCorrection::kTis
                 : corr == "mis_token"    ? IsCorrection::kMisToken
                 : corr == "mis_sequence" ? IsCorrection::kMisSequence
                                          : IsCorrection::kNone;
  c.tis_c = j.value("tis_c", 2.0);
  c.mis_low = j.value("mis_low", 0.5);
  c.mis_high = j.value("mis_high", 2.0);
  return c;
}

// Tracks the worst relative error seen, for the report printed at the end.
double g_max_rel = 0;

void expect_close(double got, double want, const std::string& what) {
  const double err = std::fabs(got - want);
  g_max_rel = std::max(g_max_rel, err / std::max(std::fabs(want), 1e-300));
  if (want == 0) g_max_rel = std::max(g_max_rel, err);
  EXPECT_LE(err, kRelTol * std::fabs(want) + kAbsTol)
      << what << ": got " << got << " want " << want;
}

void expect_close(const std::vector<float>& got, const json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    expect_close(got[i], want[i].get<double>(), what + "[" + std::to_string(i) + "]");
  }
}

TEST(RlLossGolden, EveryCaseMatchesTorchReference) {
  const Inputs x = load_inputs();
  int checked = 0;
  for (const json& c : goldens()["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const json& want = c["expected"];
    const LossConfig lc = parse_loss(c["loss"]);
    if (c["kind"] == "sft") {
      Result<LossResult> r = sft_loss(lc, x.batch({}));
      ASSERT_TRUE(r.ok()) << r.message();
      expect_close(r->loss, want["loss"], "loss");
      expect_close(r->dlogp, want["dlogp"], "dlogp");
      EXPECT_EQ(r->metrics.num_tokens, want["metrics"]["num_tokens"].get<int64_t>());
      ++checked;
      continue;
    }
    Result<std::vector<float>> adv = compute_advantages(parse_advantage(c["advantage"]), x.rewards,
                                                        x.group_index, x.offsets, x.loss_mask);
    ASSERT_TRUE(adv.ok()) << adv.message();
    expect_close(*adv, want["advantages"], "advantages");
    Result<LossResult> r = policy_loss(lc, x.batch(*adv));
    ASSERT_TRUE(r.ok()) << r.message();
    expect_close(r->loss, want["loss"], "loss");
    expect_close(r->pg_loss, want["pg_loss"], "pg_loss");
    expect_close(r->kl_loss, want["kl_loss"], "kl_loss");
    expect_close(r->entropy_loss, want["entropy_loss"], "entropy_loss");
    expect_close(r->dlogp, want["dlogp"], "dlogp");
    expect_close(r->dentropy, want["dentropy"], "dentropy");
    const json& m = want["metrics"];
    const LossMetrics& g = r->metrics;
    expect_close(g.ppo_kl, m["ppo_kl"], "ppo_kl");
    expect_close(g.clipfrac, m["clipfrac"], "clipfrac");
    expect_close(g.dual_clipfrac, m["dual_clipfrac"], "dual_clipfrac");
    expect_close(g.rollout_abs_diff_mean, m["rollout_abs_diff_mean"], "rollout_abs_diff_mean");
    expect_close(g.rollout_abs_diff_max, m["rollout_abs_diff_max"], "rollout_abs_diff_max");
    expect_close(g.rollout_kl, m["rollout_kl"], "rollout_kl");
    expect_close(g.is_ess, m["is_ess"], "is_ess");
    expect_close(g.correction_frac, m["correction_frac"], "correction_frac");
    EXPECT_EQ(g.num_tokens, m["num_tokens"].get<int64_t>());
    ++checked;
  }
  EXPECT_EQ(checked, 9);
  std::printf("rl goldens: %d cases, max relative error %.3g\n", checked, g_max_rel);
}

// Central differences of the loss (double) in logp. The perturbed logp is a float, so the step
// actually taken is computed exactly as float(logp + h) - logp.
TEST(RlLossGradient, FiniteDifferencesMatchDlogp) {
  const Inputs x = load_inputs();
  double worst = 0;
  for (const json& c : goldens()["cases"]) {
    if (c["kind"] != "policy") continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    const LossConfig lc = parse_loss(c["loss"]);
    Result<std::vector<float>> adv = compute_advantages(parse_advantage(c["advantage"]), x.rewards,
                                                        x.group_index, x.offsets, x.loss_mask);
    ASSERT_TRUE(adv.ok());
    Result<LossResult> base = policy_loss(lc, x.batch(*adv));
    ASSERT_TRUE(base.ok());
    for (size_t t : {0, 7, 20, 33, 51, 64, 80}) {
      if (t >= x.logp.size()) continue;
      const double h = 1.0 / 16384;
      Inputs plus = x, minus = x;
      plus.logp[t] = static_cast<float>(x.logp[t] + h);
      minus.logp[t] = static_cast<float>(x.logp[t] - h);
      const double step = double(plus.logp[t]) - double(minus.logp[t]);
      Result<LossResult> lp = policy_loss(lc, plus.batch(*adv));
      Result<LossResult> lm = policy_loss(lc, minus.batch(*adv));
      ASSERT_TRUE(lp.ok() && lm.ok());
      const double fd = (lp->loss - lm->loss) / step;
      const double an = base->dlogp[t];
      worst = std::max(worst, std::fabs(fd - an));
      EXPECT_NEAR(fd, an, 1e-4 * std::fabs(an) + 1e-7) << "token " << t;
    }
  }
  std::printf("finite differences: max abs error %.3g\n", worst);
}

std::vector<LossConfig> all_variants() {
  std::vector<LossConfig> out;
  for (const json& c : goldens()["cases"]) {
    if (c["kind"] == "policy") out.push_back(parse_loss(c["loss"]));
  }
  return out;
}

// True on-policy step 0: logp == old_logp == rollout_logp bit for bit gives ppo_kl == 0 and
// clipfrac == 0 exactly, for every variant; no correction truncates or drops anything.
TEST(RlLossStepZero, OnPolicyGivesExactZeros) {
  Inputs x = load_inputs();
  x.old_logp = x.logp;
  x.rollout_logp = x.logp;
  for (AdvantageEstimator e :
       {AdvantageEstimator::kGrpo, AdvantageEstimator::kDrGrpo,
        AdvantageEstimator::kReinforcePlusPlus, AdvantageEstimator::kReinforcePlusPlusBaseline}) {
    AdvantageConfig ac;
    ac.estimator = e;
    Result<std::vector<float>> adv =
        compute_advantages(ac, x.rewards, x.group_index, x.offsets, x.loss_mask);
    ASSERT_TRUE(adv.ok());
    for (const LossConfig& lc : all_variants()) {
      Result<LossResult> r = policy_loss(lc, x.batch(*adv));
      ASSERT_TRUE(r.ok()) << r.message();
      EXPECT_EQ(r->metrics.ppo_kl, 0.0);
      EXPECT_EQ(r->metrics.clipfrac, 0.0);
      EXPECT_EQ(r->metrics.dual_clipfrac, 0.0);
      EXPECT_EQ(r->metrics.correction_frac, 0.0);
      EXPECT_EQ(r->metrics.rollout_abs_diff_max, 0.0);
      EXPECT_EQ(r->metrics.rollout_kl, 0.0);
      EXPECT_EQ(r->metrics.is_ess, 1.0);
    }
  }
}

// Micro-batches normalised by the global token count add up to the whole batch's loss and gradient.
TEST(RlLossReduction, GlobalTokenNormaliserMakesMicroBatchesAdditive) {
  const Inputs x = load_inputs();
  AdvantageConfig ac;
  Result<std::vector<float>> adv =
      compute_advantages(ac, x.rewards, x.group_index, x.offsets, x.loss_mask);
  ASSERT_TRUE(adv.ok());
  LossConfig lc;
  lc.kl = KlEstimator::kK3;
  lc.kl_coef = 0.05;
  Result<LossResult> whole = policy_loss(lc, x.batch(*adv));
  ASSERT_TRUE(whole.ok());
  lc.token_normaliser = static_cast<double>(whole->metrics.num_tokens);
  const size_t split = 6;  // samples [0, 6) and [6, 12)
  const int64_t cut = x.offsets[split];
  double sum = 0;
  std::vector<float> grads;
  for (int part = 0; part < 2; ++part) {
    const int64_t lo = part == 0 ? 0 : cut, hi = part == 0 ? cut : x.offsets.back();
    std::vector<int64_t> off;
    for (size_t s = part == 0 ? 0 : split; s < (part == 0 ? split + 1 : x.offsets.size()); ++s) {
      off.push_back(x.offsets[s] - lo);
    }
    auto sl = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + lo, v.begin() + hi);
    };
    const auto lp = sl(x.logp), old = sl(x.old_logp), ref = sl(x.ref_logp), ro = sl(x.rollout_logp),
               ent = sl(x.entropy), a = sl(*adv), mask = sl(x.loss_mask);
    Result<LossResult> r = policy_loss(lc, TokenBatch{off, lp, old, ref, ro, ent, a, mask});
    ASSERT_TRUE(r.ok()) << r.message();
    sum += r->loss;
    grads.insert(grads.end(), r->dlogp.begin(), r->dlogp.end());
  }
  EXPECT_NEAR(sum, whole->loss, 1e-12 * std::fabs(whole->loss) + 1e-15);
  ASSERT_EQ(grads.size(), whole->dlogp.size());
  for (size_t t = 0; t < grads.size(); ++t) EXPECT_EQ(grads[t], whole->dlogp[t]) << t;
}

// Same inputs, same bits.
TEST(RlLossDeterminism, RepeatedCallsAreBitIdentical) {
  const Inputs x = load_inputs();
  AdvantageConfig ac;
  ac.estimator = AdvantageEstimator::kReinforcePlusPlusBaseline;
  auto adv = compute_advantages(ac, x.rewards, x.group_index, x.offsets, x.loss_mask);
  ASSERT_TRUE(adv.ok());
  for (const LossConfig& lc : all_variants()) {
    auto a = policy_loss(lc, x.batch(*adv));
    auto b = policy_loss(lc, x.batch(*adv));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_EQ(a->dlogp, b->dlogp);
  }
}

void expect_error(const Status& s, const std::string& field) {
  EXPECT_FALSE(s.ok()) << "expected an error naming " << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(RlLossErrors, BadConfigsAndInputsAreStatusErrors) {
  const Inputs x = load_inputs();
  const std::vector<float> adv(x.logp.size(), 0.5f);
  auto run = [&](const LossConfig& c) { return policy_loss(c, x.batch(adv)).status(); };
  LossConfig c;
  c.eps_low = -0.1;
  expect_error(run(c), "eps_low");
  c = {};
  c.eps_high = -0.1;
  expect_error(run(c), "eps_high");
  c = {};
  c.dual_clip_c = 0.5;
  expect_error(run(c), "dual_clip_c");
  c = {};
  c.correction = IsCorrection::kTis;
  c.tis_c = 0;
  expect_error(run(c), "tis_c");
  c = {};
  c.correction = IsCorrection::kMisToken;
  c.mis_low = 2.0;
  c.mis_high = 1.0;
  expect_error(run(c), "mis_high");
  c = {};
  c.reduction = LossReduction::kConstant;
  expect_error(run(c), "constant_normaliser");
  c = {};
  c.token_normaliser = -1;
  expect_error(run(c), "token_normaliser");

  // Mismatched lengths, missing optional arrays a config needs, an empty mask, bad offsets.
  std::vector<float> short_logp(x.logp.begin(), x.logp.end() - 1);
  TokenBatch b = x.batch(adv);
  b.logp = short_logp;
  expect_error(policy_loss({}, b).status(), "logp");
  b = x.batch(adv);
  b.advantages = {};
  expect_error(policy_loss({}, b).status(), "advantages");
  c = {};
  c.kl = KlEstimator::kK3;
  b = x.batch(adv);
  b.ref_logp = {};
  expect_error(policy_loss(c, b).status(), "ref_logp");
  c = {};
  c.correction = IsCorrection::kMisSequence;
  b = x.batch(adv);
  b.rollout_logp = {};
  expect_error(policy_loss(c, b).status(), "rollout_logp");
  const std::vector<float> zeros(x.loss_mask.size(), 0.0f);
  b = x.batch(adv);
  b.loss_mask = zeros;
  expect_error(policy_loss({}, b).status(), "loss_mask");
  expect_error(sft_loss({}, b).status(), "loss_mask");
  std::vector<int64_t> bad_offsets = x.offsets;
  std::swap(bad_offsets[2], bad_offsets[3]);
  b = x.batch(adv);
  b.offsets = bad_offsets;
  expect_error(policy_loss({}, b).status(), "offsets");

  AdvantageConfig ac;
  const std::vector<float> few_rewards(3, 1.0f);
  expect_error(compute_advantages(ac, few_rewards, x.group_index, x.offsets, x.loss_mask).status(),
               "rewards");
  ac.std_eps = -1;
  expect_error(compute_advantages(ac, x.rewards, x.group_index, x.offsets, x.loss_mask).status(),
               "std_eps");
}

// Hand-checked values: a group of one has advantage 0; GRPO matches a direct computation.
TEST(RlAdvantages, SmallHandComputedCases) {
  const std::vector<int64_t> offsets = {0, 2, 3, 5};
  const std::vector<float> mask = {1, 1, 1, 0, 1};
  const std::vector<float> rewards = {1, 0, 5};
  const std::vector<int64_t> groups = {4, 4, 9};
  AdvantageConfig ac;
  auto a = compute_advantages(ac, rewards, groups, offsets, mask);
  ASSERT_TRUE(a.ok());
  const double std_g = std::sqrt(0.5);  // unbiased std of {1, 0}
  EXPECT_FLOAT_EQ((*a)[0], static_cast<float>(0.5 / (std_g + 1e-6)));
  EXPECT_FLOAT_EQ((*a)[2], static_cast<float>(-0.5 / (std_g + 1e-6)));
  EXPECT_EQ((*a)[3], 0.0f);  // masked
  EXPECT_EQ((*a)[4], 0.0f);  // group of one
}

}  // namespace
}  // namespace miles::rl
