// The backward of the shared model's dense kernels as device functors (device_kernels.h's
// conventions): each item follows the CPU backward's scalar code (src/kernels/backward.cc,
// attention_backward.cc, src/model/model_backward.cc) operation for operation, so the device
// trainer's gradients carry the CPU trainer's bits.
#pragma once

#include "device/device_kernels.h"

namespace miles::device {

// Rows of a row-wise kernel: row r at base + (r / per_token) * ld_token + (r % per_token) * width
// (a plain [T, width] matrix: per_token 1; the heads of qkv rows: per_token heads, width head_dim).
struct Rows {
  int64_t ld_token, per_token, width;
  MILES_HD int64_t at(int64_t r) const {
    return (r / per_token) * ld_token + (r % per_token) * width;
  }
};

// d W[n, k] = Σ_m dy[m, n] x[m, k] over the M rows by the contract (chunk gemm_chunk(M)), written
// (not added) to up to three destinations split by rows: rows [0, end[0]) to dst[0], [end[0],
// end[1]) to dst[1], ... (the fused q/k/v or gate/up gradients go to their named tensors).
// Items: N * K.
struct WeightGradKernel {
  const float* dy;
  int64_t ldy;
  const float* x;
  int64_t ldx, m, n, k, chunk;
  float* dst[3];
  int64_t end[3];
  // Rows through a list (an expert's slots, ascending): reduction row j reads dy row
  // rows[j] / dy_div and x row rows[j] / x_div; null: row j itself.
  const int32_t* rows = nullptr;
  int64_t dy_div = 1, x_div = 1;
  MILES_HD void operator()(int64_t i) const {
    const int64_t row = i / k, col = i % k;
    const float* dyc = dy + row;
    const float* xc = x + col;
    const int64_t a = ldy, b = ldx;
    const int32_t* list = rows;
    const int64_t da = dy_div, xa = x_div;
    const float v = chunked_dot(
        m, chunk, [dyc, a, list, da](int64_t j) { return dyc[(list ? list[j] / da : j) * a]; },
        [xc, b, list, xa](int64_t j) { return xc[(list ? list[j] / xa : j) * b]; });
    int part = 0;
    while (row >= end[part]) ++part;
    const int64_t first = part == 0 ? 0 : end[part - 1];
    dst[part][(row - first) * k + col] = v;
  }
};

// RMSNorm backward, phase 1: inv[r] = 1 / sqrt(Σ x² / d + eps) of each row. Items: rows.
struct RmsInvKernel {
  const float* x;
  Rows rows;
  float eps;
  float* inv;
  MILES_HD void operator()(int64_t r) const {
    const float* xr = x + rows.at(r);
    const auto v = [xr](int64_t i) { return xr[i]; };
    const float sum_sq = chunked_dot(rows.width, kChunk, v, v);
    inv[r] = 1.0f / sqrt_f(sum_sq / static_cast<float>(rows.width) + eps);
  }
};

// Phase 2: dw[i] = dw[i] + dy[r, i] · (x[r, i] · inv[r]) for rows r ascending. Items: width.
struct RmsWeightGradKernel {
  const float* x;
  const float* dy;
  Rows rows;
  int64_t num_rows;
  const float* inv;
  float* dw;
  MILES_HD void operator()(int64_t i) const {
    float acc = dw[i];
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t o = rows.at(r);
      acc = acc + dy[o + i] * (x[o + i] * inv[r]);
    }
    dw[i] = acc;
  }
};

// Phase 3: dx = inv · gw − x · (Σ gw·x) · inv³ / d with gw = dy · weight, per row (dx may alias
// dy). Items: rows.
struct RmsDxKernel {
  const float* x;
  const float* dy;
  Rows rows;
  const float* weight;
  const float* inv;
  float* dx;
  MILES_HD void operator()(int64_t r) const {
    const int64_t o = rows.at(r), d = rows.width;
    const float* xr = x + o;
    const float* dyr = dy + o;
    const float* w = weight;
    const float dot_gx = chunked_dot(
        d, kChunk, [dyr, w](int64_t i) { return dyr[i] * w[i]; },
        [xr](int64_t i) { return xr[i]; });
    const float s = inv[r];
    const float coef = dot_gx * s * s * s / static_cast<float>(d);
    float* dxr = dx + o;
    for (int64_t i = 0; i < d; ++i) {
      const float gw = dyr[i] * w[i];
      dxr[i] = gw * s - xr[i] * coef;
    }
  }
};

