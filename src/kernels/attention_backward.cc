// Backward of causal attention (backward.h) per (sequence, kv head), in blocks of kQueryBlock
// queries. Phase 1 of every block of a window of blocks runs first (one work item per block), then
// phase 2 over runs of keys (one work item per run), so the work spreads over more threads than
// there are kv heads; a window holds as many blocks' P and dS as kMaxKeptFloats allows, and at
// least one block per thread (the memory one (sequence, kv head) item per thread used to hold).
//
// Phase 1, per query head h of the group and query i of the block: the scores p_ij = q_i · k_j are
// the contract's dot (one fma chain over the head dimension from 0, for head_dim <= kGemmChunk),
// eight keys' chains side by side in SIMD lanes over a transposed copy of K (and V for
// dp_j = d_out_i · v_j), so every lane performs exactly kernels::detail::dot's chain; softmax
// (two-pass, exp_f32; keys before a sliding window score −inf, so their p and ds are exactly 0 and
// they add nothing below); ds_ij = p_ij (dp_ij − Σ_j p dp) · scale; dq_i = Σ_j ds_ij k_j (ascending
// j, accumulated in registers). P and dS of the block are kept. The group's heads go a few at a
// time (attention_lanes.h), sharing the loads of K, V and the k rows; each head's operations are as
// above.
// Phase 2, per key j up to the block's last query: dk_j += Σ ds_ij q_i and dv_j += Σ p_ij d_out_i
// over the block's (head, query) pairs in ascending (head, query) order, accumulated in registers,
// four keys at a time sharing the loads of the q and d_out rows (key_lanes; on AVX-512 with a head
// dimension of 16–64, key_lanes_avx512 holds the four keys' whole rows in registers, the same
// chains); a key's blocks are
// taken in ascending order (within a window by its run's item, windows one after another).
// So dk / dv sum over (query block, head, query) in that order; every sum's order is fixed by the
// sequence alone (not the thread count, the batch or the layout).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_avx512.h"
#include "kernels/attention_lanes.h"
#include "kernels/attention_simd.h"
#include "miles/backward_kernels.h"
#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "miles/thread_pool.h"

