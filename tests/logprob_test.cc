// The loss head's kernels (logprob.h): the backward given the forward's row normalisers gives the
// bits of the backward that recomputes them, and both match the analytic gradient.
#include "miles/logprob.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "random_vec.h"

namespace miles {
namespace {

using test::random_vec;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TokenLogprobs, BackwardWithTheForwardsStatsGivesTheSameBits) {
  const int64_t rows = 5, vocab = 1000;
  std::vector<float> logits = random_vec(rows * vocab, 7);
  for (float& x : logits) x *= 8.0f;  // a spread of logits, so that the max matters
  const std::vector<int32_t> targets = {0, 999, 17, 500, 17};
  const std::vector<float> dlogp = {1.0f, -0.5f, 0.25f, 0.0f, 2.0f};
  const std::vector<float> dent = {0.1f, 0.0f, -0.3f, 0.2f, 0.0f};
  for (const bool with_entropy : {false, true}) {
    std::vector<float> logp(rows), logp2(rows), ent(rows), ent2(rows);
    std::vector<kernels::LogSoftmaxStats> stats(rows);
    token_logprobs(logits.data(), rows, vocab, targets.data(), logp.data(),
                   with_entropy ? ent.data() : nullptr);
    token_logprobs(logits.data(), rows, vocab, targets.data(), logp2.data(),
                   with_entropy ? ent2.data() : nullptr, stats.data());
    EXPECT_TRUE(same_bits(logp, logp2));
    EXPECT_TRUE(same_bits(ent, ent2));
    const float* de = with_entropy ? dent.data() : nullptr;
    std::vector<float> recomputed(rows * vocab), reused(rows * vocab), in_place = logits;
    token_logprobs_backward(logits.data(), rows, vocab, targets.data(), dlogp.data(), de,
                            recomputed.data());
    token_logprobs_backward(logits.data(), rows, vocab, targets.data(), dlogp.data(), de,
                            reused.data(), stats.data());
    token_logprobs_backward(in_place.data(), rows, vocab, targets.data(), dlogp.data(), de,
                            in_place.data(), stats.data());
    EXPECT_TRUE(same_bits(recomputed, reused)) << "entropy " << with_entropy;
    EXPECT_TRUE(same_bits(recomputed, in_place)) << "entropy " << with_entropy;
    // d logits = dlogp (onehot − p) + dent (−p (log p + H)), in double precision.
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits.data() + r * vocab;
      double m = x[0], s = 0.0, h = 0.0;
      for (int64_t v = 0; v < vocab; ++v) m = std::max(m, double(x[v]));
      for (int64_t v = 0; v < vocab; ++v) s += std::exp(x[v] - m);
      for (int64_t v = 0; v < vocab; ++v) {
        const double lp = x[v] - m - std::log(s);
        h -= std::exp(lp) * lp;
      }
      EXPECT_NEAR(logp[r], x[targets[r]] - m - std::log(s), 1e-4);
      for (int64_t v = 0; v < vocab; ++v) {
        const double lp = x[v] - m - std::log(s), p = std::exp(lp);
        const double want =
            dlogp[r] * ((v == targets[r]) - p) + (with_entropy ? dent[r] * (-p * (lp + h)) : 0.0);
        ASSERT_NEAR(reused[r * vocab + v], want, 1e-6) << "row " << r << " id " << v;
      }
    }
  }
}

}  // namespace
}  // namespace miles
