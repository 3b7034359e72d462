// The machine's FMA peak as a benchmark measures it: independent AVX-512 fma chains, no memory traffic.
#include <immintrin.h>

#include <cstdint>

namespace miles::kernels::detail {

// Runs `iters` rounds of 16 independent zmm fma chains; returns a value so the work is not elided.
float fma_loop_avx512(int64_t iters) {
  __m512 acc[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    #pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  #pragma GCC unroll 16
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace miles::kernels::detail
