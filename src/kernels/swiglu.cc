// SwiGLU: silu(gate) * up, silu(g) = g / (1 + exp(-g)) as torch's CPU kernel computes it.
#include <cmath>

#include "miles/kernels.h"

namespace miles::kernels {

void swiglu(const float* gate, const float* up, int64_t m, int64_t f, int64_t ld_in, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    float* o = out + r * f;
    for (int64_t i = 0; i < f; ++i) o[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
  }
}

}  // namespace miles::kernels
