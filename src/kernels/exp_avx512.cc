// exp_avx512.h's row loops: exp_f32x8 (exp.h) widened to 16 lanes, the same operations lane by
// lane. Compiled with -mavx512f (CMakeLists.txt: *_avx512.cc).
#include "kernels/exp_avx512.h"

// GCC 12 warns, wrongly, that the pass-through operand (_mm512_undefined_*) of the unmasked max,
// min, round, convert and shift intrinsics may be used uninitialized: every lane is overwritten.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "kernels/exp_constants.h"

namespace miles::kernels::detail {
namespace {

// -x: the sign bit flipped (as the scalar code's negation).
inline __m512 negate(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
}

// exp_f32x8's steps on 16 lanes: clamp to [kLo, kHi] (NaN lanes restored at the end), n =
// nearbyint(x log2 e), r = x - n C1 - n C2, 1 + r + r² P(r), times 2^⌊n/2⌋ · 2^(n-⌊n/2⌋).
inline __m512 exp16(__m512 x) {
  using namespace exp_constants;
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512 v = _mm512_max_ps(x, _mm512_set1_ps(kLo));
  v = _mm512_min_ps(v, _mm512_set1_ps(kHi));
  const __m512 kf = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(kLog2e)),
                                         _MM_FROUND_CUR_DIRECTION);  // as nearbyint
  const __m512 neg_kf = negate(kf);
  __m512 r = _mm512_fmadd_ps(neg_kf, _mm512_set1_ps(kC1), v);
  r = _mm512_fmadd_ps(neg_kf, _mm512_set1_ps(kC2), r);
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(kP5);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP0));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
  const __m512i n = _mm512_cvtps_epi32(kf);  // kf is integral: exact
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512i n1 = _mm512_srai_epi32(n, 1);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(n, n1), bias), 23));
  return _mm512_mask_blend_ps(nan, _mm512_mul_ps(_mm512_mul_ps(y, s1), s2), x);
}

}  // namespace

int64_t exp_shifted_avx512(const float* x, float shift, int64_t n, float* out) {
  const __m512 s = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
  return i;
}

int64_t swiglu_avx512(const float* g, const float* u, int64_t n, float* o) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(negate(gv))));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
  }
  return i;
}

int64_t swiglu_backward_avx512(const float* g, const float* u, const float* a, int64_t n, float* dg,
                               float* du) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i), av = _mm512_loadu_ps(a + i);
    const __m512 den = _mm512_add_ps(one, exp16(negate(gv)));
    const __m512 sig = _mm512_div_ps(one, den), silu = _mm512_div_ps(gv, den);
    _mm512_storeu_ps(du + i, _mm512_mul_ps(av, silu));
    const __m512 t = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, sig)));
    _mm512_storeu_ps(
        dg + i, _mm512_mul_ps(_mm512_mul_ps(av, _mm512_loadu_ps(u + i)), _mm512_mul_ps(sig, t)));
  }
  return i;
}

int64_t logprob_gradient_avx512(const float* x, int64_t n, float max, float log_sum, float gl,
                                float ge, float h, float* out) {
  const __m512 mx = _mm512_set1_ps(max), ls = _mm512_set1_ps(log_sum);
  const __m512 ngl = _mm512_set1_ps(-gl), vge = _mm512_set1_ps(ge), vh = _mm512_set1_ps(h);
  int64_t v = 0;
  for (; v + 16 <= n; v += 16) {
    const __m512 lp = _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + v), mx), ls);
    const __m512 p = exp16(lp);
    _mm512_storeu_ps(out + v,
                     _mm512_sub_ps(_mm512_mul_ps(ngl, p),
                                   _mm512_mul_ps(_mm512_mul_ps(vge, p), _mm512_add_ps(lp, vh))));
  }
  return v;
}

}  // namespace miles::kernels::detail
