// Backward of causal attention (backward.h), one (sequence, kv head) at a time, in blocks of
// kQueryBlock queries.
//
// Phase 1, per query head h of the group and query i of the block: the scores p_ij = q_i · k_j are
// the contract's dot (one fma chain over the head dimension from 0, for head_dim <= kGemmChunk),
// eight keys' chains side by side in SIMD lanes over a transposed copy of K (and V for
// dp_j = d_out_i · v_j), so every lane performs exactly kernels::detail::dot's chain; softmax
// (two-pass, exp_f32); ds_ij = p_ij (dp_ij − Σ_j p dp) · scale; dq_i = Σ_j ds_ij k_j (ascending j,
// accumulated in registers). P and dS of the block are kept.
// Phase 2, per key j up to the block's last query: dk_j += Σ ds_ij q_i and dv_j += Σ p_ij d_out_i
// over the block's (head, query) pairs in ascending (head, query) order, accumulated in registers.
// So dk / dv sum over (query block, head, query) in that order; every sum's order is fixed by the
// sequence alone (not the thread count, the batch or the layout).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/backward.h"
#include "kernels/exp.h"
#include "kernels/reduce.h"

namespace miles::kernels {

namespace {
constexpr int64_t kQueryBlock = 64;  // queries whose P and dS are held at once
}  // namespace

using detail::dots_transposed;
using detail::fma_rows;
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
  std::vector<const float*> k_rows(static_cast<size_t>(t));
  for (int64_t j = 0; j < t; ++j) k_rows[j] = k + j * ldkv + kh * hd;
  const int64_t qb = std::min(kQueryBlock, t);
  // P and dS of the block: [head of the group][query of the block][key], keys < the block's end.
  std::vector<float> pb(static_cast<size_t>(group * qb * t)), dsb(pb.size());
  std::vector<float> dp(static_cast<size_t>(ldt));
  std::vector<float> coef(static_cast<size_t>(group * qb));
  std::vector<const float*> rows(static_cast<size_t>(group * qb));
  for (int64_t i0 = 0; i0 < t; i0 += qb) {
    const int64_t i1 = std::min(t, i0 + qb);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kh * group + g;
      for (int64_t i = i0; i < i1; ++i) {
        const float* qi = q + i * ldq + h * hd;
        const float* doi = d_out + (i * heads + h) * hd;
        float* p = pb.data() + (g * qb + (i - i0)) * t;
        float* ds = dsb.data() + (g * qb + (i - i0)) * t;
        if (simd) {
          dots_transposed(qi, kt.data(), ldt, hd, i + 1, p);
          dots_transposed(doi, vt.data(), ldt, hd, i + 1, dp.data());
        } else {
          for (int64_t j = 0; j <= i; ++j) {
            p[j] = detail::dot(qi, k_rows[j], hd);
            dp[j] = detail::dot(doi, v + j * ldkv + kh * hd, hd);
          }
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = p[j] * scale;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.0f;
        detail::exp_shifted(p, mx, i + 1, p);
        for (int64_t j = 0; j <= i; ++j) sum = sum + p[j];
        // D = Σ p·dp, with dp_j = d_out · v_j.
        float dsum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = p[j] / sum;
          dsum = std::fma(p[j], dp[j], dsum);
        }
        for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (dp[j] - dsum) * scale;
        float* dqi = dq + i * ldq + h * hd;
        std::fill(dqi, dqi + hd, 0.0f);
        fma_rows(ds, k_rows.data(), i + 1, hd, dqi);
      }
    }
    // dk_j and dv_j over the block's (head, query) pairs that see key j (queries i >= j).
    for (int64_t j = 0; j < i1; ++j) {
      const int64_t first = std::max(i0, j);
      int64_t n = 0;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = first; i < i1; ++i, ++n) {
          coef[n] = dsb[(g * qb + (i - i0)) * t + j];
          rows[n] = q + i * ldq + (kh * group + g) * hd;
        }
      fma_rows(coef.data(), rows.data(), n, hd, dk + j * ldkv + kh * hd);
      n = 0;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = first; i < i1; ++i, ++n) {
          coef[n] = pb[(g * qb + (i - i0)) * t + j];
          rows[n] = d_out + (i * heads + kh * group + g) * hd;
        }
      fma_rows(coef.data(), rows.data(), n, hd, dv + j * ldkv + kh * hd);
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
