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

// The query heads of one KV head (`group` of them, q[g * head_dim]) against keys [0, last]: per key
// block the keys are transposed once ([head_dim][kAttnBlock], zero-padded) and each head's scores
// run kAttnBlock keys side by side (dots_transposed: each lane the contract's dot), then the online
// softmax of that head as in the scalar code. out[g * head_dim].
struct GroupState {
  std::vector<float> kt, scores, max, denom, acc;
};

void attend_group(const float* q, int64_t group, int64_t q_stride, int64_t head_dim, int64_t kv_off,
                  int64_t last, const KvReader& kv, float scale, float* out, int64_t out_stride,
                  GroupState& st) {
  const int64_t hd = head_dim;
  const bool simd = hd <= kGemmChunk;  // one chain per dot; longer heads take the scalar dot
  st.kt.assign(static_cast<size_t>(hd * kAttnBlock), 0.0f);
  st.scores.resize(static_cast<size_t>(kAttnBlock));
  st.max.assign(static_cast<size_t>(group), -INFINITY);
  st.denom.assign(static_cast<size_t>(group), 0.0f);
  st.acc.assign(static_cast<size_t>(group * hd), 0.0f);
  float* scores = st.scores.data();
  for (int64_t b0 = 0; b0 <= last; b0 += kAttnBlock) {
    const int64_t n = std::min<int64_t>(kAttnBlock, last + 1 - b0);
    if (simd) {
      for (int64_t j = 0; j < kAttnBlock; ++j) {  // columns past n stay zero (read, never used)
        const float* k = j < n ? kv.key(b0 + j) + kv_off : nullptr;
        for (int64_t e = 0; e < hd; ++e) st.kt[e * kAttnBlock + j] = k ? k[e] : 0.0f;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * q_stride;
      if (simd) {
        detail::dots_transposed(qg, st.kt.data(), kAttnBlock, hd, n, scores);
      } else {
        for (int64_t j = 0; j < n; ++j) scores[j] = detail::dot(qg, kv.key(b0 + j) + kv_off, hd);
      }
      float block_max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = scores[j] * scale;
        block_max = std::max(block_max, scores[j]);
      }
      float& running_max = st.max[g];
      float& denom = st.denom[g];
      float* acc = st.acc.data() + g * hd;
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
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < hd; ++d) out[g * out_stride + d] = st.acc[g * hd + d] / st.denom[g];
}

}  // namespace

void attention(const float* q, int64_t t, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const int32_t* positions, const KvSpan& kv, float scale, float* out) {
  MILES_CHECK(heads % kv_heads == 0 && kv.block_tokens > 0);
  const KvReader reader{kv, kv_heads * head_dim};
  const int64_t group = heads / kv_heads;
  GroupState st;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t last = positions[i];
    MILES_CHECK(last >= 0 && last < static_cast<int64_t>(kv.k_blocks.size()) * kv.block_tokens);
    for (int64_t kh = 0; kh < kv_heads; ++kh) {
      const int64_t off = (i * heads + kh * group) * head_dim;
      attend_group(q + off, group, head_dim, head_dim, kh * head_dim, last, reader, scale,
                   out + off, head_dim, st);
    }
  }
}

}  // namespace miles::kernels
