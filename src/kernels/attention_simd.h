// SIMD pieces shared by the attention kernels (attention.cc, attention_backward.cc): several keys'
// dot products side by side in vector lanes over a transposed copy of K (or V), each lane the
// contract's one fma chain over the head dimension from 0 (detail::dot for head_dim <= kGemmChunk),
// so the bits are those of the scalar pair-by-pair code; element-wise row helpers. The several-head
// forms the kernels call are in attention_lanes.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#define MILES_ATTN_SIMD_AVX 1
#endif

namespace miles::kernels::detail {

// out[j] = detail::dot(x, key j) for j in [0, n), the keys given as segments of 8: key 8s + l has
// element e at seg[s][e * ld[s] + l] (a transposed block of the KV cache, or of a copy). Every lane
// is one fma chain over e from 0 (hd <= kGemmChunk), as detail::dot's; lanes past n are computed
// on whatever the segment holds there and dropped.
inline void dots_segments(const float* x, const float* const* seg, const int64_t* ld, int64_t hd,
                          int64_t n, float* out) {
  const int64_t segs = (n + 7) / 8;
  int64_t s = 0;
#ifdef MILES_ATTN_SIMD_AVX
  for (; s + 4 <= segs; s += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *r0 = seg[s], *r1 = seg[s + 1], *r2 = seg[s + 2], *r3 = seg[s + 3];
    const int64_t l0 = ld[s], l1 = ld[s + 1], l2 = ld[s + 2], l3 = ld[s + 3];
    for (int64_t e = 0; e < hd; ++e) {
      const __m256 xe = _mm256_set1_ps(x[e]);
      a0 = _mm256_fmadd_ps(xe, _mm256_loadu_ps(r0 + e * l0), a0);
      a1 = _mm256_fmadd_ps(xe, _mm256_loadu_ps(r1 + e * l1), a1);
      a2 = _mm256_fmadd_ps(xe, _mm256_loadu_ps(r2 + e * l2), a2);
      a3 = _mm256_fmadd_ps(xe, _mm256_loadu_ps(r3 + e * l3), a3);
    }
    float lanes[32];
    _mm256_storeu_ps(lanes, a0);
    _mm256_storeu_ps(lanes + 8, a1);
    _mm256_storeu_ps(lanes + 16, a2);
    _mm256_storeu_ps(lanes + 24, a3);
    std::copy_n(lanes, std::min<int64_t>(32, n - 8 * s), out + 8 * s);
  }
  for (; s < segs; ++s) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t e = 0; e < hd; ++e)
      a = _mm256_fmadd_ps(_mm256_set1_ps(x[e]), _mm256_loadu_ps(seg[s] + e * ld[s]), a);
    float lanes[8];
    _mm256_storeu_ps(lanes, a);
    std::copy_n(lanes, std::min<int64_t>(8, n - 8 * s), out + 8 * s);
  }
#else
  for (; s < segs; ++s)
    for (int64_t l = 0; l < 8 && 8 * s + l < n; ++l) {
      float acc = 0.0f;
      for (int64_t e = 0; e < hd; ++e) acc = std::fma(x[e], seg[s][e * ld[s] + l], acc);
      out[8 * s + l] = acc;
    }
#endif
}

// y[e] = +0 for e < n: inline stores (a head's row is too short to pay for a library call).
inline void zero_row(float* y, int64_t n) {
  int64_t e = 0;
#ifdef MILES_ATTN_SIMD_AVX
  for (; e + 8 <= n; e += 8) _mm256_storeu_ps(y + e, _mm256_setzero_ps());
#endif
  for (; e < n; ++e) y[e] = 0.0f;
}

// y[e] = y[e] * a, element-wise.
inline void scale_row(float a, float* y, int64_t n) {
  int64_t e = 0;
#ifdef MILES_ATTN_SIMD_AVX
  const __m256 av = _mm256_set1_ps(a);
  for (; e + 8 <= n; e += 8) _mm256_storeu_ps(y + e, _mm256_mul_ps(_mm256_loadu_ps(y + e), av));
#endif
  for (; e < n; ++e) y[e] = y[e] * a;
}

// ds[j] = p[j] * (dp[j] - d) * scale (left to right), element-wise: the softmax backward's dS.
inline void softmax_grad_row(const float* p, const float* dp, float d, float scale, float* ds,
                             int64_t n) {
  int64_t j = 0;
#ifdef MILES_ATTN_SIMD_AVX
  const __m256 dv = _mm256_set1_ps(d), sv = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8) {
    const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(dp + j), dv);
    _mm256_storeu_ps(ds + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(p + j), diff), sv));
  }
#endif
  for (; j < n; ++j) ds[j] = p[j] * (dp[j] - d) * scale;
}

// out[e] = x[e] / d, element-wise.
inline void divide_row(const float* x, float d, float* out, int64_t n) {
  int64_t e = 0;
#ifdef MILES_ATTN_SIMD_AVX
  const __m256 dv = _mm256_set1_ps(d);
  for (; e + 8 <= n; e += 8) _mm256_storeu_ps(out + e, _mm256_div_ps(_mm256_loadu_ps(x + e), dv));
#endif
  for (; e < n; ++e) out[e] = x[e] / d;
}

// kt[e * ldt + j] = rows[j][e] for j < n_rows (a block of keys, one pointer per key: the rows may
// sit in different KV blocks) and e < hd; columns j in [n_rows, ldt) get zeros. Moves values only.
// ldt a multiple of 8.
inline void transpose_key_rows(const float* const* rows, int64_t n_rows, int64_t hd, int64_t ldt,
                               float* kt) {
  int64_t e0 = 0;
#ifdef MILES_ATTN_SIMD_AVX
  static const float kZeros[8] = {};
  for (; e0 + 8 <= hd; e0 += 8) {
    for (int64_t j0 = 0; j0 < ldt; j0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_ps(j0 + i < n_rows ? rows[j0 + i] + e0 : kZeros);
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
      const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
      float* d = kt + e0 * ldt + j0;
      _mm256_storeu_ps(d + 0 * ldt, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(d + 1 * ldt, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(d + 2 * ldt, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(d + 3 * ldt, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(d + 4 * ldt, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(d + 5 * ldt, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(d + 6 * ldt, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(d + 7 * ldt, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
  }
#endif
  for (; e0 < hd; ++e0)
    for (int64_t j = 0; j < ldt; ++j) kt[e0 * ldt + j] = j < n_rows ? rows[j][e0] : 0.0f;
}

// [t][hd] rows (stride ld) → [hd][ldt], zero-padded columns (ldt a multiple of 8).
inline void transpose_rows(const float* src, int64_t ld, int64_t t, int64_t hd, int64_t ldt,
                           std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(hd * ldt));
  std::vector<const float*> rows(static_cast<size_t>(t));
  for (int64_t j = 0; j < t; ++j) rows[j] = src + j * ld;
  transpose_key_rows(rows.data(), t, hd, ldt, dst.data());
}

}  // namespace miles::kernels::detail
