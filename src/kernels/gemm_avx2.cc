// AVX2 GEMM micro-kernel: up to 6 rows × 32 columns, in groups of at most 3 rows that each take
// all 32 columns in one pass (4 × 3 = 12 accumulators). Same fma chain per element as gemm_tile.h
// defines; compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "kernels/gemm_tile.h"
#include "miles/kernels.h"

namespace miles::kernels::detail {
namespace {

// All 32 columns of R <= 3 rows at once: 4 × R independent fma chains in flight (with one row, two
// 16-column halves were bound by the fma latency: 64 bytes of the panel per 5 cycles on Zen 2,
// below the memory's rate for a GEMV that streams the weights), and the panel's k rows streamed in
// order.
template <int R, bool kAhead>
void full_tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* left,
               float* part, const NextPanel& np) {
  __m256 acc[R][4];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    if constexpr (kAhead) prefetch_panel_row(b + (k + kPrefetchAhead) * 32);
    prefetch_next_panel(np, k);
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

// Rows in groups of at most 3, each group over the whole panel: a group's pass streams the
// panel's k rows in order (128 bytes each), which the hardware prefetchers follow, where two
// 16-column halves of 6 rows each read every other cache line. With the weights from memory (a
// decode step of a few samples, a verify chunk) the halves made 3-6 rows cost 1.6-1.9x one row,
// the groups 1.1-1.4x; from cache (training, prefill) the two are at par. Each element's chain is
// the same. The tile's prefetches are all in its first group: the second reads the chunk (at most
// 16 KB) from L1, where a prefetch per k step only takes issue slots from the fmas.
template <int R, bool kAhead>
void tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* left, float* part,
          const NextPanel& np) {
  if constexpr (R <= 3) {
    full_tile<R, kAhead>(a, lda, b, kc, left, part, np);
  } else {
    static_assert(R <= 6);
    full_tile<3, kAhead>(a, lda, b, kc, left, part, np);
    full_tile<R - 3, false>(a + 3, lda, b, kc, left ? left + 3 * 32 : nullptr, part + 3 * 32, {});
  }
}

}  // namespace

void chunk_tile_avx2(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                     const float* left, float* part, const NextPanel& np) {
  with_tile_rows<kTileRowsAvx2>(rows, [&](auto r) {
    with_ahead(np.ahead,
               [&](auto ahead) { tile<r.value, ahead.value>(a, lda, b, kc, left, part, np); });
  });
}

}  // namespace miles::kernels::detail
