// The shared model's forward kernels as device functors: `k(i)` computes work item i of n, touching
// only its own outputs, so a backend may run the items in any order or all at once (a CUDA grid,
// or a host loop that emulates one). Each item follows the CPU kernel's scalar code operation for
// operation (device_math.h), so its outputs carry the CPU kernels' bits.
//
// Layouts: activations row-major [T, width] with a row stride; weights in the CPU's packed form
// (kernels::PackedMatrix: panels of kPanel output columns, each [K][kPanel]); the KV pool per
// layer and block as kernels::KvSpan: keys [kv_heads][head_dim][block_tokens], values
// [kv_heads][block_tokens][head_dim].
#pragma once

#include "device/device_math.h"

namespace miles::device {

inline constexpr int64_t kPanel = kernels::kPanel;

// out[t, :] = table[ids[t], :]. Items: T * d.
struct EmbedKernel {
  const float* table;
  const int32_t* ids;
  int64_t d;
  float* out;
  MILES_HD void operator()(int64_t i) const {
    const int64_t t = i / d, e = i % d;
    out[i] = table[static_cast<int64_t>(ids[t]) * d + e];
  }
};

// kernels::rmsnorm of rows of d values (row r at x + r * ldx, written to out + r * ldo; may alias),
// weight[d]. Items: rows.
struct RmsnormKernel {
  const float* x;
  int64_t ldx;
  const float* weight;
  int64_t d;
  float eps;
  float* out;
  int64_t ldo;
  MILES_HD void operator()(int64_t r) const {
    const float* xr = x + r * ldx;
    float* yr = out + r * ldo;
    const auto v = [xr](int64_t k) { return xr[k]; };
    const float sum_sq = chunked_dot(d, kChunk, v, v);
    const float inv = 1.0f / sqrt_f(sum_sq / static_cast<float>(d) + eps);
    for (int64_t k = 0; k < d; ++k) yr[k] = (xr[k] * inv) * weight[k];
  }
};

// kernels::gemm: y[r, c] = Σ_k x[r, k] · W[c, k] by the contract, W packed (panels of kPanel
// columns, [K][kPanel] each). Items: M * num_panels * kPanel, panel-major, then row, then lane:
// kPanel adjacent items are adjacent columns of one row (they read adjacent floats of a panel and
// one x row), and the rows of one panel follow each other, so a panel is reused from cache by every
// row instead of the whole matrix streaming past between two rows. Lanes past N do nothing.
struct GemmKernel {
  const float* x;
  int64_t lda;
  const float* w;  // num_panels * K * kPanel
  int64_t m, n, k, chunk;
  float* y;
  int64_t ldy;
  static int64_t items(int64_t m, int64_t n) { return m * ((n + kPanel - 1) / kPanel) * kPanel; }
  MILES_HD void operator()(int64_t i) const {
    const int64_t lane = i % kPanel, rest = i / kPanel;
    const int64_t r = rest % m, c = (rest / m) * kPanel + lane;
    if (c >= n) return;
    const float* xr = x + r * lda;
    const float* wc = w + (c / kPanel) * k * kPanel + c % kPanel;
    y[r * ldy + c] = chunked_dot(
        k, chunk, [xr](int64_t j) { return xr[j]; }, [wc](int64_t j) { return wc[j * kPanel]; });
  }
};

// y[r, c] = y[r, c] + bias[c]. Items: rows * n.
struct AddBiasKernel {
  float* y;
  int64_t n, ldy;
  const float* bias;
  MILES_HD void operator()(int64_t i) const {
    float& v = y[(i / n) * ldy + i % n];
    v = v + bias[i % n];
  }
};

// h[i] = h[i] + y[i]. Items: T * d.
struct AddKernel {
  float* h;
  const float* y;
  MILES_HD void operator()(int64_t i) const { h[i] = h[i] + y[i]; }
};

// Per token and head of the fused qkv rows: Qwen3's q/k RMSNorm (when q_norm is set), then RoPE
// with the host's cos / sin of this token ([T][rotary_dim / 2] each, already times
// attention_scaling). Items: T * (heads + kv_heads).
struct QkNormRopeKernel {
  float* qkv;
  int64_t ld, heads, kv_heads, head_dim, half;
  const float* q_norm;  // null: no q/k norm
  const float* k_norm;
  float eps;
  const float* cos_t;
  const float* sin_t;
  MILES_HD void operator()(int64_t i) const {
    const int64_t per = heads + kv_heads;
    const int64_t t = i / per, h = i % per;
    const bool is_k = h >= heads;
    float* v = qkv + t * ld + (is_k ? heads * head_dim + (h - heads) * head_dim : h * head_dim);
    if (q_norm != nullptr) RmsnormKernel{v, 0, is_k ? k_norm : q_norm, head_dim, eps, v, 0}(0);
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int64_t j = 0; j < half; ++j) {
      const float a = v[j], b = v[j + half];
      v[j] = a * c[j] - b * s[j];
      v[j + half] = b * c[j] + a * s[j];
    }
  }
};

