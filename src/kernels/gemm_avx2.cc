// AVX2 GEMM micro-kernel: up to 6 rows × 32 columns, done as two 16-column halves (12 accumulators
// each); one or two rows (a decode step's GEMV, a short verify chunk) take all 32 columns in one
// pass. Same fma chain per element as gemm_tile.h defines; compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "kernels/gemm_tile.h"
#include "miles/kernels.h"

namespace miles::kernels::detail {
namespace {

template <int R>
void half_tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* left,
               float* part) {
  __m256 acc0[R], acc1[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * 32);
    const __m256 b1 = _mm256_loadu_ps(b + k * 32 + 8);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_set1_ps(a[k * lda + r]);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  if (left) {
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm256_add_ps(_mm256_loadu_ps(left + r * 32), acc0[r]);
      acc1[r] = _mm256_add_ps(_mm256_loadu_ps(left + r * 32 + 8), acc1[r]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(part + r * 32, acc0[r]);
    _mm256_storeu_ps(part + r * 32 + 8, acc1[r]);
  }
}

// All 32 columns at once: 4 × R independent fma chains in flight instead of 2 × R. With one row the
// halves were bound by the fma latency (two chains: 64 bytes of the panel per 5 cycles on Zen 2),
// below the memory's rate for a GEMV that streams the weights; whole rows of the panel also stream
// in order.
template <int R>
void full_tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* left,
               float* part) {
  __m256 acc[R][4];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    __m256 bv[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) bv[j] = _mm256_loadu_ps(b + k * 32 + 8 * j);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_set1_ps(a[k * lda + r]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_fmadd_ps(av, bv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m256 v = acc[r][j];
      if (left) v = _mm256_add_ps(_mm256_loadu_ps(left + r * 32 + 8 * j), v);
      _mm256_storeu_ps(part + r * 32 + 8 * j, v);
    }
}

template <int R>
void tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* left,
          float* part) {
  if constexpr (R <= 2) {
    full_tile<R>(a, lda, b, kc, left, part);
  } else {
    half_tile<R>(a, lda, b, kc, left, part);
    half_tile<R>(a, lda, b + 16, kc, left ? left + 16 : nullptr, part + 16);
  }
}

}  // namespace

void chunk_tile_avx2(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                     const float* left, float* part) {
  switch (rows) {
    case 6: return tile<6>(a, lda, b, kc, left, part);
    case 5: return tile<5>(a, lda, b, kc, left, part);
    case 4: return tile<4>(a, lda, b, kc, left, part);
    case 3: return tile<3>(a, lda, b, kc, left, part);
    case 2: return tile<2>(a, lda, b, kc, left, part);
    case 1: return tile<1>(a, lda, b, kc, left, part);
    default: break;
  }
}

}  // namespace miles::kernels::detail