// kernels::swiglu_backward: from the forward's gate/up rows [T][2 f] and d act [T][f], d gate and
// d up into dgu [T][2 f]. Items: T * f.
struct SwigluBackwardKernel {
  const float* gate_up;
  const float* da;
  int64_t f;
  float* dgu;
  MILES_HD void operator()(int64_t i) const {
    const int64_t r = i / f, j = i % f;
    const float g = gate_up[r * 2 * f + j], u = gate_up[r * 2 * f + f + j], a = da[i];
    const float den = 1.0f + exp_f32(-g);
    const float sig = 1.0f / den;
    const float silu = g / den;
    dgu[r * 2 * f + f + j] = a * silu;
    dgu[r * 2 * f + j] = (a * u) * (sig * (1.0f + g * (1.0f - sig)));
  }
};

// kernels::geglu_backward, the same layout as SwigluBackwardKernel. Items: T * f.
struct GegluBackwardKernel {
  const float* gate_up;
  const float* da;
  int64_t f;
  float* dgu;
  MILES_HD void operator()(int64_t i) const {
    const int64_t r = i / f, j = i % f;
    const float g = gate_up[r * 2 * f + j], u = gate_up[r * 2 * f + f + j], a = da[i];
    dgu[r * 2 * f + f + j] = a * gelu_tanh_f(g);
    dgu[r * 2 * f + j] = (a * u) * gelu_tanh_grad_f(g);
  }
};

// x[i] = x[i] · s (the scaled embedding's row gradients). Items: n.
struct ScaleKernel {
  float* x;
  float s;
  MILES_HD void operator()(int64_t i) const { x[i] = x[i] * s; }
};

// out[j] = out[j] + Σ_r x[r, j] in ascending rows (bias gradients). Items: n.
struct ColumnSumKernel {
  const float* x;
  int64_t m, ld;
  float* out;
  MILES_HD void operator()(int64_t j) const {
    float acc = out[j];
    for (int64_t r = 0; r < m; ++r) acc = acc + x[r * ld + j];
    out[j] = acc;
  }
};

// The embedding's gradient: de[token_i, e] += dh[i, e] for tokens i ascending. Items: d.
struct EmbedBackwardKernel {
  const int32_t* tokens;
  int64_t t, d;
  const float* dh;
  float* de;
  int64_t pad = -1;  // ModelConfig::pad_token_id: its lookups add nothing
  MILES_HD void operator()(int64_t e) const {
    for (int64_t i = 0; i < t; ++i) {
      if (tokens[i] == pad) continue;
      float& v = de[static_cast<int64_t>(tokens[i]) * d + e];
      v = v + dh[i * d + e];
    }
  }
};

// One sequence's causal attention backward, phase 1 (block_phase1 in attention_backward.cc): for
// query i and head h, the probabilities p_ij (recomputed, two-pass softmax), dS_ij = p_ij (dp_ij −
// Σ p dp) · scale, kept in p[h][i][j] and ds[h][i][j] (j <= i), and dq_i. Items: every sequence's
// (head, query) pairs, item = seq_item0[s] + h * n_s + i.
struct AttnBackwardRowsKernel {
  const float* qkv;  // the forward's rows after q/k norm and RoPE, stride ld
  int64_t ld, q_dim, kv_dim, heads, kv_heads, head_dim;
  const float* d_out;  // [T][heads * head_dim]
  float scale;
  int64_t window;  // > 0: keys before i − window + 1 score −inf (p = ds = 0)
  int64_t num_seqs;
  const int64_t* seq_first;  // [S]: first token
  const int64_t* seq_len;    // [S]
  const int64_t* seq_item0;  // [S]: first item
  const int64_t* seq_pbase;  // [S]: offset of the sequence's p / ds ([heads][n][n])
  float* p;
  float* ds;
  float* dqkv;  // d q written at row stride ld
  MILES_HD void operator()(int64_t item) const {
    int64_t s = 0;
    while (s + 1 < num_seqs && item >= seq_item0[s + 1]) ++s;
    const int64_t n = seq_len[s], local = item - seq_item0[s];
    const int64_t h = local / n, i = local % n, hd = head_dim;
    const int64_t kh = h / (heads / kv_heads), off = seq_first[s];
    const float* qi = qkv + (off + i) * ld + h * hd;
    const float* doi = d_out + (off + i) * heads * hd + h * hd;
    float* pr = p + seq_pbase[s] + (h * n + i) * n;
    float* dr = ds + seq_pbase[s] + (h * n + i) * n;
    float mx = -inf_f();
    for (int64_t j = 0; j <= i; ++j) {
      const float* kj = qkv + (off + j) * ld + q_dim + kh * hd;
      const float sc = chunked_dot(
          hd, kChunk, [qi](int64_t e) { return qi[e]; }, [kj](int64_t e) { return kj[e]; });
      pr[j] = window > 0 && j < i - window + 1 ? -inf_f() : sc * scale;
      mx = max_f(mx, pr[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j <= i; ++j) pr[j] = exp_f32(pr[j] - mx);
    for (int64_t j = 0; j <= i; ++j) sum = sum + pr[j];
    float dsum = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      const float* vj = qkv + (off + j) * ld + q_dim + kv_dim + kh * hd;
      dr[j] = chunked_dot(
          hd, kChunk, [doi](int64_t e) { return doi[e]; }, [vj](int64_t e) { return vj[e]; });
      pr[j] = pr[j] / sum;
      dsum = fma_f(pr[j], dr[j], dsum);
    }
    for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dsum) * scale;
    float* dq = dqkv + (off + i) * ld + h * hd;
    for (int64_t e = 0; e < hd; ++e) {
      float acc = 0.0f;
      for (int64_t j = 0; j <= i; ++j)
        acc = fma_f(dr[j], qkv[(off + j) * ld + q_dim + kh * hd + e], acc);
      dq[e] = acc;
    }
  }
};