// Where token t's keys and values go: kernels::kv_block_store into block slot_block[t] of each
// layer at slot pos % block_tokens. Items: T * kv_dim.
struct KvStoreKernel {
  const float* qkv;
  int64_t ld, q_dim, kv_dim, head_dim, block_tokens;
  const int32_t* positions;
  const int32_t* block_of;  // [T]: the block holding token t's position
  float* k_layer;           // this layer's keys: [num_blocks][kv_dim * block_tokens]
  float* v_layer;
  MILES_HD void operator()(int64_t i) const {
    const int64_t t = i / kv_dim, e = i % kv_dim;
    const int64_t kh = e / head_dim, x = e % head_dim;
    const int64_t slot = positions[t] % block_tokens;
    const int64_t base = static_cast<int64_t>(block_of[t]) * kv_dim * block_tokens;
    const float* row = qkv + t * ld + q_dim;
    k_layer[base + (kh * head_dim + x) * block_tokens + slot] = row[e];
    v_layer[base + (kh * block_tokens + slot) * head_dim + x] = row[kv_dim + e];
  }
};

// kernels::attention for one (token, head): causal over keys 0..positions[t] of the token's
// sequence (or the sliding window's), online softmax over blocks of kAttnBlock positions from 0,
// ascending, exactly as the CPU's per-query code. Items: T * heads.
struct AttentionKernel {
  const float* qkv;
  int64_t ld, heads, kv_heads, head_dim, block_tokens, kv_dim;
  const int32_t* positions;
  const int32_t* table_of;  // [T]: offset of the token's sequence's block table in `tables`
  const int32_t* tables;
  const float* k_layer;
  const float* v_layer;
  float scale;
  float* out;
  int64_t ldo;
  int64_t window;  // > 0: keys last − window + 1 .. last (blocks before skipped, keys −inf)
  MILES_HD void operator()(int64_t i) const {
    const int64_t t = i / heads, h = i % heads;
    const int64_t kh = h / (heads / kv_heads);
    const float* q = qkv + t * ld + h * head_dim;
    const int32_t* table = tables + table_of[t];
    const int64_t last = positions[t];
    const int64_t first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const int64_t bt = block_tokens, hd = head_dim;
    float acc[kMaxHeadDim];
    for (int64_t e = 0; e < hd; ++e) acc[e] = 0.0f;
    float running_max = -inf_f(), denom = 0.0f;
    float scores[kAttnBlock];
    const float* vrow[kAttnBlock];
    for (int64_t b0 = first / kAttnBlock * kAttnBlock; b0 <= last; b0 += kAttnBlock) {
      const int64_t n = last + 1 - b0 < kAttnBlock ? last + 1 - b0 : kAttnBlock;
      float block_max = -inf_f();
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = b0 + j;
        const int64_t base = static_cast<int64_t>(table[pos / bt]) * kv_dim * bt;
        const float* kc = k_layer + base + kh * hd * bt + pos % bt;  // element e at kc[e * bt]
        vrow[j] = v_layer + base + (kh * bt + pos % bt) * hd;
        const float s = chunked_dot(
            hd, kChunk, [q](int64_t e) { return q[e]; },
            [kc, bt](int64_t e) { return kc[e * bt]; });
        scores[j] = pos < first ? -inf_f() : s * scale;
        block_max = max_f(block_max, scores[j]);
      }
      const float new_max = max_f(running_max, block_max);
      const float alpha = is_inf(running_max) ? 0.0f : exp_f32(running_max - new_max);
      denom = denom * alpha;
      for (int64_t e = 0; e < hd; ++e) acc[e] = acc[e] * alpha;
      for (int64_t j = 0; j < n; ++j) scores[j] = exp_f32(scores[j] - new_max);
      for (int64_t j = 0; j < n; ++j) denom = denom + scores[j];
      for (int64_t j = 0; j < n; ++j)
        for (int64_t e = 0; e < hd; ++e) acc[e] = fma_f(scores[j], vrow[j][e], acc[e]);
      running_max = new_max;
    }
    float* o = out + t * ldo + h * hd;
    for (int64_t e = 0; e < hd; ++e) o[e] = acc[e] / denom;
  }
};

