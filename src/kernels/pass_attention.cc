// Attention of a draft head's training-time test pass (backward_kernels.h, PassAttentionSeq): per
// query row, its visible keys and values of each kv head are gathered into a contiguous block in
// position order, then each query head of the group scores them (dot_rows: the contract's dot),
// softmaxes them and sums the values. A row is one work item; the backward recomputes the row's
// probabilities and writes that row's dq and its own key's dk / dv, and with d_earlier adds into
// the earlier keys' dk / dv, one work item per sequence and kv head then (its rows ascending).
#include <algorithm>
#include <vector>

#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "kernels/unroll.h"
#include "miles/backward_kernels.h"
#include "miles/check.h"
#include "miles/thread_pool.h"

namespace miles::kernels {

namespace {

struct Shape {
  int64_t ld, heads, kv_heads, hd, window;
  float scale;
  int64_t qd() const { return heads * hd; }
  int64_t kvd() const { return kv_heads * hd; }
};

// The qkv rows query row i of `s` sees (position order): pass 1's lo .. i − p + 1, pass q's
// i − p + q (1 < q < p) from lo on, then its own; with d_earlier, each earlier row's d qkv row in
// `drows` (null for the own row).
void visible_rows(const PassAttentionSeq& s, int64_t i, int64_t window,
                  std::vector<const float*>& rows, std::vector<float*>& drows, const Shape& sh) {
  rows.clear();
  drows.clear();
  const bool send = !s.d_earlier.empty();
  const int64_t p = static_cast<int64_t>(s.earlier.size()) + 1;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
  const auto see = [&](int64_t q, int64_t r) {  // pass q's row r (q ≥ 1)
    rows.push_back(s.earlier[q - 1] + r * sh.ld);
    if (send) drows.push_back(s.d_earlier[q - 1] + r * sh.ld);
  };
  for (int64_t r = lo; r <= i - p + 1; ++r) see(1, r);
  for (int64_t q = 2; q < p; ++q) {
    const int64_t r = i - p + q;
    if (r >= lo) see(q, r);
  }
  rows.push_back(s.qkv + i * sh.ld);
  if (send) drows.push_back(nullptr);
}

// Scores of 8 keys at a time: each key's chain q[0]·k[0], then fma over e ascending, side by side
// in the lanes of a transposed block ([hd][8], zero-padded), which is detail::dot's chain for
// head_dim <= kGemmChunk (one chunk); wider heads take dot_rows.
constexpr int64_t kLanes = 8;

void transpose_blocks(const float* rows, int64_t n, int64_t hd, std::vector<float>& t) {
  const int64_t blocks = (n + kLanes - 1) / kLanes;
  t.assign(static_cast<size_t>(blocks * hd * kLanes), 0.0f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = 0; e < hd; ++e)
      t[((j / kLanes) * hd + e) * kLanes + j % kLanes] = rows[j * hd + e];
}

void dots(const float* q, const float* rows, const std::vector<float>& t, int64_t n, int64_t hd,
          float* out) {
  if (hd > kGemmChunk) return detail::dot_rows(q, 0, rows, hd, n, hd, out);
  for (int64_t b = 0; b * kLanes < n; ++b) {
    float acc[kLanes] = {};
    const float* blk = t.data() + b * hd * kLanes;
    for (int64_t e = 0; e < hd; ++e) {
      MILES_UNROLL
      for (int64_t l = 0; l < kLanes; ++l) acc[l] = std::fma(q[e], blk[e * kLanes + l], acc[l]);
    }
    std::copy_n(acc, std::min(kLanes, n - b * kLanes), out + b * kLanes);
  }
}

// One row's keys and values of kv head g, and each query head's probabilities over them.
struct RowScratch {
  std::vector<const float*> rows;
  std::vector<float*> drows;
  std::vector<float> k, v, kt, vt, p, dp;

