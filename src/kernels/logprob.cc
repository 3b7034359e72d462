// Token log-probabilities, entropies and their gradient with respect to the logits (logprob.h).
#include "miles/logprob.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "miles/comm.h"
#include "miles/kernels.h"

namespace miles {

namespace {
// -Σ exp(logp) · logp by the chunked rule (the exp terms computed first, 8 at a time).
float entropy_of(const float* logp, int64_t n) {
  float* p = kernels::detail::exp_scratch(n);
  kernels::detail::exp_shifted(logp, 0.0f, n, p);  // exp(logp - 0) = exp(logp)
  const float s = kernels::detail::chunked_sum(
      n, [&](int64_t i, float acc) { return std::fma(p[i], logp[i], acc); });
  return -s;
}
}  // namespace

void token_logprobs(const float* logits, int64_t rows, int64_t vocab, const int32_t* targets,
                    float* logp, float* entropy, kernels::LogSoftmaxStats* stats) {
  std::vector<float> lp(static_cast<size_t>(entropy ? vocab : 0));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    const kernels::LogSoftmaxStats st = kernels::log_softmax_stats(x, vocab);
    if (stats) stats[r] = st;
    if (!entropy) {  // the target's value alone: log_softmax_row's bits without the row
      logp[r] = (x[targets[r]] - st.max) - st.log_sum;
      continue;
    }
    kernels::log_softmax_row(x, vocab, st, lp.data());
    logp[r] = lp[targets[r]];
    if (entropy) entropy[r] = entropy_of(lp.data(), vocab);
  }
}

namespace {
// out[v] = -gl · p_v − ge · p_v · (lp_v + h) with lp_v = (x_v − max) − log_sum and p_v = exp(lp_v),
// in one pass over the row (in place allowed: each block of x is read before its out is written).
// The same operations lane by lane as the three-pass form (log_softmax_row, exp_shifted by 0,
// then the gradient): the same bits.
void row_gradient(const float* x, int64_t vocab, kernels::LogSoftmaxStats st, float gl, float ge,
                  float h, float* out) {
  int64_t v = kernels::detail::exp_avx512() ? kernels::detail::logprob_gradient_avx512(
                                                  x, vocab, st.max, st.log_sum, gl, ge, h, out)
                                            : 0;
#ifdef MILES_EXP_SIMD_AVX
  const __m256 mx = _mm256_set1_ps(st.max), ls = _mm256_set1_ps(st.log_sum);
  const __m256 ngl = _mm256_set1_ps(-gl), vge = _mm256_set1_ps(ge), vh = _mm256_set1_ps(h);
  for (; v + 8 <= vocab; v += 8) {
    const __m256 lp = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + v), mx), ls);
    const __m256 p = kernels::detail::exp_f32x8(lp);  // exp_shifted(lp, 0): lp − 0 is lp
    _mm256_storeu_ps(out + v,
                     _mm256_sub_ps(_mm256_mul_ps(ngl, p),
                                   _mm256_mul_ps(_mm256_mul_ps(vge, p), _mm256_add_ps(lp, vh))));
  }
#endif
  for (; v < vocab; ++v) {
    const float lp = (x[v] - st.max) - st.log_sum;
    const float p = kernels::detail::exp_f32(lp);
    out[v] = -gl * p - ge * p * (lp + h);
  }
}
}  // namespace

void token_logprobs_backward(const float* logits, int64_t rows, int64_t vocab,
                             const int32_t* targets, const float* dlogp, const float* dentropy,
                             float* dlogits, const kernels::LogSoftmaxStats* stats) {
  std::vector<float> lp;  // the row's log-softmax, for the entropy's gradient only
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dlogits + r * vocab;
    const float gl = dlogp ? dlogp[r] : 0.0f, ge = dentropy ? dentropy[r] : 0.0f;
    if (gl == 0.0f && ge == 0.0f) {
      std::fill(out, out + vocab, 0.0f);
      continue;
    }
    const float* x = logits + r * vocab;
    const kernels::LogSoftmaxStats st = stats ? stats[r] : kernels::log_softmax_stats(x, vocab);
    float h = 0.0f;
    if (ge != 0.0f) {  // the entropy of the whole row first
      lp.resize(static_cast<size_t>(vocab));
      kernels::log_softmax_row(x, vocab, st, lp.data());
      h = entropy_of(lp.data(), vocab);
    }
    row_gradient(x, vocab, st, gl, ge, h, out);
    out[targets[r]] = out[targets[r]] + gl;
  }
}