// kernels::swiglu: out[r, j] = (g / (1 + exp(-g))) · u with g = gu[r, j], u = gu[r, f + j].
// Items: rows * f.
struct SwigluKernel {
  const float* gate_up;  // [rows][2 f]
  int64_t f;
  float* out;  // [rows][f]
  MILES_HD void operator()(int64_t i) const {
    const int64_t r = i / f, j = i % f;
    const float g = gate_up[r * 2 * f + j], u = gate_up[r * 2 * f + f + j];
    out[i] = (g / (1.0f + exp_f32(-g))) * u;
  }
};

// kernels::geglu: out[r, j] = gelu_tanh(g) · u (gelu_tanh_f: geglu.cc's operations). Items: rows *
// f.
struct GegluKernel {
  const float* gate_up;  // [rows][2 f]
  int64_t f;
  float* out;  // [rows][f]
  MILES_HD void operator()(int64_t i) const {
    const int64_t r = i / f, j = i % f;
    out[i] = gelu_tanh_f(gate_up[r * 2 * f + j]) * gate_up[r * 2 * f + f + j];
  }
};

// Qwen3-MoE routing of one token (moe.cc's route): the router's logits [T, E] turned into its
// softmax in place (kernels::softmax_row), then the top-k (kernels::topk: larger first, NaN never
// wins, ties to the lower id) or the forced ids of routing replay with their probabilities, the
// weights renormalised when configured; ids and weights [T, k] out, and into the [T, moe_layers, k]
// record when asked. Items: T.
struct RouteKernel {
  float* probs;
  int64_t e, k;
  const int32_t* forced;  // [T, forced_stride] rows (this layer's offset applied) or null
  int64_t forced_stride;
  bool norm_topk;
  int32_t* ids;
  float* weights;
  int32_t* record_ids;  // + t * record_stride, or null
  float* record_weights;
  int64_t record_stride;
  // GLM-4 MoE's grouped sigmoid routing (moe.cc's route_sigmoid) when bias is set.
  const float* bias = nullptr;
  int64_t n_group = 1, topk_group = 1;
  float scale = 1.0f;
  MILES_HD void operator()(int64_t t) const {
    if (bias != nullptr) return sigmoid_route(t);
    float* p = probs + t * e;
    float m = -inf_f();
    for (int64_t x = 0; x < e; ++x) m = max_f(m, p[x]);
    for (int64_t x = 0; x < e; ++x) p[x] = exp_f32(p[x] - m);
    const float s = chunked_sum(e, kChunk, [p](int64_t x) { return p[x]; });
    for (int64_t x = 0; x < e; ++x) p[x] = p[x] / s;
    int32_t* id = ids + t * k;
    float* w = weights + t * k;
    for (int64_t j = 0; j < k; ++j) {
      if (forced != nullptr) {
        id[j] = forced[t * forced_stride + j];
      } else {  // the best not yet taken, by topk's order
        int64_t best = -1;
        for (int64_t x = 0; x < e; ++x) {
          bool taken = false;
          for (int64_t q = 0; q < j; ++q) taken = taken || id[q] == x;
          if (taken) continue;
          if (best < 0 || before(p, x, best)) best = x;
        }
        id[j] = static_cast<int32_t>(best);
      }
      w[j] = p[id[j]];
    }
    if (norm_topk) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum = sum + w[j];
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / sum;
    }
    if (record_ids != nullptr)
      for (int64_t j = 0; j < k; ++j) {
        record_ids[t * record_stride + j] = id[j];
        record_weights[t * record_stride + j] = w[j];
      }
  }
  // route_sigmoid's steps: sigmoid scores; unless replayed, the groups whose score (the sum of
  // their two best biased scores) ranks among the best topk_group, then the top k of the biased
  // scores in those groups, each chosen as kernels::topk orders them; weights renormalised (+
  // 1e-20) when configured, times scale.
  MILES_HD void sigmoid_route(int64_t t) const {
    float* p = probs + t * e;
    for (int64_t x = 0; x < e; ++x) p[x] = 1.0f / (1.0f + exp_f32(-p[x]));
    int32_t* id = ids + t * k;
    float* w = weights + t * k;
    const int64_t per = e / n_group;
    auto choice = [&](int64_t x) { return p[x] + bias[x]; };
    auto group_score = [&](int64_t g) {
      int64_t a = -1, b = -1;  // the best two of the group, by topk's order
      for (int64_t x = g * per; x < (g + 1) * per; ++x) {
        if (a < 0 || first(choice(x), choice(a), x, a)) {
          b = a;
          a = x;
        } else if (b < 0 || first(choice(x), choice(b), x, b)) {
          b = x;
        }
      }
      return choice(a) + choice(b);
    };
    auto kept = [&](int64_t g) {  // ranks among the best topk_group groups
      const float sg = group_score(g);
      int64_t ahead = 0;
      for (int64_t h = 0; h < n_group; ++h)
        if (h != g && first(group_score(h), sg, h, g)) ++ahead;
      return ahead < topk_group;
    };
    auto masked = [&](int64_t x) { return kept(x / per) ? choice(x) : -inf_f(); };
    for (int64_t j = 0; j < k; ++j) {
      if (forced != nullptr) {
        id[j] = forced[t * forced_stride + j];
      } else {
        int64_t best = -1;
        float best_v = 0.0f;
        for (int64_t x = 0; x < e; ++x) {
          bool taken = false;
          for (int64_t q = 0; q < j; ++q) taken = taken || id[q] == x;
          if (taken) continue;
          const float v = masked(x);
          if (best < 0 || first(v, best_v, x, best)) {
            best = x;
            best_v = v;
          }
        }
        id[j] = static_cast<int32_t>(best);
      }
      w[j] = p[id[j]];
    }
    if (norm_topk) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum = sum + w[j];
      sum = sum + 1e-20f;
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / sum;
    }
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] * scale;
    if (record_ids != nullptr)
      for (int64_t j = 0; j < k; ++j) {
        record_ids[t * record_stride + j] = id[j];
        record_weights[t * record_stride + j] = w[j];
      }
  }
  // kernels::topk's order of values va (index a) and vb (index b): a before b.
  MILES_HD static bool first(float va, float vb, int64_t a, int64_t b) {
    if (va > vb) return true;
    if (va < vb) return false;
    if (is_nan(va) != is_nan(vb)) return is_nan(vb);
    return a < b;
  }
  // kernels::topk's order: a before b.
  MILES_HD static bool before(const float* p, int64_t a, int64_t b) {
    const float va = p[a], vb = p[b];
    if (va > vb) return true;
    if (va < vb) return false;
    if (is_nan(va) != is_nan(vb)) return is_nan(vb);
    return a < b;
  }
};

