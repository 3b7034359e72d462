// Softmax, log-softmax and log-sum-exp of one row: max first, then Σ exp(x - max) by the chunked
// rule; the exp terms are computed 8 at a time (exp_f32, the same bits as one at a time).
#include <algorithm>
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

#ifdef MILES_EXP_SIMD_AVX
// r[l][k] <-> r[k][l]: an 8 × 8 block transposed in registers.
inline void transpose8x8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif

// exp_sum's value without writing the terms: eight chunks at a time, lane l of one accumulator
// being chunk c + l's chain (its terms added in ascending i, as chunked_sum's lanes do); an 8 × 8
// block of exp terms (eight chunks' next eight terms) is transposed so that each add gives every
// chunk its next term. The rest of the chunks one at a time; the halving tree over all partials.
float exp_sum_only(const float* x, float m, int64_t n) {
  constexpr int64_t kChunk = kGemmChunk;
  const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk), full = n / kChunk;
  constexpr int64_t kMaxChunks = 2048;  // rows of up to 256K values (vocabularies)
  if (chunks > kMaxChunks) return exp_sum(x, m, n, detail::exp_scratch(n));
  float parts[kMaxChunks];
  int64_t c = 0;
#ifdef MILES_EXP_SIMD_AVX
  static_assert(kChunk % 8 == 0);
  const __m256 ms = _mm256_set1_ps(m);
  // With AVX-512 the eight chunks' terms are computed first, 16 lanes at a time (exp_avx512.h: the
  // same bits), into an L1 block, and the sums read them back.
  const bool wide = detail::exp_avx512();
  alignas(64) float terms[8 * kChunk];
  for (; c + 8 <= full; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    const float* base = x + c * kChunk;
    if (wide) detail::exp_shifted_avx512(base, m, 8 * kChunk, terms);
    for (int64_t i = 0; i < kChunk; i += 8) {
      __m256 r[8];
      for (int l = 0; l < 8; ++l)
        r[l] = wide ? _mm256_load_ps(terms + l * kChunk + i)
                    : detail::exp_f32x8(_mm256_sub_ps(_mm256_loadu_ps(base + l * kChunk + i), ms));
      transpose8x8(r);  // r[k] lane l: term i + k of chunk c + l
      for (int k = 0; k < 8; ++k) acc = _mm256_add_ps(acc, r[k]);
    }
    _mm256_storeu_ps(parts + c, acc);
  }
#endif
  for (; c < chunks; ++c) {
    float acc = 0.0f;
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) acc = acc + detail::exp_f32(x[i] - m);
    parts[c] = acc;
  }
  return detail::tree_combine(parts, 0, chunks);
}
}  // namespace

float logsumexp_row(const float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  if (std::isinf(m)) return m;
  return m + std::log(exp_sum_only(x, m, n));
}

LogSoftmaxStats log_softmax_stats(const float* x, int64_t n) {
  const float m = detail::max_of(x, n);
  return {m, std::log(exp_sum_only(x, m, n))};
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
