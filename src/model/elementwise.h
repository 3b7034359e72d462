// Element-wise helpers shared by the model's forward, backward and gradient sink.
#pragma once

#include <cstdint>
#include <vector>

#include "miles/thread_pool.h"

namespace miles {

// dst[i] = dst[i] + src[i] for i < n.
inline void add_into(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] + src[i];
}

// add_into over the pool (element-wise: any split gives the same bits).
inline void add_into(float* dst, const float* src, int64_t n, ThreadPool* pool) {
  parallel_ranges(pool, n, 1,
                  [&](int64_t i0, int64_t i1) { add_into(dst + i0, src + i0, i1 - i0); });
}

// x resized to n values without touching those it has (the caller overwrites them all; a reused
// buffer keeps its capacity and pages).
inline std::vector<float>& sized(std::vector<float>& x, int64_t n) {
  x.resize(static_cast<size_t>(n));
  return x;
}

}  // namespace miles