// Phase 2: dk_j and dv_j of kv head kh, element e: Σ over query blocks of kQueryBlock (ascending),
// the group's heads (ascending), queries i >= j of the block (ascending), of dS_ij q_i (dk) and
// p_ij d_out_i (dv), fma from 0. Items: item = seq_item0[s] + (kh * n_s + j) * head_dim + e.
struct AttnBackwardKvKernel {
  const float* qkv;
  int64_t ld, q_dim, kv_dim, heads, kv_heads, head_dim;
  const float* d_out;
  int64_t num_seqs;
  const int64_t* seq_first;
  const int64_t* seq_len;
  const int64_t* seq_item0;
  const int64_t* seq_pbase;
  const float* p;
  const float* ds;
  float* dqkv;
  static constexpr int64_t kQueryBlock = 64;
  MILES_HD void operator()(int64_t item) const {
    int64_t s = 0;
    while (s + 1 < num_seqs && item >= seq_item0[s + 1]) ++s;
    const int64_t n = seq_len[s], local = item - seq_item0[s];
    const int64_t hd = head_dim, e = local % hd, j = (local / hd) % n, kh = local / (hd * n);
    const int64_t group = heads / kv_heads, off = seq_first[s];
    const int64_t qb = n < kQueryBlock ? n : kQueryBlock;
    const float* pb = p + seq_pbase[s];
    const float* db = ds + seq_pbase[s];
    float dk = 0.0f, dv = 0.0f;
    for (int64_t i0 = 0; i0 < n; i0 += qb) {
      const int64_t i1 = i0 + qb < n ? i0 + qb : n;
      if (j >= i1) continue;
      const int64_t first = i0 > j ? i0 : j;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kh * group + g;
        for (int64_t i = first; i < i1; ++i)
          dk = fma_f(db[(h * n + i) * n + j], qkv[(off + i) * ld + h * hd + e], dk);
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kh * group + g;
        for (int64_t i = first; i < i1; ++i)
          dv = fma_f(pb[(h * n + i) * n + j], d_out[(off + i) * heads * hd + h * hd + e], dv);
      }
    }
    float* row = dqkv + (off + j) * ld;
    row[q_dim + kh * hd + e] = dk;
    row[q_dim + kv_dim + kh * hd + e] = dv;
  }
};

// MoE backward, the gates: dw[s] = dh[token(s)] · y[s] (kernels::detail::dot), per routed slot.
// Items: T * k.
struct MoeGateGradKernel {
  const float* dh;
  const float* y;
  int64_t k, d;
  float* dw;
  MILES_HD void operator()(int64_t s) const {
    const float* a = dh + (s / k) * d;
    const float* b = y + s * d;
    dw[s] = chunked_dot(
        d, kChunk, [a](int64_t i) { return a[i]; }, [b](int64_t i) { return b[i]; });
  }
};

// dy[s, i] = dh[token(s), i] · weight[s]: the expert output's gradient. Items: T * k * d.
struct MoeDyKernel {
  const float* dh;
  const float* weights;
  int64_t k, d;
  float* dy;
  MILES_HD void operator()(int64_t i) const {
    const int64_t s = i / d, e = i % d;
    dy[i] = dh[(s / k) * d + e] * weights[s];
  }
};

