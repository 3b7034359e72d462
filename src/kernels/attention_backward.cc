// Backward of causal attention (backward.h), one (sequence, kv head) at a time.
//
// Each score p_ij = q_i · k_j is the contract's dot (one fma chain over the head dimension from 0,
// ascending, for head_dim <= kGemmChunk). Here eight or 32 keys' chains run side by side in SIMD
// lanes over a transposed copy of K (and V for d_out · v_j): every lane performs exactly the chain
// of kernels::detail::dot, so the bits are those of the scalar pair-by-pair code. The updates of
// dq, dk and dv are element-wise fma over the head dimension, in the original ascending (head,
// query, key) order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/backward.h"
#include "kernels/exp.h"
#include "kernels/reduce.h"

namespace miles::kernels {

using detail::dots_transposed;
using detail::fma_row;
using detail::transpose_rows;

void attention_backward_kv_head(const float* q, const float* k, const float* v, int64_t ldq,
                                int64_t ldkv, const float* d_out, int64_t t, int64_t heads,
                                int64_t kv_heads, int64_t head_dim, float scale, int64_t kh,
                                float* dq, float* dk, float* dv) {
  MILES_CHECK(heads % kv_heads == 0);
  const int64_t group = heads / kv_heads, hd = head_dim;
  for (int64_t i = 0; i < t; ++i) {
    std::fill(dk + i * ldkv + kh * hd, dk + i * ldkv + (kh + 1) * hd, 0.0f);
    std::fill(dv + i * ldkv + kh * hd, dv + i * ldkv + (kh + 1) * hd, 0.0f);
  }
  const bool simd = hd <= kGemmChunk;  // one chain per dot; longer heads take the scalar dot
  const int64_t ldt = (t + 7) / 8 * 8;
  std::vector<float> kt, vt;
  if (simd) {
    transpose_rows(k + kh * hd, ldkv, t, hd, ldt, kt);
    transpose_rows(v + kh * hd, ldkv, t, hd, ldt, vt);
  }
  std::vector<float> p(static_cast<size_t>(ldt)), dp(static_cast<size_t>(ldt));
  for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
    for (int64_t i = 0; i < t; ++i) {
      const float* qi = q + i * ldq + h * hd;
      const float* doi = d_out + (i * heads + h) * hd;
      if (simd) {
        dots_transposed(qi, kt.data(), ldt, hd, i + 1, p.data());
        dots_transposed(doi, vt.data(), ldt, hd, i + 1, dp.data());
      } else {
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = detail::dot(qi, k + j * ldkv + kh * hd, hd);
          dp[j] = detail::dot(doi, v + j * ldkv + kh * hd, hd);
        }
      }
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = p[j] * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.0f;
      detail::exp_shifted(p.data(), mx, i + 1, p.data());
      for (int64_t j = 0; j <= i; ++j) sum = sum + p[j];
      // D = Σ p·dp, with dp_j = d_out · v_j.
      float dsum = 0.0f;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = p[j] / sum;
        dsum = std::fma(p[j], dp[j], dsum);
      }
      float* dqi = dq + i * ldq + h * hd;
      std::fill(dqi, dqi + hd, 0.0f);
      for (int64_t j = 0; j <= i; ++j) {
        const float ds = p[j] * (dp[j] - dsum) * scale;
        fma_row(ds, k + j * ldkv + kh * hd, dqi, hd);
        fma_row(ds, qi, dk + j * ldkv + kh * hd, hd);
        fma_row(p[j], doi, dv + j * ldkv + kh * hd, hd);
      }
    }
  }
}

void attention_backward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldkv,
                        const float* d_out, int64_t t, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, float scale, float* dq, float* dk, float* dv) {
  for (int64_t kh = 0; kh < kv_heads; ++kh)
    attention_backward_kv_head(q, k, v, ldq, ldkv, d_out, t, heads, kv_heads, head_dim, scale, kh,
                               dq, dk, dv);
}

}  // namespace miles::kernels