namespace {

// Per row: the global max m and log Σ exp(x − m) over the whole vocabulary.
Status global_lse(const float* logits, int64_t rows, int64_t vl, Communicator& comm,
                  std::vector<float>& m, std::vector<float>& log_s) {
  m.resize(rows);
  for (int64_t r = 0; r < rows; ++r) m[r] = kernels::detail::max_of(logits + r * vl, vl);
  MILES_RETURN_IF_ERROR(comm.all_reduce_max(std::span<float>(m)));
  std::vector<float> s(rows);
  float* e = kernels::detail::exp_scratch(vl);
  for (int64_t r = 0; r < rows; ++r) {
    kernels::detail::exp_shifted(logits + r * vl, m[r], vl, e);
    s[r] = kernels::detail::chunked_sum(vl, [&](int64_t i, float acc) { return acc + e[i]; });
  }
  MILES_RETURN_IF_ERROR(comm.all_reduce_sum_deterministic(std::span<float>(s)));
  log_s.resize(rows);
  for (int64_t r = 0; r < rows; ++r) log_s[r] = std::log(s[r]);
  return Status::Ok();
}

// Global entropy per row from the local log-probabilities (tree-ordered over ranks).
Status global_entropy(const float* logits, int64_t rows, int64_t vl, const std::vector<float>& m,
                      const std::vector<float>& log_s, Communicator& comm, float* entropy) {
  std::vector<float> part(rows), lp(static_cast<size_t>(vl));
  float* p = kernels::detail::exp_scratch(vl);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vl;
    for (int64_t i = 0; i < vl; ++i) lp[i] = (x[i] - m[r]) - log_s[r];
    kernels::detail::exp_shifted(lp.data(), 0.0f, vl, p);
    part[r] = kernels::detail::chunked_sum(
        vl, [&](int64_t i, float acc) { return std::fma(p[i], lp[i], acc); });
  }
  MILES_RETURN_IF_ERROR(comm.all_reduce_sum_deterministic(std::span<float>(part)));
  for (int64_t r = 0; r < rows; ++r) entropy[r] = -part[r];
  return Status::Ok();
}

}  // namespace

Status token_logprobs_vocab_parallel(const float* logits, int64_t rows, int64_t vl, int64_t vb,
                                     const int32_t* targets, Communicator& comm, float* logp,
                                     float* entropy) {
  std::vector<float> m, log_s;
  MILES_RETURN_IF_ERROR(global_lse(logits, rows, vl, comm, m, log_s));
  // The target's log-probability from the rank that holds it (zeros elsewhere: an exact sum).
  std::vector<float> lp(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = targets[r] - vb;
    if (j >= 0 && j < vl) lp[r] = (logits[r * vl + j] - m[r]) - log_s[r];
  }
  MILES_RETURN_IF_ERROR(comm.all_reduce_sum_deterministic(std::span<float>(lp)));
  std::copy(lp.begin(), lp.end(), logp);
  if (entropy) MILES_RETURN_IF_ERROR(global_entropy(logits, rows, vl, m, log_s, comm, entropy));
  return Status::Ok();
}

Status token_logprobs_backward_vocab_parallel(const float* logits, int64_t rows, int64_t vl,
                                              int64_t vb, const int32_t* targets,
                                              Communicator& comm, const float* dlogp,
                                              const float* dentropy, float* dlogits) {
  std::vector<float> m, log_s, h(rows, 0.0f), lp(static_cast<size_t>(vl));
  MILES_RETURN_IF_ERROR(global_lse(logits, rows, vl, comm, m, log_s));
  if (dentropy) MILES_RETURN_IF_ERROR(global_entropy(logits, rows, vl, m, log_s, comm, h.data()));
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dlogits + r * vl;
    const float gl = dlogp ? dlogp[r] : 0.0f, ge = dentropy ? dentropy[r] : 0.0f;
    for (int64_t v = 0; v < vl; ++v) lp[v] = (logits[r * vl + v] - m[r]) - log_s[r];
    kernels::detail::exp_shifted(lp.data(), 0.0f, vl, out);  // p = exp(lp), then the gradient
    for (int64_t v = 0; v < vl; ++v) {
      const float p = out[v];
      out[v] = -gl * p - ge * p * (lp[v] + h[r]);
    }
    const int64_t j = targets[r] - vb;
    if (j >= 0 && j < vl) out[j] = out[j] + gl;
  }
  return Status::Ok();
}

}  // namespace miles