  void gather(int64_t g, const Shape& sh, bool values_transposed) {
    const int64_t n = rows.size(), hd = sh.hd;
    k.resize(static_cast<size_t>(n * hd));
    v.resize(static_cast<size_t>(n * hd));
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(rows[j] + sh.qd() + g * hd, hd, k.data() + j * hd);
      std::copy_n(rows[j] + sh.qd() + sh.kvd() + g * hd, hd, v.data() + j * hd);
    }
    transpose_blocks(k.data(), n, hd, kt);
    if (values_transposed) transpose_blocks(v.data(), n, hd, vt);
  }
  // p = softmax(q · k_j · scale) over the gathered keys.
  void probs(const float* q, const Shape& sh) {
    const int64_t n = rows.size();
    p.resize(static_cast<size_t>(n));
    dots(q, k.data(), kt, n, sh.hd, p.data());
    for (float& x : p) x *= sh.scale;
    const float m = detail::max_of(p.data(), n);
    float sum = 0.0f;
    for (float& x : p) {
      x = detail::exp_f32(x - m);
      sum += x;
    }
    const float inv = 1.0f / sum;
    for (float& x : p) x *= inv;
  }
};

// row(seq, i, g, scratch) for every query row i and kv head g: one work item per row (all its kv
// heads), or with `by_head` one per sequence and kv head (its rows ascending).
template <typename Row>
void each_row(std::span<const PassAttentionSeq> seqs, const Shape& sh, bool by_head,
              ThreadPool* pool, Row row) {
  std::vector<std::pair<int64_t, int64_t>> items;  // (sequence, row) or (sequence, kv head)
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t i = 0; i < (by_head ? sh.kv_heads : seqs[s].t); ++i) items.emplace_back(s, i);
  int64_t keys = 0;  // Σ over rows of the keys each sees, about
  for (const PassAttentionSeq& s : seqs) keys += s.t * (s.t + 1) / 2;
  const int64_t per_item =
      items.empty() ? 0 : keys * (by_head ? 1 : sh.kv_heads) / static_cast<int64_t>(items.size());
  const auto item = [&](const PassAttentionSeq& s, int64_t x, RowScratch& r) {
    const int64_t rows_begin = by_head ? 0 : x, rows_end = by_head ? s.t : x + 1;
    const int64_t g_begin = by_head ? x : 0, g_end = by_head ? x + 1 : sh.kv_heads;
    for (int64_t i = rows_begin; i < rows_end; ++i) {
      visible_rows(s, i, sh.window, r.rows, r.drows, sh);
      for (int64_t g = g_begin; g < g_end; ++g) row(s, i, g, r);
    }
  };
  const int64_t cost = 4 * (per_item + 1) * sh.qd() / sh.kv_heads;
  parallel_ranges(pool, items.size(), cost, [&](int64_t a, int64_t b) {
    RowScratch r;
    for (int64_t it = a; it < b; ++it) item(seqs[items[it].first], items[it].second, r);
  });
}

}  // namespace

void pass_attention(std::span<const PassAttentionSeq> seqs, int64_t ld, int64_t heads,
                    int64_t kv_heads, int64_t head_dim, float scale, int64_t window,
                    ThreadPool* pool) {
  const Shape sh{ld, heads, kv_heads, head_dim, window, scale};
  const int64_t group = heads / kv_heads, hd = head_dim;
  each_row(seqs, sh, false, pool,
           [&](const PassAttentionSeq& s, int64_t i, int64_t g, RowScratch& r) {
             const int64_t n = r.rows.size();
             r.gather(g, sh, false);
             for (int64_t h = g * group; h < (g + 1) * group; ++h) {
               r.probs(s.qkv + i * ld + h * hd, sh);
               float* o = s.out + i * sh.qd() + h * hd;
               std::fill_n(o, hd, 0.0f);
               for (int64_t j = 0; j < n; ++j)
                 for (int64_t e = 0; e < hd; ++e) o[e] = std::fma(r.p[j], r.v[j * hd + e], o[e]);
             }
           });
}

void pass_attention_backward(std::span<const PassAttentionSeq> seqs, int64_t ld, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, float scale, int64_t window,
                             ThreadPool* pool) {
  const Shape sh{ld, heads, kv_heads, head_dim, window, scale};
  const int64_t group = heads / kv_heads, hd = head_dim;
  const bool send = !seqs.empty() && !seqs[0].d_earlier.empty();
  for (const PassAttentionSeq& s : seqs)
    MILES_CHECK(s.d_earlier.empty() != send && (!send || s.d_earlier.size() == s.earlier.size()),
                "pass attention: d_earlier for every sequence's earlier passes or for none");
  each_row(seqs, sh, send, pool,
           [&](const PassAttentionSeq& s, int64_t i, int64_t g, RowScratch& r) {
             const int64_t n = r.rows.size(), own = n - 1;
             float* drow = s.dqkv + i * ld;
             r.gather(g, sh, true);
             float* dk = drow + sh.qd() + g * hd;
             float* dv = drow + sh.qd() + sh.kvd() + g * hd;
             std::fill_n(dk, hd, 0.0f);
             std::fill_n(dv, hd, 0.0f);
             for (int64_t h = g * group; h < (g + 1) * group; ++h) {
               const float* q = s.qkv + i * ld + h * hd;
               const float* dout = s.d_out + i * sh.qd() + h * hd;
               r.probs(q, sh);
               r.dp.resize(static_cast<size_t>(n));
               dots(dout, r.v.data(), r.vt, n, hd, r.dp.data());
               float d = 0.0f;
               for (int64_t j = 0; j < n; ++j) d = std::fma(r.p[j], r.dp[j], d);
               float* dq = drow + h * hd;
               std::fill_n(dq, hd, 0.0f);
               for (int64_t j = 0; j < n; ++j) {
                 const float ds = r.p[j] * (r.dp[j] - d) * scale;
                 for (int64_t e = 0; e < hd; ++e) dq[e] = std::fma(ds, r.k[j * hd + e], dq[e]);
                 float* kj = j == own ? dk : send ? r.drows[j] + sh.qd() + g * hd : nullptr;
                 if (!kj) continue;  // an earlier pass's key, a constant
                 float* vj = kj + sh.kvd();
                 for (int64_t e = 0; e < hd; ++e) {
                   kj[e] = std::fma(ds, q[e], kj[e]);
                   vj[e] = std::fma(r.p[j], dout[e], vj[e]);
                 }
               }
             }
           });
}

}  // namespace miles::kernels