// The router's softmax backward through the gate weights (renormalised when configured), per
// token, as model_backward.cc's: dz [T, E]. Items: T.
struct RouterBackwardKernel {
  const float* probs;
  const int32_t* ids;
  const float* weights;
  const float* dw;  // [T, k] d loss / d gate weight
  int64_t e, k;
  bool norm_topk;
  float* dz;
  // GLM-4 MoE (probs: the sigmoid scores): model_backward.cc's sigmoid_router_grad.
  bool sigmoid = false;
  float scale = 1.0f;
  MILES_HD void operator()(int64_t t) const {
    if (sigmoid) return sigmoid_backward(t);
    const float* p = probs + t * e;
    const int32_t* id = ids + t * k;
    const float* w = weights + t * k;
    const float* g = dw + t * k;
    float sum = 0.0f, gw = 0.0f;
    if (norm_topk) {
      for (int64_t j = 0; j < k; ++j) sum = sum + p[id[j]];
      for (int64_t j = 0; j < k; ++j) gw = fma_f(g[j], w[j], gw);
    }
    auto dp = [&](int64_t x) {
      for (int64_t j = 0; j < k; ++j)
        if (id[j] == x) return norm_topk ? (g[j] - gw) / sum : g[j];
      return 0.0f;
    };
    float pd = 0.0f;
    for (int64_t x = 0; x < e; ++x) pd = fma_f(p[x], dp(x), pd);
    for (int64_t x = 0; x < e; ++x) dz[t * e + x] = p[x] * (dp(x) - pd);
  }
  MILES_HD void sigmoid_backward(int64_t t) const {
    const float* s = probs + t * e;
    const int32_t* id = ids + t * k;
    const float* w = weights + t * k;
    const float* g = dw + t * k;
    for (int64_t x = 0; x < e; ++x) dz[t * e + x] = 0.0f;
    float sum = 0.0f, gw = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum = sum + s[id[j]];
    sum = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) gw = fma_f(g[j], w[j], gw);
    for (int64_t j = 0; j < k; ++j) {
      const float ds = norm_topk ? (scale * g[j] - gw) / sum : scale * g[j];
      const float sj = s[id[j]];
      dz[t * e + id[j]] = ds * (sj * (1.0f - sj));
    }
  }
};

// x[row, h * stride + j] = 0 for j < width: the rotary part of MLA's latent outputs' gradient.
// Items: rows * heads * width, with ld = heads * stride.
struct ZeroColumnsKernel {
  float* x;
  int64_t ld, stride, width;
  MILES_HD void operator()(int64_t i) const {
    const int64_t per = ld / stride * width, row = i / per, e = i % per;
    x[row * ld + (e / width) * stride + e % width] = 0.0f;
  }
};

// MLA's d q rotary parts back in their places (mla_qkv_backward): dq[t, h, nope + src(j)] =
// dqkv[t, h * hd + j]. Items: T * heads * r.
struct MlaRopeGradKernel {
  const float* dqkv;
  int64_t ld, hd, heads, nope, r;
  bool interleave;
  float* dq;
  MILES_HD void operator()(int64_t i) const {
    const int64_t tok = i / (heads * r), e = i % (heads * r), h = e / r, j = e % r;
    dq[(tok * heads + h) * (nope + r) + nope + mla_rope_source(j, r, interleave)] =
        dqkv[tok * ld + h * hd + j];
  }
};

// MLA's latent gradients (mla_qkv_backward): dc[t, j] = d k[r + j] + d v[r + j], and d k_pe into
// the a-projection's gradient rows at dpe[t * ldpe + src(j)] = d k[j]. dk: the key's row (the
// value's follows it). Items: T * (kl + r).
struct MlaLatentGradKernel {
  const float* dk;
  int64_t ld, r, kl;
  bool interleave;
  float* dc;
  float* dpe;
  int64_t ldpe;
  MILES_HD void operator()(int64_t i) const {
    const int64_t tok = i / (kl + r), e = i % (kl + r);
    const float* k = dk + tok * ld;
    if (e < kl) {
      dc[tok * kl + e] = k[r + e] + k[r + kl + r + e];
      return;
    }
    const int64_t j = e - kl;
    dpe[tok * ldpe + mla_rope_source(j, r, interleave)] = k[j];
  }
};

// y[i] = 0. Items: n.
struct ZeroKernel {
  float* y;
  MILES_HD void operator()(int64_t i) const { y[i] = 0.0f; }
};

// Rows of x [R, d] to rows `rows[r]` of y (GatherRowsKernel's inverse). Items: R * d.
struct ScatterRowsKernel {
  const float* x;
  const int32_t* rows;
  int64_t d;
  float* y;
  MILES_HD void operator()(int64_t i) const {
    y[static_cast<int64_t>(rows[i / d]) * d + i % d] = x[i];
  }
};

}  // namespace miles::device
