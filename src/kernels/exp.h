// exp as every miles kernel computes it (softmax, log-softmax, attention, SiLU, their backwards):
// its own function rather than libm's, so that
//  * a SIMD loop and the scalar code give the same bits (the vector form is the scalar form's
//    operations lane by lane: the engine's and the trainer's exps agree however they are batched);
//  * results do not change with the C library's version or the machine.
//
// Method (the classic Cody–Waite scheme): n = round(x · log2 e); r = x − n·ln2 in two fma steps
// (ln2 split as C1 + C2, C1 with few bits so n·C1 is exact); exp(r) = 1 + r + r²·P(r) with P the
// degree-5 minimax polynomial of Cephes' expf on |r| ≤ ln2/2; times 2^n as 2^⌊n/2⌋ · 2^(n−⌊n/2⌋)
// (exact multiplications while the result is normal, so subnormal results round once). Accuracy:
// within 2 ulp of the true exp over the whole float range (tests/kernels_test.cc measures it).
// x ≥ 89 gives +inf, x ≤ −104 gives 0, NaN gives x.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/exp_avx512.h"
#include "kernels/exp_constants.h"
#include "miles/kernels.h"

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#define MILES_EXP_SIMD_AVX 1
#endif

namespace miles::kernels::detail {

inline float pow2_bits(int32_t e) {  // 2^e for e in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float exp_f32(float x) {
  using namespace exp_constants;
  if (std::isnan(x)) return x;
  x = x < kLo ? kLo : x;
  x = x > kHi ? kHi : x;
  const float kf = std::nearbyint(x * kLog2e);
  float r = std::fma(-kf, kC1, x);
  r = std::fma(-kf, kC2, r);
  const float z = r * r;
  float p = kP5;
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP0);
  const float y = std::fma(p, z, r) + 1.0f;
  const int32_t n = static_cast<int32_t>(kf);
  const int32_t n1 = n >> 1;  // floor(n / 2): n1 and n - n1 stay inside the normal exponents
  return (y * pow2_bits(n1)) * pow2_bits(n - n1);
}

#ifdef MILES_EXP_SIMD_AVX
// exp_f32 of 8 lanes: the same operations lane by lane (the integer steps in two SSE halves, so
// AVX + FMA suffice).
inline __m256 exp_f32x8(__m256 x) {
  using namespace exp_constants;
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256 v = _mm256_max_ps(x, _mm256_set1_ps(kLo));  // NaN lanes: restored at the end
  v = _mm256_min_ps(v, _mm256_set1_ps(kHi));
  const __m256 kf = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)),
                                    _MM_FROUND_CUR_DIRECTION);     // as nearbyint
  const __m256 neg_kf = _mm256_xor_ps(kf, _mm256_set1_ps(-0.0f));  // -kf, as the scalar code
  __m256 r = _mm256_fmadd_ps(neg_kf, _mm256_set1_ps(kC1), v);
  r = _mm256_fmadd_ps(neg_kf, _mm256_set1_ps(kC2), r);
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(kP5);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP0));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_cvtps_epi32(kf);  // kf is integral: exact
  const __m128i bias = _mm_set1_epi32(127);
  auto scales = [&](__m128i nh, __m128i* s1, __m128i* s2) {
    const __m128i n1 = _mm_srai_epi32(nh, 1);
    *s1 = _mm_slli_epi32(_mm_add_epi32(n1, bias), 23);
    *s2 = _mm_slli_epi32(_mm_add_epi32(_mm_sub_epi32(nh, n1), bias), 23);
  };
  __m128i lo1, lo2, hi1, hi2;
  scales(_mm256_castsi256_si128(n), &lo1, &lo2);
  scales(_mm256_extractf128_si256(n, 1), &hi1, &hi2);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_insertf128_si256(_mm256_castsi128_si256(lo1), hi1, 1));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_insertf128_si256(_mm256_castsi128_si256(lo2), hi2, 1));
  const __m256 out = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
  return _mm256_blendv_ps(out, x, nan);
}
#endif

// Whether the 16-lane row loops of exp_avx512.h run (an AVX-512 machine, unless MILES_ISA asks for
// less): the same bits either way.
inline bool exp_avx512() { return detect_isa() == Isa::kAvx512; }

// out[i] = exp_f32(x[i] - shift) for i in [0, n) (x - shift rounded first, as the scalar code).
inline void exp_shifted(const float* x, float shift, int64_t n, float* out) {
  int64_t i = 0;
  if (n >= 16 && exp_avx512()) i = exp_shifted_avx512(x, shift, n, out);
#ifdef MILES_EXP_SIMD_AVX
  const __m256 s = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, exp_f32x8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
#endif
  for (; i < n; ++i) out[i] = exp_f32(x[i] - shift);
}

// A thread's scratch row of at least n floats (exp terms of a vocabulary row).
inline float* exp_scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

}  // namespace miles::kernels::detail
