// AVX-512 GEMM micro-kernel: up to 12 rows × 32 columns (2 zmm per row), 24 accumulators in registers.
// fma chain in ascending k per element, as gemm_tile.h defines; compiled with -mavx512f.
#include <immintrin.h>

#include "kernels/gemm_tile.h"
#include "miles/kernels.h"

namespace miles::kernels::detail {
namespace {

template <int R, bool kAhead>
void tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* left, float* part,
          const NextPanel& np) {
  static_assert(kPanel == 32);
  __m512 acc0[R], acc1[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    if constexpr (kAhead) prefetch_panel_row(b + (k + kPrefetchAhead) * 32);
    prefetch_next_panel(np, k);
    const __m512 b0 = _mm512_loadu_ps(b + k * 32);
    const __m512 b1 = _mm512_loadu_ps(b + k * 32 + 16);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[k * lda + r]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  if (left) {
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm512_add_ps(_mm512_loadu_ps(left + r * 32), acc0[r]);
      acc1[r] = _mm512_add_ps(_mm512_loadu_ps(left + r * 32 + 16), acc1[r]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(part + r * 32, acc0[r]);
    _mm512_storeu_ps(part + r * 32 + 16, acc1[r]);
  }
}

}  // namespace

void chunk_tile_avx512(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                       const float* left, float* part, const NextPanel& np) {
  with_tile_rows<kTileRowsAvx512>(rows, [&](auto r) {
    with_ahead(np.ahead,
               [&](auto ahead) { tile<r.value, ahead.value>(a, lda, b, kc, left, part, np); });
  });
}

}  // namespace miles::kernels::detail
