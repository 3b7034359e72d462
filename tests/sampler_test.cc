// The sampler against a double-precision reference of the filtered distribution: empirical
// frequencies over 20000 steps, logprob and raw_logprob of every draw, greedy ties, reproducibility
// per (seed, step) and Philox4x32-10's known-answer vectors.
#include "miles/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "miles/kernels.h"
#include "sampling/philox.h"

namespace miles {
namespace {

// Ten tokens: a tie between ids 1 and 3, a masked id 8.
const std::vector<float> kLogits = {1.0f, 2.5f, 0.3f,  2.5f,      -1.0f,
                                    0.8f, 1.9f, -3.0f, -INFINITY, 0.0f};

std::vector<double> log_softmax_double(const std::vector<float>& x, double temperature) {
  double m = -INFINITY;
  for (const float v : x) m = std::max(m, v / temperature);
  double s = 0.0;
  for (const float v : x) s += std::exp(v / temperature - m);
  std::vector<double> out;
  for (const float v : x) out.push_back(v / temperature - m - std::log(s));
  return out;
}

// The distribution sample_token draws from, in double: softmax(x / T), then top-k (ties to the
// lower id), top-p on the top-k-renormalised probabilities (smallest prefix reaching top_p), min-p
// against the largest probability; renormalised. Dropped tokens get 0.
std::vector<double> reference_distribution(const std::vector<float>& x, const SamplingParams& sp) {
  const std::vector<double> logp = log_softmax_double(x, sp.temperature);
  std::vector<double> p;
  for (const double l : logp) p.push_back(std::exp(l));
  const int n = static_cast<int>(x.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  if (sp.top_k > 0 && sp.top_k < n) order.resize(sp.top_k);
  double mass = 0.0;
  for (const int id : order) mass += p[id];
  double cum = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    cum += p[order[i]] / mass;
    if (cum >= sp.top_p) {
      order.resize(i + 1);
      break;
    }
  }
  const double p_max = p[order[0]];
  std::erase_if(order, [&](int id) { return p[id] < sp.min_p * p_max; });
  std::vector<double> q(n, 0.0);
  double kept = 0.0;
  for (const int id : order) kept += p[id];
  for (const int id : order) q[id] = p[id] / kept;
  return q;
}

SamplingParams params(float temperature, int32_t top_k, float top_p, float min_p,
                      uint64_t seed = 42) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  sp.seed = seed;
  return sp;
}

TEST(Philox, KnownAnswerVectors) {
  // Random123's kat_vectors for philox4x32 10: counter, key -> output.
  using sampling::philox4x32_10;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (sampling::PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (sampling::PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (sampling::PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(SamplingUniform, InUnitIntervalAndUniform) {
  // Word layout: (seed 0, step 0) is the first KAT vector's words 0 and 1.
  const uint64_t bits = (uint64_t{0xe169c58d} << 32) | 0x6627e8d5;
  EXPECT_EQ(sampling_uniform(0, 0), static_cast<double>(bits >> 11) * 0x1p-53);
  const int n = 100000;
  double sum = 0.0;
  std::vector<int> bins(10, 0);
  for (int i = 0; i < n; ++i) {
    const double u = sampling_uniform(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++bins[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  for (const int b : bins) EXPECT_NEAR(b, n / 10.0, 5 * std::sqrt(n * 0.1 * 0.9));
}

TEST(Sampler, GreedyIsArgmaxWithTiesToTheLowestId) {
  const std::vector<double> raw = log_softmax_double(kLogits, 1.0);
  for (const float t : {0.0f, 1e-7f}) {
    for (uint64_t step = 0; step < 5; ++step) {
      const SampleResult r = sample_token(kLogits, params(t, 0, 1, 0, step * 31), step);
      EXPECT_EQ(r.token, 1);
      EXPECT_EQ(r.logprob, 0.0f);
      EXPECT_NEAR(r.raw_logprob, raw[1], 1e-5);
    }
  }
  // Greedy ignores the filters.
  EXPECT_EQ(sample_token(kLogits, params(0, 5, 0.5f, 0.5f), 0).token, 1);
}

TEST(Sampler, SameSeedAndStepGiveTheSameBitsInAnyOrder) {
  const SamplingParams a = params(0.8f, 0, 0.95f, 0, 1234);
  const SamplingParams b = params(1.1f, 4, 1.0f, 0.02f, 99);
  std::vector<SampleResult> forward;
  for (uint64_t step = 0; step < 300; ++step) forward.push_back(sample_token(kLogits, a, step));
  // Reverse order, interleaved with another request's draws.
  for (uint64_t step = 300; step-- > 0;) {
    (void)sample_token(kLogits, b, step);
    const SampleResult r = sample_token(kLogits, a, step);
    ASSERT_EQ(r.token, forward[step].token) << step;
    ASSERT_EQ(std::memcmp(&r.logprob, &forward[step].logprob, 4), 0) << step;
    ASSERT_EQ(std::memcmp(&r.raw_logprob, &forward[step].raw_logprob, 4), 0) << step;
  }
}

TEST(Sampler, DifferentSeedsGiveDifferentSequences) {
  const std::vector<float> flat(16, 0.0f);
  const int kSeeds = 64, kSteps = 64;
  std::set<std::vector<int32_t>> sequences;
  std::vector<std::vector<int32_t>> all;
  for (int s = 0; s < kSeeds; ++s) {
    std::vector<int32_t> seq;
    for (int step = 0; step < kSteps; ++step)
      seq.push_back(sample_token(flat, params(1, 0, 1, 0, s), step).token);
    sequences.insert(seq);
    all.push_back(seq);
  }
  EXPECT_EQ(static_cast<int>(sequences.size()), kSeeds);
  // Two seeds agree at a step with probability 1/16, like independent draws.
  int agree = 0, pairs = 0;
  for (int s = 0; s + 1 < kSeeds; ++s) {
    for (int step = 0; step < kSteps; ++step) agree += all[s][step] == all[s + 1][step];
    pairs += kSteps;
  }
  const double p = 1.0 / 16;
  EXPECT_NEAR(agree, pairs * p, 5 * std::sqrt(pairs * p * (1 - p)));
}

// 20000 draws at steps 0..19999: each token's count within 5 sigma of the reference distribution,
// no dropped token ever drawn; every draw's logprob = log q(token) and raw_logprob =
// log_softmax(logits).
class SamplerDistribution : public ::testing::TestWithParam<SamplingParams> {};

TEST_P(SamplerDistribution, MatchesTheFilteredDistribution) {
  const SamplingParams sp = GetParam();
  ASSERT_TRUE(sp.validate().ok()) << sp.validate().message();
  const std::vector<double> q = reference_distribution(kLogits, sp);
  const std::vector<double> raw = log_softmax_double(kLogits, 1.0);
  std::vector<float> raw_kernel(kLogits.size());
  kernels::log_softmax_row(kLogits.data(), static_cast<int64_t>(kLogits.size()), raw_kernel.data());
  const int n = 20000;
  std::vector<int> counts(kLogits.size(), 0);
  for (int step = 0; step < n; ++step) {
    const SampleResult r = sample_token(kLogits, sp, step);
    ASSERT_GE(r.token, 0);
    ASSERT_LT(r.token, static_cast<int32_t>(kLogits.size()));
    ASSERT_GT(q[r.token], 0.0) << "dropped token " << r.token << " drawn at step " << step;
    ++counts[r.token];
    ASSERT_NEAR(r.logprob, std::log(q[r.token]), 1e-5) << "token " << r.token;
    ASSERT_NEAR(r.raw_logprob, raw[r.token], 1e-5);
    ASSERT_EQ(r.raw_logprob, raw_kernel[r.token]);
  }
  for (size_t id = 0; id < q.size(); ++id) {
    const double expected = n * q[id];
    const double sigma = std::sqrt(n * q[id] * (1 - q[id]));
    EXPECT_NEAR(counts[id], expected, 5 * sigma + 1) << "token " << id << " q " << q[id];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SamplerDistribution,
    ::testing::Values(params(1.0f, 0, 1.0f, 0.0f),   // plain softmax
                      params(0.7f, 0, 1.0f, 0.0f),   // temperature
                      params(1.0f, 3, 1.0f, 0.0f),   // top-k (the tie 1/3 inside)
                      params(1.0f, 2, 1.0f, 0.0f),   // top-k cutting nothing of the tie
                      params(1.0f, 0, 0.9f, 0.0f),   // top-p
                      params(1.0f, 0, 1.0f, 0.05f),  // min-p
                      params(0.7f, 3, 0.9f, 0.05f),  // all four of the brief's settings
                      params(0.7f, 0, 0.9f, 0.05f),  //
                      // top-p on the top-k-renormalised mass keeps 3 (unrenormalised would keep 4)
                      params(1.0f, 4, 0.85f, 0.0f),
                      // each filter cuts: top-k 9 -> 6, top-p 6 -> 4, min-p 4 -> 3
                      params(1.3f, 6, 0.8f, 0.4f),
                      params(2.0f, 0, 1.0f, 0.2f)));  // min-p after a hot temperature

TEST(Sampler, TopKBreaksTiesByLowerId) {
  const std::vector<float> logits = {2.0f, 1.0f, 1.0f, 1.0f, 0.0f};
  for (int step = 0; step < 2000; ++step) {
    const SampleResult r = sample_token(logits, params(1, 2, 1, 0), step);
    ASSERT_TRUE(r.token == 0 || r.token == 1) << r.token;
  }
}

TEST(Sampler, TopPKeepsAtLeastOneToken) {
  for (int step = 0; step < 100; ++step) {
    const SampleResult r = sample_token(kLogits, params(1, 0, 1e-6f, 0), step);
    EXPECT_EQ(r.token, 1);
    EXPECT_NEAR(r.logprob, 0.0f, 1e-6);
  }
}

TEST(Sampler, UnfilteredLogprobIsTheTemperedLogSoftmax) {
  std::vector<float> logp(kLogits.size());
  kernels::log_softmax_row(kLogits.data(), static_cast<int64_t>(kLogits.size()), logp.data());
  for (int step = 0; step < 50; ++step) {
    const SampleResult r = sample_token(kLogits, params(1, 0, 1, 0), step);
    EXPECT_EQ(r.logprob, r.raw_logprob);  // temperature 1: the same bits
    EXPECT_EQ(r.logprob, logp[r.token]);
  }
}

TEST(Sampler, LargeVocabularyWithTopK) {
  std::vector<float> logits(50000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i) * 4;
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const std::set<int> top(order.begin(), order.begin() + 20);
  for (int step = 0; step < 200; ++step) {
    const SampleResult r = sample_token(logits, params(0.9f, 20, 0.95f, 0.0f), step);
    ASSERT_TRUE(top.count(r.token)) << r.token;
  }
}

TEST(SamplingParams, InvalidValuesNameTheField) {
  EXPECT_TRUE(SamplingParams{}.validate().ok());
  const auto expect_bad = [](SamplingParams sp, const std::string& field) {
    const Status s = sp.validate();
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_NE(s.message().find("SamplingParams." + field), std::string::npos) << s.message();
  };
  expect_bad(params(-1, 0, 1, 0), "temperature");
  expect_bad(params(NAN, 0, 1, 0), "temperature");
  expect_bad(params(INFINITY, 0, 1, 0), "temperature");
  expect_bad(params(1, 0, 0, 0), "top_p");
  expect_bad(params(1, 0, 1.5f, 0), "top_p");
  expect_bad(params(1, 0, NAN, 0), "top_p");
  expect_bad(params(1, -1, 1, 0), "top_k");
  expect_bad(params(1, 0, 1, -0.1f), "min_p");
  expect_bad(params(1, 0, 1, 1.0f), "min_p");
  expect_bad(params(1, 0, 1, NAN), "min_p");
  EXPECT_TRUE(params(0, 0, 1, 0).validate().ok());  // greedy
}

TEST(SamplerDeathTest, NanLogitsAbort) {
  const std::vector<float> bad = {0.0f, NAN, 1.0f};
  EXPECT_DEATH((void)sample_token(bad, SamplingParams{}, 0), "NaN");
  const std::vector<float> masked = {-INFINITY, -INFINITY};
  EXPECT_DEATH((void)sample_token(masked, SamplingParams{}, 0), "-inf");
}

}  // namespace
}  // namespace miles