namespace miles::kernels {

using detail::BlockRows;

namespace {
constexpr int64_t kQueryBlock = 64;  // queries whose P and dS are held at once

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

namespace {

// One (sequence, kv head): its K and V transposed for the lanes, its k rows, and where its
// sequence's rows are.
struct HeadWork {
  const AttentionSeq* seq;
  int64_t kh;
  std::vector<float> kt, vt;
  std::vector<const float*> k_rows;
};

// The shape every (sequence, kv head) shares.
struct Shape {
  int64_t ldq, ldkv, heads, kv_heads, hd, group;
  float scale;
  int64_t window;  // > 0: query i sees keys i − window + 1 .. i (the others score −inf: p = 0)
  bool simd;    // one chain per dot (head_dim <= kGemmChunk); longer heads take the scalar dot
  bool avx512;  // dq and phase 2 by the AVX-512 row sums (the same bits, rows in zmm registers)
};

void prepare(const Shape& sh, HeadWork& w) {
  const AttentionSeq& s = *w.seq;
  const int64_t t = s.t, hd = sh.hd, kh = w.kh;
  for (int64_t i = 0; i < t; ++i) {
    detail::zero_row(s.dk + i * sh.ldkv + kh * hd, hd);
    detail::zero_row(s.dv + i * sh.ldkv + kh * hd, hd);
  }
  const int64_t ldt = (t + 7) / 8 * 8;
  if (sh.simd) {
    transpose_rows(s.k + kh * hd, sh.ldkv, t, hd, ldt, w.kt);
    transpose_rows(s.v + kh * hd, sh.ldkv, t, hd, ldt, w.vt);
  }
  w.k_rows.resize(static_cast<size_t>(t));
  for (int64_t j = 0; j < t; ++j) w.k_rows[j] = s.k + j * sh.ldkv + kh * hd;
}

// Phase 1 of queries [i0, i1) (a block of kQueryBlock): P and dS into pb / dsb ([head of the
// group][query of the block][key]) and the dq rows of the group's heads.
void block_phase1(const Shape& sh, const HeadWork& w, int64_t i0, int64_t i1, float* pb,
                  float* dsb) {
  const AttentionSeq& s = *w.seq;
  const int64_t t = s.t, hd = sh.hd, kh = w.kh, group = sh.group, qb = kQueryBlock;
  const int64_t ldt = (t + 7) / 8 * 8;
  thread_local std::vector<float> dp;
  if (dp.size() < static_cast<size_t>(detail::kMaxLanes * ldt)) dp.resize(detail::kMaxLanes * ldt);
  // Per query, the group's heads a few at a time: their dots and dq rows share the K, V loads.
  for (int64_t i = i0; i < i1; ++i) {
    detail::for_lane_chunks(group, [&]<int L>(int64_t g0) {
      const float *qi[L], *doi[L], *dsl[L];
      float *p[L], *ds[L], *dpl[L], *dqi[L];
      for (int l = 0; l < L; ++l) {
        const int64_t g = g0 + l, h = kh * group + g;
        qi[l] = s.q + i * sh.ldq + h * hd;
        doi[l] = s.d_out + (i * sh.heads + h) * hd;
        p[l] = pb + (g * qb + (i - i0)) * t;
        ds[l] = dsb + (g * qb + (i - i0)) * t;
        dsl[l] = ds[l];
        dpl[l] = dp.data() + l * ldt;
        dqi[l] = s.dq + i * sh.ldq + h * hd;
      }
      if (sh.simd) {
        dots_transposed_lanes<L>(qi, w.kt.data(), ldt, hd, i + 1, p);
        dots_transposed_lanes<L>(doi, w.vt.data(), ldt, hd, i + 1, dpl);
      } else {
        for (int l = 0; l < L; ++l)
          for (int64_t j = 0; j <= i; ++j) {
            p[l][j] = detail::dot(qi[l], w.k_rows[j], hd);
            dpl[l][j] = detail::dot(doi[l], s.v + j * sh.ldkv + kh * hd, hd);
          }
      }
      // The softmax and D = Σ p·dp (dp_j = d_out · v_j) of the group's heads side by side: each
      // head's chains keep their own order; interleaving them only overlaps their latencies.
      float mx[L], sum[L], dsum[L];
      for (int l = 0; l < L; ++l) {
        mx[l] = -INFINITY;
        sum[l] = 0.0f;
        dsum[l] = 0.0f;
      }
      // Element-wise steps a row at a time in vector lanes (scale, max, exp, divide); the sums'
      // chains over j side by side.
      const int64_t masked = sh.window > 0 ? std::max<int64_t>(0, i - sh.window + 1) : 0;
      for (int l = 0; l < L; ++l) {
        detail::scale_row(sh.scale, p[l], i + 1);
        for (int64_t j = 0; j < masked; ++j) p[l][j] = -INFINITY;
        mx[l] = detail::max_of(p[l], i + 1);  // std::max from -inf in ascending j
        detail::exp_shifted(p[l], mx[l], i + 1, p[l]);
      }
      // Unrolled over the lanes, so that the chains live in registers (a loop over l kept them
      // on the stack: a store and a reload in every step of every chain).
      for (int64_t j = 0; j <= i; ++j) {
        MILES_UNROLL
        for (int l = 0; l < L; ++l) sum[l] = sum[l] + p[l][j];
      }
      for (int l = 0; l < L; ++l) detail::divide_row(p[l], sum[l], p[l], i + 1);
      for (int64_t j = 0; j <= i; ++j) {
        MILES_UNROLL
        for (int l = 0; l < L; ++l) dsum[l] = std::fma(p[l][j], dpl[l][j], dsum[l]);
      }
      for (int l = 0; l < L; ++l) {
        detail::softmax_grad_row(p[l], dpl[l], dsum[l], sh.scale, ds[l], i + 1);
        detail::zero_row(dqi[l], hd);
      }
      if (sh.avx512) {
        detail::fma_rows_avx512(L, dsl, w.k_rows.data(), i + 1, hd, dqi);
      } else {
        fma_rows_lanes<L>(dsl, w.k_rows.data(), i + 1, hd, dqi);
      }
    });
  }
}

// Phase 2 of queries [i0, i1) for keys [j0, j1): dk_j and dv_j over the block's (head, query)
// pairs that see key j (queries i >= j), a few keys at a time sharing the loads of the q and d_out
// rows.
void block_phase2(const Shape& sh, const HeadWork& w, int64_t i0, int64_t i1, const float* pb,
                  const float* dsb, int64_t j0, int64_t j1) {
  const AttentionSeq& s = *w.seq;
  const int64_t t = s.t, hd = sh.hd, kh = w.kh, group = sh.group, qb = kQueryBlock;
  j1 = std::min(j1, i1);
  if (j0 >= j1) return;
  const BlockRows qr{s.q + kh * group * hd, hd, sh.ldq, group, qb, t, i0, i1};
  const BlockRows dor{s.d_out + kh * group * hd, hd, sh.heads * hd, group, qb, t, i0, i1};
  detail::for_lane_chunks(j1 - j0, [&]<int L>(int64_t c) {
    const int64_t j = j0 + c;
    float* dk = s.dk + j * sh.ldkv + kh * hd;
    float* dv = s.dv + j * sh.ldkv + kh * hd;
    if (sh.avx512) {
      detail::key_lanes_avx512(L, dsb, qr, j, hd, dk, sh.ldkv);
      detail::key_lanes_avx512(L, pb, dor, j, hd, dv, sh.ldkv);
    } else {
      key_lanes<L>(dsb, qr, j, hd, dk, sh.ldkv);
      key_lanes<L>(pb, dor, j, hd, dv, sh.ldkv);
    }
  });
}

// P and dS kept at once, at most (floats): windows of query blocks are sized to it.
constexpr int64_t kMaxKeptFloats = int64_t{1} << 23;  // 32 MB
constexpr int64_t kKeyRun = 64;                       // keys per phase-2 work item

}  // namespace

void attention_backward_batch(std::span<const AttentionSeq> seqs, int64_t ldq, int64_t ldkv,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                              ThreadPool* pool, int64_t window) {
  MILES_CHECK(heads % kv_heads == 0 && window >= 0);
  const Shape sh{ldq,
                 ldkv,
                 heads,
                 kv_heads,
                 head_dim,
                 heads / kv_heads,
                 scale,
                 window,
                 head_dim <= kGemmChunk,
                 detect_isa() == Isa::kAvx512 && detail::attention_avx512_fits(head_dim)};
  std::vector<HeadWork> work;
  for (const AttentionSeq& s : seqs)
    for (int64_t kh = 0; kh < kv_heads && s.t > 0; ++kh) work.push_back({&s, kh, {}, {}, {}});
  parallel_for(pool, work.size(), [&](int64_t w) { prepare(sh, work[w]); });
  // Every (sequence, kv head, query block), in order; windows of them whose P and dS fit in
  // kMaxKeptFloats run phase 1 for all their blocks, then phase 2 for all their keys.
  struct Block {
    int64_t w, i0, i1;
    int64_t kept;  // offset of its P (dS follows) in the window's storage
  };
  std::vector<Block> blocks;
  for (int64_t w = 0; w < static_cast<int64_t>(work.size()); ++w)
    for (int64_t i0 = 0; i0 < work[w].seq->t; i0 += kQueryBlock)
      blocks.push_back({w, i0, std::min(work[w].seq->t, i0 + kQueryBlock), 0});
  // Every P / dS element phase 2 reads, phase 1 wrote first: the storage grows only and is never
  // cleared (it was a 5 MB zero-fill per call for SmolLM2).
  thread_local std::vector<float> kept;
  const int64_t threads = pool ? pool->num_threads() : 1;
  for (size_t b0 = 0; b0 < blocks.size();) {
    size_t b1 = b0;
    int64_t floats = 0;
    while (b1 < blocks.size()) {
      const int64_t need = 2 * sh.group * kQueryBlock * work[blocks[b1].w].seq->t;
      const int64_t budget = std::max(kMaxKeptFloats, threads * need);
      if (b1 > b0 && floats + need > budget) break;
      blocks[b1++].kept = floats;
      floats += need;
    }
    if (kept.size() < static_cast<size_t>(floats)) kept.resize(floats);
    float* const store = kept.data();  // this thread's buffer, for the pool's threads too
    // Phase 1: one item per block, the longest (latest) blocks first.
    const int64_t nb = static_cast<int64_t>(b1 - b0);
    parallel_for(pool, nb, [&](int64_t x) {
      const Block& b = blocks[b1 - 1 - x];
      const int64_t t = work[b.w].seq->t;
      float* pb = store + b.kept;
      block_phase1(sh, work[b.w], b.i0, b.i1, pb, pb + sh.group * kQueryBlock * t);
    });
    // Phase 2: one item per (sequence, kv head, run of keys); each key sums the window's blocks
    // in ascending order, as a single pass over the blocks would.
    std::vector<std::pair<size_t, int64_t>> runs;  // (first block of the head, first key)
    for (size_t b = b0; b < b1; ++b) {
      if (b != b0 && blocks[b].w == blocks[b - 1].w) continue;
      int64_t end = 0;
      for (size_t c = b; c < b1 && blocks[c].w == blocks[b].w; ++c) end = blocks[c].i1;
      for (int64_t j = 0; j < end; j += kKeyRun) runs.emplace_back(b, j);
    }
    parallel_for(pool, runs.size(), [&](int64_t r) {
      const auto [first, j0] = runs[r];
      for (size_t c = first; c < b1 && blocks[c].w == blocks[first].w; ++c) {
        const Block& b = blocks[c];
        const int64_t t = work[b.w].seq->t;
        const float* pb = store + b.kept;
        block_phase2(sh, work[b.w], b.i0, b.i1, pb, pb + sh.group * kQueryBlock * t, j0,
                     j0 + kKeyRun);
      }
    });
    b0 = b1;
  }
}

void attention_backward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldkv,
                        const float* d_out, int64_t t, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, float scale, float* dq, float* dk, float* dv,
                        int64_t window) {
  const AttentionSeq s{q, k, v, d_out, dq, dk, dv, t};
  attention_backward_batch({&s, 1}, ldq, ldkv, heads, kv_heads, head_dim, scale, nullptr, window);
}

}  // namespace miles::kernels
