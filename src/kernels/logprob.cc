// Token log-probabilities, entropies and their gradient with respect to the logits (logprob.h).
#include "miles/logprob.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/reduce.h"
#include "miles/comm.h"
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
  std::vector<float> lp(static_cast<size_t>(entropy ? vocab : 0));
  for (int64_t r = 0; r < rows; ++r) {
    if (!entropy) {  // the target's value alone: log_softmax_row's bits without the row
      logp[r] = kernels::log_softmax_at(logits + r * vocab, vocab, targets[r]);
      continue;
    }
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

namespace {

// Per row: the global max m and log Σ exp(x − m) over the whole vocabulary.
Status global_lse(const float* logits, int64_t rows, int64_t vl, Communicator& comm,
                  std::vector<float>& m, std::vector<float>& log_s) {
  m.resize(rows);
  for (int64_t r = 0; r < rows; ++r) m[r] = kernels::detail::max_of(logits + r * vl, vl);
  MILES_RETURN_IF_ERROR(comm.all_reduce_max(std::span<float>(m)));
  std::vector<float> s(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vl;
    s[r] = kernels::detail::chunked_sum(
        vl, [&](int64_t i, float acc) { return acc + std::exp(x[i] - m[r]); });
  }
  MILES_RETURN_IF_ERROR(comm.all_reduce_sum_deterministic(std::span<float>(s)));
  log_s.resize(rows);
  for (int64_t r = 0; r < rows; ++r) log_s[r] = std::log(s[r]);
  return Status::Ok();
}

// Global entropy per row from the local log-probabilities (tree-ordered over ranks).
Status global_entropy(const float* logits, int64_t rows, int64_t vl, const std::vector<float>& m,
                      const std::vector<float>& log_s, Communicator& comm, float* entropy) {
  std::vector<float> part(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vl;
    part[r] = kernels::detail::chunked_sum(vl, [&](int64_t i, float acc) {
      const float lp = (x[i] - m[r]) - log_s[r];
      return std::fma(std::exp(lp), lp, acc);
    });
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
  std::vector<float> m, log_s, h(rows, 0.0f);
  MILES_RETURN_IF_ERROR(global_lse(logits, rows, vl, comm, m, log_s));
  if (dentropy) MILES_RETURN_IF_ERROR(global_entropy(logits, rows, vl, m, log_s, comm, h.data()));
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dlogits + r * vl;
    const float gl = dlogp ? dlogp[r] : 0.0f, ge = dentropy ? dentropy[r] : 0.0f;
    for (int64_t v = 0; v < vl; ++v) {
      const float lp = (logits[r * vl + v] - m[r]) - log_s[r];
      const float p = std::exp(lp);
      out[v] = -gl * p - ge * p * (lp + h[r]);
    }
    const int64_t j = targets[r] - vb;
    if (j >= 0 && j < vl) out[j] = out[j] + gl;
  }
  return Status::Ok();
}

}  // namespace miles
