// Several query heads of one KV head at once (the GQA group): their dot products against the same
// keys and their fma rows over the same value (or key) rows share every load of those rows. Each
// lane performs exactly the operations of one head alone, in the same order (a dot: dots_segments'
// one fma chain over the head dimension from 0 per key; fma rows: rows in ascending order,
// element-wise), so the bits do not depend on how many heads go together: only the memory traffic
// changes. The rows of a block do not fit in L1 in the backward pass, so one head at a time made
// one L2 load per fma; L lanes need one load per L fmas.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention_simd.h"
#include "kernels/unroll.h"

namespace miles::kernels::detail {

inline constexpr int kMaxLanes = 4;  // query heads handled together

// Segments per pass of the L-lane dots: L * S chains in flight (at least 8, to cover the fma
// latency) within AVX2's 16 registers.
template <int L>
inline constexpr int kLaneSegments = L <= 3 ? 4 : 2;

#ifdef MILES_ATTN_SIMD_AVX
// One pass of dots_segments_lanes over segments [0, S): out[l][j] for j < keep.
template <int L, int S>
inline void dots_pass(const float* const* x, const float* const* seg, const int64_t* ld, int64_t hd,
                      int64_t keep, float* const* out) {
  __m256 a[L][S];
  MILES_UNROLL
  for (int l = 0; l < L; ++l) {
    MILES_UNROLL
    for (int c = 0; c < S; ++c) a[l][c] = _mm256_setzero_ps();
  }
  for (int64_t e = 0; e < hd; ++e) {
    __m256 k[S];
    MILES_UNROLL
    for (int c = 0; c < S; ++c) k[c] = _mm256_loadu_ps(seg[c] + e * ld[c]);
    MILES_UNROLL
    for (int l = 0; l < L; ++l) {
      const __m256 xe = _mm256_set1_ps(x[l][e]);
      MILES_UNROLL
      for (int c = 0; c < S; ++c) a[l][c] = _mm256_fmadd_ps(xe, k[c], a[l][c]);
    }
  }
  if (keep == 8 * S) {  // whole segments: straight to the rows (no library copy per lane)
    MILES_UNROLL
    for (int l = 0; l < L; ++l) {
      MILES_UNROLL
      for (int c = 0; c < S; ++c) _mm256_storeu_ps(out[l] + 8 * c, a[l][c]);
    }
    return;
  }
  MILES_UNROLL
  for (int l = 0; l < L; ++l) {
    float lanes[8 * S];
    MILES_UNROLL
    for (int c = 0; c < S; ++c) _mm256_storeu_ps(lanes + 8 * c, a[l][c]);
    for (int64_t j = 0; j < keep; ++j) out[l][j] = lanes[j];
  }
}
#endif

// out[l][j] = dots_segments(x[l], seg, ld, hd, n)[j] for l < L.
template <int L>
inline void dots_segments_lanes(const float* const* x, const float* const* seg, const int64_t* ld,
                                int64_t hd, int64_t n, float* const* out) {
#ifdef MILES_ATTN_SIMD_AVX
  constexpr int S = kLaneSegments<L>;
  const int64_t segs = (n + 7) / 8;
  float* o[L];
  for (int64_t s = 0; s < segs; s += S) {
    MILES_UNROLL
    for (int l = 0; l < L; ++l) o[l] = out[l] + 8 * s;
    const int64_t keep = std::min<int64_t>(8 * S, n - 8 * s);
    switch (std::min<int64_t>(S, segs - s)) {
      case 4:
        dots_pass<L, (S >= 4 ? 4 : 1)>(x, seg + s, ld + s, hd, keep, o);
        break;
      case 3:
        dots_pass<L, (S >= 3 ? 3 : 1)>(x, seg + s, ld + s, hd, keep, o);
        break;
      case 2:
        dots_pass<L, 2>(x, seg + s, ld + s, hd, keep, o);
        break;
      default:
        dots_pass<L, 1>(x, seg + s, ld + s, hd, keep, o);
        break;
    }
  }
#else
  MILES_UNROLL
  for (int l = 0; l < L; ++l) dots_segments(x[l], seg, ld, hd, n, out[l]);
#endif
}

// out[l][j] = detail::dot(x[l], column j of kt) for j < n and l < L: dots_segments_lanes over kt's
// columns; kt is [hd][ldt] with ldt a multiple of 8 and columns past n readable (zero padding).
template <int L>
inline void dots_transposed_lanes(const float* const* x, const float* kt, int64_t ldt, int64_t hd,
                                  int64_t n, float* const* out) {
  constexpr int S = kLaneSegments<L>;
  const float* seg[S];
  int64_t ld[S];
  float* o[L];
  for (int64_t j = 0; j < n; j += 8 * S) {
    MILES_UNROLL
    for (int c = 0; c < S; ++c) {
      seg[c] = kt + j + 8 * c;
      ld[c] = ldt;
    }
    MILES_UNROLL
    for (int l = 0; l < L; ++l) o[l] = out[l] + j;
    dots_segments_lanes<L>(x, seg, ld, hd, std::min<int64_t>(8 * S, n - j), o);
  }
}

// acc[l][e] = fma(p[l][j], rows[j][e], acc[l][e]) for j = 0, 1, ..., n - 1 in that order, every
// e < hd and l < L: element-wise, so any vector width gives the same bits; the accumulators stay in
// registers across the rows.
template <int L>
inline void fma_rows_lanes(const float* const* p, const float* const* rows, int64_t n, int64_t hd,
                           float* const* acc) {
  int64_t e = 0;
#ifdef MILES_ATTN_SIMD_AVX
  constexpr int C = L <= 3 ? 4 : 2;  // vectors of 8 per lane per pass: L * C accumulators
  for (; e + 8 * C <= hd; e += 8 * C) {
    __m256 a[L][C];
    MILES_UNROLL
    for (int l = 0; l < L; ++l) {
      MILES_UNROLL
      for (int c = 0; c < C; ++c) a[l][c] = _mm256_loadu_ps(acc[l] + e + 8 * c);
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* r = rows[j] + e;
      __m256 pj[L];
      MILES_UNROLL
      for (int l = 0; l < L; ++l) pj[l] = _mm256_set1_ps(p[l][j]);
      MILES_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m256 rv = _mm256_loadu_ps(r + 8 * c);
        MILES_UNROLL
        for (int l = 0; l < L; ++l) a[l][c] = _mm256_fmadd_ps(pj[l], rv, a[l][c]);
      }
    }
    MILES_UNROLL
    for (int l = 0; l < L; ++l) {
      MILES_UNROLL
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc[l] + e + 8 * c, a[l][c]);
    }
  }
  // The rest of the head dimension, lane by lane (element-wise: the same bits).
  for (; e + 8 <= hd; e += 8)
    for (int l = 0; l < L; ++l) {
      __m256 a = _mm256_loadu_ps(acc[l] + e);
      for (int64_t j = 0; j < n; ++j)
        a = _mm256_fmadd_ps(_mm256_set1_ps(p[l][j]), _mm256_loadu_ps(rows[j] + e), a);
      _mm256_storeu_ps(acc[l] + e, a);
    }
#endif
  for (; e < hd; ++e)
    for (int l = 0; l < L; ++l)
      for (int64_t j = 0; j < n; ++j) acc[l][e] = std::fma(p[l][j], rows[j][e], acc[l][e]);
}

// Calls fn.template operator()<L>(g0) for consecutive chunks [g0, g0 + L) of [0, count), L at
// most kMaxLanes (4 until fewer are left): a group's heads, or a block's keys, a few at a time.
template <typename Fn>
inline void for_lane_chunks(int64_t count, Fn&& fn) {
  static_assert(kMaxLanes == 4);
  int64_t g0 = 0;
  for (; g0 + 4 <= count; g0 += 4) fn.template operator()<4>(g0);
  switch (count - g0) {
    case 3:
      fn.template operator()<3>(g0);
      break;
    case 2:
      fn.template operator()<2>(g0);
      break;
    case 1:
      fn.template operator()<1>(g0);
      break;
    default:
      break;
  }
}

}  // namespace miles::kernels::detail
