// The machine's FMA peak on AVX2: independent ymm fma chains, no memory traffic.
#include <immintrin.h>

#include <cstdint>

namespace miles::kernels::detail {

float fma_loop_avx2(int64_t iters) {
  __m256 acc[12];
  #pragma GCC unroll 16
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    #pragma GCC unroll 16
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  #pragma GCC unroll 16
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

}  // namespace miles::kernels::detail
