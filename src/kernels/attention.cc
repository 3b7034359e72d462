// Causal attention with GQA: online softmax over key blocks of kAttnBlock positions from position 0,
// ascending. A query at position p sees keys 0..p in the same blocks however it was batched (prefill,
// chunked prefill or decode), so its output bits depend only on the sequence.
#include <cmath>
#include <vector>

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

// One query head against keys [0, last]; out[head_dim].
void attend_one(const float* q, int64_t head_dim, int64_t kv_off, int64_t last, const KvReader& kv,
                float scale, float* out, float* acc) {
  float running_max = -INFINITY;
  float denom = 0.0f;
  std::fill(acc, acc + head_dim, 0.0f);
  float scores[kAttnBlock];
  for (int64_t b0 = 0; b0 <= last; b0 += kAttnBlock) {
    const int64_t n = std::min<int64_t>(kAttnBlock, last + 1 - b0);
    float block_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      scores[j] = detail::dot(q, kv.key(b0 + j) + kv_off, head_dim) * scale;
      block_max = std::max(block_max, scores[j]);
    }
    const float new_max = std::max(running_max, block_max);
    const float alpha = std::isinf(running_max) ? 0.0f : std::exp(running_max - new_max);
    denom = denom * alpha;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] = acc[d] * alpha;
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(scores[j] - new_max);
      denom = denom + p;
      const float* v = kv.value(b0 + j) + kv_off;
      for (int64_t d = 0; d < head_dim; ++d) acc[d] = std::fma(p, v[d], acc[d]);
    }
    running_max = new_max;
  }
  for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] / denom;
}

}  // namespace

void attention(const float* q, int64_t t, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const int32_t* positions, const KvSpan& kv, float scale, float* out) {
  MILES_CHECK(heads % kv_heads == 0 && kv.block_tokens > 0);
  const KvReader reader{kv, kv_heads * head_dim};
  const int64_t group = heads / kv_heads;
  std::vector<float> acc(static_cast<size_t>(head_dim));
  for (int64_t i = 0; i < t; ++i) {
    const int64_t last = positions[i];
    MILES_CHECK(last >= 0 && last < static_cast<int64_t>(kv.k_blocks.size()) * kv.block_tokens);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t off = (i * heads + h) * head_dim;
      attend_one(q + off, head_dim, (h / group) * head_dim, last, reader, scale, out + off,
                 acc.data());
    }
  }
}

}  // namespace miles::kernels