// One GEMM per routed slot (slot s = token · k + j, expert ids[s]): y[s, c] = Σ x[row(s)] ·
// W_e[c] by the contract, with W_e the expert's packed matrix (experts stored one after another,
// `expert_floats` apart) and row(s) = s / row_div (the token's normed row for gate/up: row_div =
// k; the slot's own activation row for down: 1). A row's bits do not depend on which other rows
// the expert has, so this equals the CPU's per-expert GEMM over its gathered rows. Items as
// GemmKernel's, over the slots.
struct ExpertGemmKernel {
  const float* x;
  int64_t lda, row_div;
  const int32_t* ids;
  const float* w;
  int64_t expert_floats, m, n, k, chunk;
  float* y;
  int64_t ldy;
  MILES_HD void operator()(int64_t i) const {
    const int64_t lane = i % kPanel, rest = i / kPanel;
    const int64_t s = rest % m, c = (rest / m) * kPanel + lane;
    if (c >= n) return;
    const float* xr = x + (s / row_div) * lda;
    const float* wc =
        w + static_cast<int64_t>(ids[s]) * expert_floats + (c / kPanel) * k * kPanel + c % kPanel;
    y[s * ldy + c] = chunked_dot(
        k, chunk, [xr](int64_t j) { return xr[j]; }, [wc](int64_t j) { return wc[j * kPanel]; });
  }
};

// out[t, d] = Σ over the token's slots in ascending expert id of y[slot, d] · weight[slot]
// (moe_block's sum, from 0). Items: T * hidden.
struct MoeCombineKernel {
  const float* y;
  const int32_t* ids;
  const float* weights;
  int64_t k, d;
  float* out;
  const float* shared = nullptr;  // [T, d] added after the routed sum (GLM-4 MoE), or null
  MILES_HD void operator()(int64_t i) const {
    const int64_t t = i / d, e = i % d;
    const int32_t* id = ids + t * k;
    float o = 0.0f;
    int32_t last = -1;
    for (int64_t n = 0; n < k; ++n) {  // the next larger id each time (ids of a token differ)
      int64_t j = -1;
      for (int64_t q = 0; q < k; ++q)
        if (id[q] > last && (j < 0 || id[q] < id[j])) j = q;
      last = id[j];
      // No weights (the backward's d x sum): y · 1 is y exactly, so this is the plain sum.
      o = o + y[(t * k + j) * d + e] * (weights ? weights[t * k + j] : 1.0f);
    }
    if (shared != nullptr) o = o + shared[i];
    out[i] = o;
  }
};

