// Embedding lookup and top-k selection: pure data movement and comparisons, exact by nature.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "miles/kernels.h"

namespace miles::kernels {

void embedding(const float* table, int64_t d, const int32_t* ids, int64_t t, float* out) {
  for (int64_t i = 0; i < t; ++i)
    std::memcpy(out + i * d, table + static_cast<int64_t>(ids[i]) * d, sizeof(float) * d);
}

void topk(const float* x, int64_t n, int64_t k, int32_t* idx_out, float* val_out) {
  MILES_CHECK(k >= 0 && k <= n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // Larger first; NaN never wins; equal values: lower index first.
  auto before = [&](int32_t a, int32_t b) {
    const float va = x[a], vb = x[b];
    if (va > vb) return true;
    if (va < vb) return false;
    if (std::isnan(va) != std::isnan(vb)) return std::isnan(vb);
    return a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
  for (int64_t i = 0; i < k; ++i) {
    idx_out[i] = idx[i];
    if (val_out) val_out[i] = x[idx[i]];
  }
}

}  // namespace miles::kernels
