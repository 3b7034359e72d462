// Causal attention with GQA: online softmax over key blocks of kAttnBlock positions from position
// 0, ascending. A query at position p sees keys 0..p in the same blocks however it was batched
// (prefill, chunked prefill or decode), so its output bits depend only on the sequence.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_simd.h"
#include "kernels/reduce.h"
#include "miles/kernels.h"

namespace miles::kernels {

namespace {

struct KvReader {
  const KvSpan& kv;
  int64_t row;  // floats per position: kv_heads * head_dim
  const float* key(int64_t pos) const {
    return kv.k_blocks[pos / kv.block_tokens] + (pos % kv.block_tokens) * row;
  }
  const float* value(int64_t pos) const {
    return kv.v_blocks[pos / kv.block_tokens] + (pos % kv.block_tokens) * row;
  }
};

// Per KV head, per key block: the block's keys are transposed once ([head_dim][kAttnBlock],
// zero-padded), then every query of the call that sees the block, and each of its query heads that
// share this KV head, scores the block's keys side by side (dots_transposed: each lane the
// contract's dot) and updates its own online softmax exactly as the scalar code does, block after
// block. A query's bits depend only on its q, its position and the keys: not on the other queries
// of the call.
struct SoftmaxState {
  std::vector<float> max, denom, acc;  // per (query, head of the group); acc: [.. ][head_dim]
};

void attend_kv_head(const float* q, int64_t ldq, int64_t t, int64_t heads, int64_t group,
                    int64_t hd, int64_t kh, const int32_t* positions, const KvReader& kv,
                    float scale, float* out, int64_t ldo, SoftmaxState& st,
                    std::vector<float>& kt) {
  const bool simd = hd <= kGemmChunk;  // one chain per dot; longer heads take the scalar dot
  const int64_t kv_off = kh * hd, lanes = t * group;
  st.max.assign(static_cast<size_t>(lanes), -INFINITY);
  st.denom.assign(static_cast<size_t>(lanes), 0.0f);
  st.acc.assign(static_cast<size_t>(lanes * hd), 0.0f);
  int64_t last_all = 0;
  for (int64_t i = 0; i < t; ++i) last_all = std::max<int64_t>(last_all, positions[i]);
  float scores[kAttnBlock];
  for (int64_t b0 = 0; b0 <= last_all; b0 += kAttnBlock) {
    if (simd) {  // columns past the block's last key are zeros (read, never used)
      const int64_t n_all = std::min<int64_t>(kAttnBlock, last_all + 1 - b0);
      const float* rows[kAttnBlock];
      for (int64_t j = 0; j < n_all; ++j) rows[j] = kv.key(b0 + j) + kv_off;
      detail::transpose_key_rows(rows, n_all, hd, kAttnBlock, kt.data());
    }
    for (int64_t i = 0; i < t; ++i) {
      const int64_t last = positions[i];
      if (last < b0) continue;
      const int64_t n = std::min<int64_t>(kAttnBlock, last + 1 - b0);
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + i * ldq + (kh * group + g) * hd;
        if (simd) {
          detail::dots_transposed(qg, kt.data(), kAttnBlock, hd, n, scores);
        } else {
          for (int64_t j = 0; j < n; ++j) scores[j] = detail::dot(qg, kv.key(b0 + j) + kv_off, hd);
        }
        float block_max = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          scores[j] = scores[j] * scale;
          block_max = std::max(block_max, scores[j]);
        }
        const int64_t lane = i * group + g;
        float& running_max = st.max[lane];
        float& denom = st.denom[lane];
        float* acc = st.acc.data() + lane * hd;
        const float new_max = std::max(running_max, block_max);
        const float alpha = std::isinf(running_max) ? 0.0f : std::exp(running_max - new_max);
        denom = denom * alpha;
        for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * alpha;
        for (int64_t j = 0; j < n; ++j) {
          const float p = std::exp(scores[j] - new_max);
          denom = denom + p;
          detail::fma_row(p, kv.value(b0 + j) + kv_off, acc, hd);
        }
        running_max = new_max;
      }
    }
  }
  for (int64_t i = 0; i < t; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t lane = i * group + g;
      float* o = out + i * ldo + (kh * group + g) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = st.acc[lane * hd + d] / st.denom[lane];
    }
}

}  // namespace

void attention(const float* q, int64_t ldq, int64_t t, int64_t heads, int64_t kv_heads,
               int64_t head_dim, const int32_t* positions, const KvSpan& kv, float scale,
               float* out, int64_t ldo) {
  MILES_CHECK(heads % kv_heads == 0 && kv.block_tokens > 0);
  MILES_CHECK(ldq >= heads * head_dim && ldo >= heads * head_dim);
  for (int64_t i = 0; i < t; ++i)
    MILES_CHECK(positions[i] >= 0 &&
                positions[i] < static_cast<int64_t>(kv.k_blocks.size()) * kv.block_tokens);
  if (t <= 0) return;
  const KvReader reader{kv, kv_heads * head_dim};
  thread_local SoftmaxState st;
  thread_local std::vector<float> kt;
  kt.assign(static_cast<size_t>(head_dim * kAttnBlock), 0.0f);
  for (int64_t kh = 0; kh < kv_heads; ++kh)
    attend_kv_head(q, ldq, t, heads, heads / kv_heads, head_dim, kh, positions, reader, scale, out,
                   ldo, st, kt);
}

void attention(const float* q, int64_t t, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const int32_t* positions, const KvSpan& kv, float scale, float* out) {
  attention(q, heads * head_dim, t, heads, kv_heads, head_dim, positions, kv, scale, out,
            heads * head_dim);
}

}  // namespace miles::kernels
