// The AVX-512 row sums of attention (attention_avx512.h): up to four keys or heads × the whole head
// dimension (up to 4 zmm each) in 16 of AVX-512's 32 registers. Compiled with -mavx512f.
#include "kernels/attention_avx512.h"

#include <immintrin.h>

#include <algorithm>

namespace miles::kernels::detail {
namespace {

template <int L, int C>  // L keys, C zmm (16 floats) per key row
void lanes(const float* coef, const BlockRows& b, int64_t j0, float* acc, int64_t ld_acc) {
  __m512 a[L][C];
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) a[l][c] = _mm512_loadu_ps(acc + l * ld_acc + 16 * c);
  }
  for (int64_t g = 0; g < b.group; ++g)
    for (int64_t i = std::max(b.i0, j0); i < b.i1; ++i) {
      const float* r = b.row(g, i);
      const float* cf = coef + b.coef_at(g, i) + j0;
      __m512 rv[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) rv[c] = _mm512_loadu_ps(r + 16 * c);
#pragma GCC unroll 16
      for (int l = 0; l < L; ++l) {
        if (i < j0 + l) continue;  // a key sees only the queries at or after it
        const __m512 cl = _mm512_set1_ps(cf[l]);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) a[l][c] = _mm512_fmadd_ps(cl, rv[c], a[l][c]);
      }
    }
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + l * ld_acc + 16 * c, a[l][c]);
  }
}

template <int L>
void for_width(int64_t hd, const float* coef, const BlockRows& b, int64_t j0, float* acc,
               int64_t ld_acc) {
  switch (hd / 16) {
    case 1:
      return lanes<L, 1>(coef, b, j0, acc, ld_acc);
    case 2:
      return lanes<L, 2>(coef, b, j0, acc, ld_acc);
    case 3:
      return lanes<L, 3>(coef, b, j0, acc, ld_acc);
    case 4:
      return lanes<L, 4>(coef, b, j0, acc, ld_acc);
    default:
      break;
  }
}

template <int L, int C>  // L heads, C zmm per row
void rows(const float* const* p, const float* const* r, int64_t n, float* const* acc) {
  __m512 a[L][C];
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) a[l][c] = _mm512_loadu_ps(acc[l] + 16 * c);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 rv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) rv[c] = _mm512_loadu_ps(r[j] + 16 * c);
#pragma GCC unroll 16
    for (int l = 0; l < L; ++l) {
      const __m512 pl = _mm512_set1_ps(p[l][j]);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) a[l][c] = _mm512_fmadd_ps(pl, rv[c], a[l][c]);
    }
  }
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc[l] + 16 * c, a[l][c]);
  }
}

template <int L>
void rows_for_width(int64_t hd, const float* const* p, const float* const* r, int64_t n,
                    float* const* acc) {
  switch (hd / 16) {
    case 1:
      return rows<L, 1>(p, r, n, acc);
    case 2:
      return rows<L, 2>(p, r, n, acc);
    case 3:
      return rows<L, 3>(p, r, n, acc);
    case 4:
      return rows<L, 4>(p, r, n, acc);
    default:
      break;
  }
}

}  // namespace

void fma_rows_avx512(int lanes, const float* const* p, const float* const* rows, int64_t n,
                     int64_t hd, float* const* acc) {
  switch (lanes) {
    case 1:
      return rows_for_width<1>(hd, p, rows, n, acc);
    case 2:
      return rows_for_width<2>(hd, p, rows, n, acc);
    case 3:
      return rows_for_width<3>(hd, p, rows, n, acc);
    case 4:
      return rows_for_width<4>(hd, p, rows, n, acc);
    default:
      break;
  }
}

void key_lanes_avx512(int keys, const float* coef, const BlockRows& b, int64_t j0, int64_t hd,
                      float* acc, int64_t ld_acc) {
  switch (keys) {
    case 1:
      return for_width<1>(hd, coef, b, j0, acc, ld_acc);
    case 2:
      return for_width<2>(hd, coef, b, j0, acc, ld_acc);
    case 3:
      return for_width<3>(hd, coef, b, j0, acc, ld_acc);
    case 4:
      return for_width<4>(hd, coef, b, j0, acc, ld_acc);
    default:
      break;
  }
}

}  // namespace miles::kernels::detail
