// Causal attention with GQA: online softmax over key blocks of kAttnBlock positions from position
// 0, ascending. A query at position p sees keys 0..p in the same blocks however it was batched
// (prefill, chunked prefill or decode), so its output bits depend only on the sequence. With a
// sliding window W a query sees keys p − W + 1 .. p: the blocks wholly before them are skipped and
// the keys before them in the first block scored −inf (exp gives exactly 0).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention_avx512.h"
#include "kernels/attention_lanes.h"
#include "kernels/attention_simd.h"
#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles::kernels {

namespace {

// A sequence's cache blocks in the layout of kernels.h (KvSpan): per block, keys
// [kv_heads][head_dim][block_tokens], values [kv_heads][block_tokens][head_dim].
struct KvReader {
  const KvSpan& kv;
  int64_t hd;
  // Element e of key `pos` (head kh) is at key_column(pos, kh)[e * block_tokens].
  const float* key_column(int64_t pos, int64_t kh) const {
    const int64_t bt = kv.block_tokens;
    return kv.k_blocks[pos / bt] + kh * hd * bt + pos % bt;
  }
  const float* value(int64_t pos, int64_t kh) const {
    const int64_t bt = kv.block_tokens;
    return kv.v_blocks[pos / bt] + (kh * bt + pos % bt) * hd;
  }
};

// One key block of kAttnBlock positions of one KV head, ready to be scored: its keys as segments
// of 8 transposed columns (straight from the cache when the cache's blocks hold whole segments,
// else gathered), or as rows for head dimensions past one chunk (the scalar dot); its value rows.
struct KeyBlock {
  const float* seg[kAttnBlock / 8];
  int64_t ld[kAttnBlock / 8];
  const float* values[kAttnBlock];
  std::vector<float> gathered;  // [head_dim][kAttnBlock] or [kAttnBlock][head_dim]

  void load(const KvReader& kv, int64_t kh, int64_t b0, int64_t n, bool simd) {
    const int64_t hd = kv.hd, bt = kv.kv.block_tokens;
    for (int64_t j = 0; j < n; ++j) values[j] = kv.value(b0 + j, kh);
    if (simd && bt % 8 == 0) {  // segments start at multiples of 8: each inside one block
      for (int64_t s = 0; s * 8 < n; ++s) {
        seg[s] = kv.key_column(b0 + 8 * s, kh);
        ld[s] = bt;
      }
      return;
    }
    gathered.assign(static_cast<size_t>(hd * kAttnBlock), 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float* col = kv.key_column(b0 + j, kh);
      for (int64_t e = 0; e < hd; ++e)
        gathered[simd ? e * kAttnBlock + j : j * hd + e] = col[e * bt];
    }
    for (int64_t s = 0; s * 8 < n; ++s) {
      seg[s] = gathered.data() + 8 * s;
      ld[s] = kAttnBlock;
    }
  }
  const float* key_row(int64_t j, int64_t hd) const { return gathered.data() + j * hd; }
};

// Per KV head, per key block: every query of the call that sees the block, and each of its query
// heads that share this KV head, scores the block's keys side by side (dots_segments: each lane the
// contract's dot) and updates its own online softmax exactly as the scalar code does, block after
// block: scores scaled, the block max, the running state rescaled, p = exp(score - max) added to
// the denominator and p · v to the accumulator in ascending key order. A query's bits depend only
// on its q, its position and the keys: not on the other queries of the call.
struct SoftmaxState {
  std::vector<float> max, denom, acc;  // per (query, head of the group); acc: [.. ][head_dim]
};

// The first key a query at `last` sees: 0, or with a sliding window the window's first.
int64_t first_key(int64_t last, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
}

void attend_kv_head(const float* q, int64_t ldq, int64_t t, int64_t heads, int64_t group,
                    int64_t hd, int64_t kh, const int32_t* positions, int64_t window,
                    const KvReader& kv, float scale, float* out, int64_t ldo, SoftmaxState& st,
                    KeyBlock& kb) {
  const bool simd = hd <= kGemmChunk;  // one chain per dot; longer heads take the scalar dot
  // p · v rows by the AVX-512 row sums where they fit (the same fma chains: the same bits).
  const bool wide_rows = detect_isa() == Isa::kAvx512 && detail::attention_avx512_fits(hd);
  const int64_t lanes = t * group;
  st.max.assign(static_cast<size_t>(lanes), -INFINITY);
  st.denom.assign(static_cast<size_t>(lanes), 0.0f);
  st.acc.assign(static_cast<size_t>(lanes * hd), 0.0f);
  int64_t last_all = 0, first_all = INT64_MAX;
  for (int64_t i = 0; i < t; ++i) {
    last_all = std::max<int64_t>(last_all, positions[i]);
    first_all = std::min(first_all, first_key(positions[i], window));
  }
  float scores[detail::kMaxLanes][kAttnBlock], p[detail::kMaxLanes][kAttnBlock];
  for (int64_t b0 = first_all / kAttnBlock * kAttnBlock; b0 <= last_all; b0 += kAttnBlock) {
    kb.load(kv, kh, b0, std::min<int64_t>(kAttnBlock, last_all + 1 - b0), simd);
    for (int64_t i = 0; i < t; ++i) {
      const int64_t last = positions[i], first = first_key(last, window);
      if (last < b0 || first >= b0 + kAttnBlock) continue;
      const int64_t n = std::min<int64_t>(kAttnBlock, last + 1 - b0);
      const int64_t masked = std::max<int64_t>(0, first - b0);  // keys before the window
      // The group's heads a few at a time: their dots and p·v rows share the key and value loads.
      detail::for_lane_chunks(group, [&]<int L>(int64_t g0) {
        const float* qg[L];
        float* sc[L];
        const float* pl[L];
        float* accl[L];
        for (int l = 0; l < L; ++l) {
          qg[l] = q + i * ldq + (kh * group + g0 + l) * hd;
          sc[l] = scores[l];
          pl[l] = p[l];
          accl[l] = st.acc.data() + (i * group + g0 + l) * hd;
        }
        if (simd) {
          detail::dots_segments_lanes<L>(qg, kb.seg, kb.ld, hd, n, sc);
        } else {
          for (int l = 0; l < L; ++l)
            for (int64_t j = 0; j < n; ++j) sc[l][j] = detail::dot(qg[l], kb.key_row(j, hd), hd);
        }
        // Scaling is element-wise and max_of is std::max from -inf in ascending j: in vector
        // lanes, the bits of a scalar loop.
        float block_max[L], den[L];
        for (int l = 0; l < L; ++l) {
          detail::scale_row(scale, sc[l], n);
          for (int64_t j = 0; j < masked; ++j) sc[l][j] = -INFINITY;
          block_max[l] = detail::max_of(sc[l], n);
        }
        for (int l = 0; l < L; ++l) {
          const int64_t lane = i * group + g0 + l;
          float& running_max = st.max[lane];
          const float new_max = std::max(running_max, block_max[l]);
          const float alpha =
              std::isinf(running_max) ? 0.0f : detail::exp_f32(running_max - new_max);
          den[l] = st.denom[lane] * alpha;
          detail::scale_row(alpha, accl[l], hd);
          detail::exp_shifted(sc[l], new_max, n, p[l]);
          running_max = new_max;
        }
        // The group's heads' chains side by side (each keeps its own order; interleaving them
        // only overlaps their latencies).
        for (int64_t j = 0; j < n; ++j) {
          MILES_UNROLL  // the chains in registers (a loop over l kept them on the stack)
              for (int l = 0; l < L; ++l) den[l] = den[l] + p[l][j];
        }
        for (int l = 0; l < L; ++l) st.denom[i * group + g0 + l] = den[l];
        if (wide_rows) {
          detail::fma_rows_avx512(L, pl, kb.values, n, hd, accl);
        } else {
          detail::fma_rows_lanes<L>(pl, kb.values, n, hd, accl);
        }
      });
    }
  }
  for (int64_t i = 0; i < t; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t lane = i * group + g;
      float* o = out + i * ldo + (kh * group + g) * hd;
      detail::divide_row(st.acc.data() + lane * hd, st.denom[lane], o, hd);
    }
}

}  // namespace

