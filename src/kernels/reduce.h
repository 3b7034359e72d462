// Fixed-order row reductions shared by the kernels: the chunked rule of kernels.h applied to sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

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
  for (int64_t c = 0; c < chunks; ++c) {
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

inline float max_of(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

}  // namespace miles::kernels::detail
