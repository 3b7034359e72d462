// Fixed-order row reductions shared by the kernels: the chunked rule of kernels.h applied to sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/unroll.h"
#include "miles/kernels.h"

namespace miles::kernels::detail {

// The halving tree over chunk partials p[lo, hi): split at lo + ceil((hi - lo) / 2), left + right
// (the shape of gemm.cc's schedule).
inline float tree_combine(const float* p, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return p[lo];
  const int64_t mid = lo + (hi - lo + 1) / 2;
  const float a = tree_combine(p, lo, mid);
  const float b = tree_combine(p, mid, hi);
  return a + b;
}

// Σ f(i) for i in [0, n): chunks of `chunk` summed in ascending i, partials combined by the halving
// tree. `step(i, acc)` returns the accumulator after adding term i (so callers choose fma or add).
template <typename Step>
float chunked_sum_by(int64_t n, int64_t chunk, Step step) {
  const int64_t chunks = std::max<int64_t>(1, (n + chunk - 1) / chunk);
  constexpr int64_t kMaxStack = 256;
  float stack_parts[kMaxStack];
  float* parts = stack_parts;
  std::unique_ptr<float[]> heap;
  if (chunks > kMaxStack) {
    heap.reset(new float[chunks]);
    parts = heap.get();
  }
  // Full chunks kLanes at a time: one accumulator per chunk, each still adding its own terms in
  // ascending i, so the partials are those of one chunk after another; the interleaving only lets
  // the CPU overlap kLanes dependency chains (a lone chain waits an add's latency per term).
  constexpr int64_t kLanes = 8;
  const int64_t full = n / chunk;
  int64_t c = 0;
  for (; c + kLanes <= full; c += kLanes) {
    float acc[kLanes] = {};
    for (int64_t i = 0; i < chunk; ++i)
      for (int64_t l = 0; l < kLanes; ++l) acc[l] = step((c + l) * chunk + i, acc[l]);
    std::copy_n(acc, kLanes, parts + c);
  }
  for (; c < chunks; ++c) {
    float acc = 0.0f;
    const int64_t end = std::min(n, (c + 1) * chunk);
    for (int64_t i = c * chunk; i < end; ++i) acc = step(i, acc);
    parts[c] = acc;
  }
  return tree_combine(parts, 0, chunks);
}

// The row-reduction rule: chunks of kGemmChunk.
template <typename Step>
float chunked_sum(int64_t n, Step step) {
  return chunked_sum_by(n, kGemmChunk, step);
}

inline float dot(const float* a, const float* b, int64_t n) {
  return chunked_sum(n, [&](int64_t i, float acc) { return std::fma(a[i], b[i], acc); });
}

// out[r] = dot(a + r * lda, b + r * ldb, n) for r < rows, bit for bit: eight rows' chunk chains
// side by side (one row's few chunks leave a lone fma chain waiting an fma's latency per term).
inline void dot_rows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows,
                     int64_t n, float* out) {
  constexpr int kRows = 8;
  constexpr int64_t kMaxChunks = 64;
  const int64_t chunks = std::max<int64_t>(1, (n + kGemmChunk - 1) / kGemmChunk);
  int64_t r0 = 0;
  if (chunks <= kMaxChunks) {
    for (; r0 + kRows <= rows; r0 += kRows) {
      float parts[kRows][kMaxChunks];
      for (int64_t c = 0; c < chunks; ++c) {
        float acc[kRows] = {};
        const int64_t end = std::min(n, (c + 1) * kGemmChunk);
        for (int64_t i = c * kGemmChunk; i < end; ++i) {
          MILES_UNROLL  // the chains in registers
              for (int l = 0; l < kRows; ++l) acc[l] =
                  std::fma(a[(r0 + l) * lda + i], b[(r0 + l) * ldb + i], acc[l]);
        }
        for (int l = 0; l < kRows; ++l) parts[l][c] = acc[l];
      }
      for (int l = 0; l < kRows; ++l) out[r0 + l] = tree_combine(parts[l], 0, chunks);
    }
  }
  for (; r0 < rows; ++r0) out[r0] = dot(a + r0 * lda, b + r0 * ldb, n);
}

// The first of the largest values (std::max from -inf in ascending i; NaN never wins). Lanes find
// the value; a maximum of ±0 (the only equal values with different bits) is settled by the scan.
inline float max_of(const float* x, int64_t n) {
  float m = -INFINITY;
  int64_t i = 0;
#if defined(__AVX__)
  if (n >= 16) {
    __m256 a = _mm256_set1_ps(-INFINITY), b = a;
    for (; i + 16 <= n; i += 16) {  // max_ps(x, m) returns m when x is NaN
      a = _mm256_max_ps(_mm256_loadu_ps(x + i), a);
      b = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), b);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(a, b));
    for (const float v : lanes) m = std::max(m, v);
    for (; i < n; ++i) m = std::max(m, x[i]);
    if (m != 0.0f) return m;
    m = -INFINITY;
    i = 0;
  }
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

}  // namespace miles::kernels::detail
