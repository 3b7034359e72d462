// Softmax, log-softmax and log-sum-exp of one row: max first, then Σ exp(x - max) by the chunked
// rule; the exp terms are computed 8 at a time (exp_f32, the same bits as one at a time).
#include <cmath>

#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles::kernels {

namespace {
// Σ terms[i] by the chunked rule, after terms[i] = exp(x[i] - m).
float exp_sum(const float* x, float m, int64_t n, float* terms) {
  detail::exp_shifted(x, m, n, terms);
  return detail::chunked_sum(n, [&](int64_t i, float acc) { return acc + terms[i]; });
}
}  // namespace

float logsumexp_row(const float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  if (std::isinf(m)) return m;
  return m + std::log(exp_sum(x, m, n, detail::exp_scratch(n)));
}

LogSoftmaxStats log_softmax_stats(const float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  return {m, std::log(exp_sum(x, m, n, detail::exp_scratch(n)))};
}

void log_softmax_row(const float* x, int64_t n, const LogSoftmaxStats& stats, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - stats.max) - stats.log_sum;
}

void log_softmax_row(const float* x, int64_t n, float* out) {
  log_softmax_row(x, n, log_softmax_stats(x, n), out);
}

float log_softmax_at(const float* x, int64_t n, int64_t i) {
  const LogSoftmaxStats st = log_softmax_stats(x, n);
  return (x[i] - st.max) - st.log_sum;
}

void softmax_log_softmax_row(const float* x, int64_t n, float* probs, float* logp) {
  const float m = detail::max_of(x, n);
  const float s = exp_sum(x, m, n, probs);
  const float log_s = std::log(s);
  for (int64_t i = 0; i < n; ++i) {
    logp[i] = (x[i] - m) - log_s;
    probs[i] = probs[i] / s;
  }
}

void softmax_row(float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  const float s = exp_sum(x, m, n, x);  // in place: each term replaces its input
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / s;
}

}  // namespace miles::kernels