void attention(const float* q, int64_t ldq, int64_t t, int64_t heads, int64_t kv_heads,
               int64_t head_dim, const int32_t* positions, const KvSpan& kv, float scale,
               float* out, int64_t ldo, int64_t window) {
  MILES_CHECK(heads % kv_heads == 0 && kv.block_tokens > 0 && window >= 0);
  MILES_CHECK(ldq >= heads * head_dim && ldo >= heads * head_dim);
  for (int64_t i = 0; i < t; ++i)
    MILES_CHECK(positions[i] >= 0 &&
                positions[i] < static_cast<int64_t>(kv.k_blocks.size()) * kv.block_tokens);
  if (t <= 0) return;
  const KvReader reader{kv, head_dim};
  thread_local SoftmaxState st;
  thread_local KeyBlock kb;
  for (int64_t kh = 0; kh < kv_heads; ++kh)
    attend_kv_head(q, ldq, t, heads, heads / kv_heads, head_dim, kh, positions, window, reader,
                   scale, out, ldo, st, kb);
}

void kv_block_store(const float* k, const float* v, int64_t slot, int64_t block_tokens,
                    int64_t kv_heads, int64_t head_dim, float* k_block, float* v_block) {
  MILES_CHECK(slot >= 0 && slot < block_tokens);
  for (int64_t kh = 0; kh < kv_heads; ++kh) {
    const float* kr = k + kh * head_dim;
    float* kc = k_block + kh * head_dim * block_tokens + slot;
    for (int64_t e = 0; e < head_dim; ++e) kc[e * block_tokens] = kr[e];
    std::copy_n(v + kh * head_dim, head_dim, v_block + (kh * block_tokens + slot) * head_dim);
  }
}

void attention(const float* q, int64_t t, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const int32_t* positions, const KvSpan& kv, float scale, float* out,
               int64_t window) {
  attention(q, heads * head_dim, t, heads, kv_heads, head_dim, positions, kv, scale, out,
            heads * head_dim, window);
}

}  // namespace miles::kernels
