// Backward of causal attention (backward.h), one (sequence, kv head) at a time, in blocks of
// kQueryBlock queries.
//
// Phase 1, per query head h of the group and query i of the block: the scores p_ij = q_i · k_j are
// the contract's dot (one fma chain over the head dimension from 0, for head_dim <= kGemmChunk),
// eight keys' chains side by side in SIMD lanes over a transposed copy of K (and V for
// dp_j = d_out_i · v_j), so every lane performs exactly kernels::detail::dot's chain; softmax
// (two-pass, exp_f32); ds_ij = p_ij (dp_ij − Σ_j p dp) · scale; dq_i = Σ_j ds_ij k_j (ascending j,
// accumulated in registers). P and dS of the block are kept. The group's heads go a few at a time
// (attention_lanes.h), sharing the loads of K, V and the k rows; each head's operations are as
// above.
// Phase 2, per key j up to the block's last query: dk_j += Σ ds_ij q_i and dv_j += Σ p_ij d_out_i
// over the block's (head, query) pairs in ascending (head, query) order, accumulated in registers,
// four keys at a time sharing the loads of the q and d_out rows (key_lanes).
// So dk / dv sum over (query block, head, query) in that order; every sum's order is fixed by the
// sequence alone (not the thread count, the batch or the layout).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_lanes.h"
#include "kernels/attention_simd.h"
#include "kernels/backward.h"
#include "kernels/exp.h"
#include "kernels/reduce.h"