// MLA's q/k/v rows before RoPE (mla.cc's mla_qkv), all but each head's absorbed latent query:
// head h's q_pe (de-interleaved where `interleave`), the key [k_pe, c] and the value [0, c]. Items:
// T * (heads * r + 2 (r + kl)).
struct MlaAssembleKernel {
  const float* q;  // [T, heads * (nope + r)] rows, stride qld
  int64_t qld;
  const float* a;  // the a-projection's rows (stride wa); k_pe at kv_at + kl
  int64_t wa, kv_at;
  const float* lat;  // [T, kl] the normed latent
  int64_t heads, nope, r, kl;
  bool interleave;
  float* qkv;
  MILES_HD int64_t src(int64_t j) const { return mla_rope_source(j, r, interleave); }
  MILES_HD void operator()(int64_t i) const {
    const int64_t hd = r + kl, qd = heads * hd, per = heads * r + 2 * hd;
    const int64_t tok = i / per, e = i % per;
    float* row = qkv + tok * (qd + 2 * hd);
    if (e < heads * r) {
      const int64_t h = e / r, j = e % r;
      row[h * hd + j] = q[tok * qld + h * (nope + r) + nope + src(j)];
      return;
    }
    const int64_t k = e - heads * r;
    if (k < r) {
      row[qd + k] = a[tok * wa + kv_at + kl + src(k)];
    } else if (k < hd) {
      row[qd + k] = lat[tok * kl + k - r];
    } else {
      row[qd + k] = k - hd < r ? 0.0f : lat[tok * kl + k - hd - r];
    }
  }
};

// dst[r, j] = src[r, j] for j < width, row strides lds and ldd. Items: rows * width.
struct StridedCopyKernel {
  const float* src;
  int64_t lds;
  float* dst;
  int64_t ldd, width;
  MILES_HD void operator()(int64_t i) const {
    dst[(i / width) * ldd + i % width] = src[(i / width) * lds + i % width];
  }
};

// dst[i] = src[i]. Items: n.
struct CopyKernel {
  const float* src;
  float* dst;
  MILES_HD void operator()(int64_t i) const { dst[i] = src[i]; }
};

// The packed form of Wᵀ from the packed W [N, K] (PackedMatrix::transpose_into, on the device):
// wt holds ceil(K / kPanel) panels of [N][kPanel]; element (c, j) = W(j, c), zero past K. Items:
// ceil(K / kPanel) * kPanel * N, in wt's order.
struct TransposePackKernel {
  const float* w;
  int64_t n, k;
  float* wt;
  MILES_HD void operator()(int64_t i) const {
    const int64_t lane = i % kPanel, j = (i / kPanel) % n, c = (i / kPanel / n) * kPanel + lane;
    wt[i] = c < k ? w[(j / kPanel) * k * kPanel + c * kPanel + j % kPanel] : 0.0f;
  }
};

// TransposePackKernel for `count` matrices stored one after another (a MoE layer's experts):
// matrix e's pack at w + e * per, its transposed pack at wt + e * per_t. Items: count * per_t.
struct ExpertTransposeKernel {
  const float* w;
  int64_t n, k, per, per_t;
  float* wt;
  MILES_HD void operator()(int64_t i) const {
    const int64_t e = i / per_t;
    TransposePackKernel{w + e * per, n, k, wt + e * per_t}(i % per_t);
  }
};

// out[r, :] = h[rows[r], :]. Items: R * d.
struct GatherRowsKernel {
  const float* h;
  const int32_t* rows;
  int64_t d;
  float* out;
  MILES_HD void operator()(int64_t i) const {
    out[i] = h[static_cast<int64_t>(rows[i / d]) * d + i % d];
  }
};

// A GRPO sibling's partial prompt block: every layer's keys and values of block src copied to dst
// (the whole block, as BlockPool::copy_prefix). Items: layers * block_floats.
struct CopyBlockKernel {
  float* k_pool;
  float* v_pool;
  int64_t num_blocks, block_floats;
  int32_t src, dst;
  MILES_HD void operator()(int64_t i) const {
    const int64_t layer = i / block_floats, e = i % block_floats;
    const int64_t from = (layer * num_blocks + src) * block_floats + e;
    const int64_t to = (layer * num_blocks + dst) * block_floats + e;
    k_pool[to] = k_pool[from];
    v_pool[to] = v_pool[from];
  }
};

}  // namespace miles::device
