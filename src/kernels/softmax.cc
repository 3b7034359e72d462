// Softmax, log-softmax and log-sum-exp of one row: max first, then Σ exp(x - max) by the chunked rule.
#include <cmath>

#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles::kernels {

float logsumexp_row(const float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  if (std::isinf(m)) return m;
  const float s = detail::chunked_sum(n, [&](int64_t i, float acc) { return acc + std::exp(x[i] - m); });
  return m + std::log(s);
}

void log_softmax_row(const float* x, int64_t n, float* out) {
  const float m = detail::max_of(x, n);
  const float s = detail::chunked_sum(n, [&](int64_t i, float acc) { return acc + std::exp(x[i] - m); });
  const float log_s = std::log(s);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - m) - log_s;
}

float log_softmax_at(const float* x, int64_t n, int64_t i) {
  const float m = detail::max_of(x, n);
  const float s = detail::chunked_sum(n, [&](int64_t j, float acc) { return acc + std::exp(x[j] - m); });
  return (x[i] - m) - std::log(s);
}

void softmax_log_softmax_row(const float* x, int64_t n, float* probs, float* logp) {
  const float m = detail::max_of(x, n);
  for (int64_t i = 0; i < n; ++i) probs[i] = std::exp(x[i] - m);
  const float s = detail::chunked_sum(n, [&](int64_t i, float acc) { return acc + probs[i]; });
  const float log_s = std::log(s);
  for (int64_t i = 0; i < n; ++i) {
    logp[i] = (x[i] - m) - log_s;
    probs[i] = probs[i] / s;
  }
}

void softmax_row(float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m);
  const float s = detail::chunked_sum(n, [&](int64_t i, float acc) { return acc + x[i]; });
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / s;
}

}  // namespace miles::kernels