namespace miles::kernels {

namespace {
constexpr int64_t kQueryBlock = 64;  // queries whose P and dS are held at once

// The rows a query block's dk (q rows, coefficients dS) or dv (d_out rows, coefficients P) sum
// over: row (g, i) = base + g * head_stride + i * row_stride for the group's heads g and queries
// i in [i0, i1); coefficient (g, i, key j) = coef[(g * qb + i - i0) * t + j].
struct BlockRows {
  const float* base;
  int64_t head_stride, row_stride, group, qb, t, i0, i1;
  const float* row(int64_t g, int64_t i) const { return base + g * head_stride + i * row_stride; }
  int64_t coef_at(int64_t g, int64_t i) const { return (g * qb + i - i0) * t; }
};

// acc of keys j0 .. j0 + L - 1 (rows acc + l * ld_acc): acc_l[e] = fma(coef(g, i, j0 + l),
// row(g, i)[e], acc_l[e]) over g ascending, then i ascending from max(i0, j0 + l): for each key,
// one ascending fma pass over the (head, query) pairs that see it, with each row loaded once for
// all L keys. A key skips the rows of queries before it (their coefficients are not computed).
template <int L>
void key_lanes(const float* coef, const BlockRows& b, int64_t j0, int64_t hd, float* acc,
               int64_t ld_acc) {
  int64_t e = 0;
#ifdef MILES_ATTN_SIMD_AVX
  constexpr int C = L <= 3 ? 4 : 2;
  auto pass = [&]<int W>(int64_t e0) {  // W vectors of 8 per key
    __m256 a[L][W];
    MILES_UNROLL
    for (int l = 0; l < L; ++l) {
      MILES_UNROLL
      for (int c = 0; c < W; ++c) a[l][c] = _mm256_loadu_ps(acc + l * ld_acc + e0 + 8 * c);
    }
    for (int64_t g = 0; g < b.group; ++g)
      for (int64_t i = std::max(b.i0, j0); i < b.i1; ++i) {
        const float* r = b.row(g, i) + e0;
        const float* cf = coef + b.coef_at(g, i) + j0;
        __m256 rv[W];
        MILES_UNROLL
        for (int c = 0; c < W; ++c) rv[c] = _mm256_loadu_ps(r + 8 * c);
        MILES_UNROLL
        for (int l = 0; l < L; ++l) {
          if (i < j0 + l) continue;
          const __m256 cl = _mm256_set1_ps(cf[l]);
          MILES_UNROLL
          for (int c = 0; c < W; ++c) a[l][c] = _mm256_fmadd_ps(cl, rv[c], a[l][c]);
        }
      }
    MILES_UNROLL
    for (int l = 0; l < L; ++l) {
      MILES_UNROLL
      for (int c = 0; c < W; ++c) _mm256_storeu_ps(acc + l * ld_acc + e0 + 8 * c, a[l][c]);
    }
  };
  for (; e + 8 * C <= hd; e += 8 * C) pass.template operator()<C>(e);
  for (; e + 8 <= hd; e += 8) pass.template operator()<1>(e);
#endif
  for (; e < hd; ++e)
    for (int64_t g = 0; g < b.group; ++g)
      for (int64_t i = std::max(b.i0, j0); i < b.i1; ++i)
        for (int l = 0; l < L; ++l)
          if (i >= j0 + l) {
            float& a = acc[l * ld_acc + e];
            a = std::fma(coef[b.coef_at(g, i) + j0 + l], b.row(g, i)[e], a);
          }
}

}  // namespace

using detail::dots_transposed_lanes;
using detail::fma_rows_lanes;
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
  std::vector<float> dp(static_cast<size_t>(detail::kMaxLanes * ldt));
  for (int64_t i0 = 0; i0 < t; i0 += qb) {
    const int64_t i1 = std::min(t, i0 + qb);
    // Per query, the group's heads a few at a time: their dots and dq rows share the K, V loads.
    for (int64_t i = i0; i < i1; ++i) {
      detail::for_lane_chunks(group, [&]<int L>(int64_t g0) {
        const float *qi[L], *doi[L], *dsl[L];
        float *p[L], *ds[L], *dpl[L], *dqi[L];
        for (int l = 0; l < L; ++l) {
          const int64_t g = g0 + l, h = kh * group + g;
          qi[l] = q + i * ldq + h * hd;
          doi[l] = d_out + (i * heads + h) * hd;
          p[l] = pb.data() + (g * qb + (i - i0)) * t;
          ds[l] = dsb.data() + (g * qb + (i - i0)) * t;
          dsl[l] = ds[l];
          dpl[l] = dp.data() + l * ldt;
          dqi[l] = dq + i * ldq + h * hd;
        }
        if (simd) {
          dots_transposed_lanes<L>(qi, kt.data(), ldt, hd, i + 1, p);
          dots_transposed_lanes<L>(doi, vt.data(), ldt, hd, i + 1, dpl);
        } else {
          for (int l = 0; l < L; ++l)
            for (int64_t j = 0; j <= i; ++j) {
              p[l][j] = detail::dot(qi[l], k_rows[j], hd);
              dpl[l][j] = detail::dot(doi[l], v + j * ldkv + kh * hd, hd);
            }
        }
        for (int l = 0; l < L; ++l) {
          float* pr = p[l];
          const float* dpr = dpl[l];
          float mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            pr[j] = pr[j] * scale;
            mx = std::max(mx, pr[j]);
          }
          float sum = 0.0f;
          detail::exp_shifted(pr, mx, i + 1, pr);
          for (int64_t j = 0; j <= i; ++j) sum = sum + pr[j];
          // D = Σ p·dp, with dp_j = d_out · v_j.
          float dsum = 0.0f;
          for (int64_t j = 0; j <= i; ++j) {
            pr[j] = pr[j] / sum;
            dsum = std::fma(pr[j], dpr[j], dsum);
          }
          for (int64_t j = 0; j <= i; ++j) ds[l][j] = pr[j] * (dpr[j] - dsum) * scale;
          std::fill(dqi[l], dqi[l] + hd, 0.0f);
        }
        fma_rows_lanes<L>(dsl, k_rows.data(), i + 1, hd, dqi);
      });
    }
    // dk_j and dv_j over the block's (head, query) pairs that see key j (queries i >= j), a few
    // keys at a time sharing the loads of the q and d_out rows.
    const BlockRows qr{q + kh * group * hd, hd, ldq, group, qb, t, i0, i1};
    const BlockRows dor{d_out + kh * group * hd, hd, heads * hd, group, qb, t, i0, i1};
    detail::for_lane_chunks(i1, [&]<int L>(int64_t j0) {
      key_lanes<L>(dsb.data(), qr, j0, hd, dk + j0 * ldkv + kh * hd, ldkv);
      key_lanes<L>(pb.data(), dor, j0, hd, dv + j0 * ldkv + kh * hd, ldkv);
    });
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
