// SwiGLU: silu(gate) * up, silu(g) = g / (1 + exp(-g)) as torch's CPU kernel writes it, with
// miles' exp (exp.h); 8 lanes at a time, the same operations as the scalar tail.
#include <cmath>

#include "kernels/exp.h"
#include "miles/kernels.h"

namespace miles::kernels {

void swiglu(const float* gate, const float* up, int64_t m, int64_t f, int64_t ld_in, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    float* o = out + r * f;
    int64_t i = detail::exp_avx512() ? detail::swiglu_avx512(g, u, f, o) : 0;
#ifdef MILES_EXP_SIMD_AVX
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= f; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 e = detail::exp_f32x8(_mm256_xor_ps(gv, sign));
      const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < f; ++i) o[i] = (g[i] / (1.0f + detail::exp_f32(-g[i]))) * u[i];
  }
}

}  // namespace miles::kernels
