// RMSNorm: out = (x * rsqrt(mean(x²) + eps)) * weight, as HF's LlamaRMSNorm (fp32 compute).
#include <cmath>

#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles::kernels {

void rmsnorm(const float* x, int64_t m, int64_t d, const float* weight, float eps, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * d;
    float* yr = out + r * d;
    const float sum_sq = detail::dot(xr, xr, d);
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * inv) * weight[i];
  }
}

}  // namespace miles::kernels
