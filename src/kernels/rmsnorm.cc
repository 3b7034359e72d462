// RMSNorm: out = (x * rsqrt(mean(x²) + eps)) * weight, as HF's LlamaRMSNorm (fp32 compute).
#include <algorithm>
#include <cmath>

#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles::kernels {

void rmsnorm(const float* x, int64_t m, int64_t d, const float* weight, float eps, float* out) {
  constexpr int64_t kBlock = 16;  // rows whose sums of squares are taken together
  float sum_sq[kBlock];
  for (int64_t r0 = 0; r0 < m; r0 += kBlock) {
    const int64_t rows = std::min(kBlock, m - r0);
    detail::dot_rows(x + r0 * d, d, x + r0 * d, d, rows, d, sum_sq);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + (r0 + r) * d;
      float* yr = out + (r0 + r) * d;
      const float inv = 1.0f / std::sqrt(sum_sq[r] / static_cast<float>(d) + eps);
      for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * inv) * weight[i];
    }
  }
}

}  // namespace miles::kernels
