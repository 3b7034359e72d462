// Fixed-order row reductions shared by the kernels: the chunked rule of kernels.h applied to sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "miles/kernels.h"

namespace miles::kernels::detail {

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
  // Halving tree, iteratively: same shape as gemm.cc's tree_combine.
  struct Rec {
    static float combine(const float* p, int64_t lo, int64_t hi) {
      if (hi - lo == 1) return p[lo];
      const int64_t mid = lo + (hi - lo + 1) / 2;
      const float a = combine(p, lo, mid);
      const float b = combine(p, mid, hi);
      return a + b;
    }
  };
  return Rec::combine(parts, 0, chunks);
}

// The row-reduction rule: chunks of kGemmChunk.
template <typename Step>
float chunked_sum(int64_t n, Step step) {
  return chunked_sum_by(n, kGemmChunk, step);
}

inline float dot(const float* a, const float* b, int64_t n) {
  return chunked_sum(n, [&](int64_t i, float acc) { return std::fma(a[i], b[i], acc); });
}

// The first of the largest values (std::max from -inf in ascending i; NaN never wins). Lanes find
// the value; a maximum of ±0 (the only equal values with different bits) is settled by the scan.
inline float max_of(const float* x, int64_t n) {
  float m = -INFINITY;
  int64_t i = 0;
#if defined(__AVX__)
  if (n >= 64) {
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
