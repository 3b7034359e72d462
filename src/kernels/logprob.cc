// Token log-probabilities, entropies and their gradient with respect to the logits (logprob.h).
#include "miles/logprob.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles {

namespace {
float entropy_of(const float* logp, int64_t n) {
  const float s = kernels::detail::chunked_sum(
      n, [&](int64_t i, float acc) { return std::fma(std::exp(logp[i]), logp[i], acc); });
  return -s;
}
}  // namespace

void token_logprobs(const float* logits, int64_t rows, int64_t vocab, const int32_t* targets,
                    float* logp, float* entropy) {
  std::vector<float> lp(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    kernels::log_softmax_row(logits + r * vocab, vocab, lp.data());
    logp[r] = lp[targets[r]];
    if (entropy) entropy[r] = entropy_of(lp.data(), vocab);
  }
}

void token_logprobs_backward(const float* logits, int64_t rows, int64_t vocab,
                             const int32_t* targets, const float* dlogp, const float* dentropy,
                             float* dlogits) {
  std::vector<float> lp(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dlogits + r * vocab;
    const float gl = dlogp ? dlogp[r] : 0.0f, ge = dentropy ? dentropy[r] : 0.0f;
    if (gl == 0.0f && ge == 0.0f) {
      std::fill(out, out + vocab, 0.0f);
      continue;
    }
    kernels::log_softmax_row(logits + r * vocab, vocab, lp.data());
    const float h = ge != 0.0f ? entropy_of(lp.data(), vocab) : 0.0f;
    for (int64_t v = 0; v < vocab; ++v) {
      const float p = std::exp(lp[v]);
      out[v] = -gl * p - ge * p * (lp[v] + h);
    }
    out[targets[r]] = out[targets[r]] + gl;
  }
}

}  // namespace miles
