// SimpleKvCache: per-slot blocks, grown on demand; no sharing between slots.
#include "miles/kv_cache.h"

#include "miles/check.h"

namespace miles {

SimpleKvCache::SimpleKvCache(int64_t num_layers, int64_t kv_dim, int64_t block_tokens,
                             int64_t max_positions)
    : num_layers_(num_layers),
      kv_dim_(kv_dim),
      block_tokens_(block_tokens),
      max_positions_(max_positions) {
  MILES_CHECK(num_layers > 0 && kv_dim > 0 && block_tokens > 0);
}

Status SimpleKvCache::reserve(int32_t slot, int64_t n_positions) {
  if (n_positions > max_positions_)
    return Status::Error("KV cache slot " + std::to_string(slot) + " needs " +
                         std::to_string(n_positions) + " positions, more than its limit of " +
                         std::to_string(max_positions_));
  Slot& s = slots_[slot];
  if (s.k.empty()) {
    s.k.resize(static_cast<size_t>(num_layers_));
    s.v.resize(static_cast<size_t>(num_layers_));
  }
  const int64_t need = (n_positions + block_tokens_ - 1) / block_tokens_;
  for (; s.num_blocks < need; ++s.num_blocks) {
    for (int64_t l = 0; l < num_layers_; ++l) {
      s.k[l].emplace_back(new float[block_tokens_ * kv_dim_]());
      s.v[l].emplace_back(new float[block_tokens_ * kv_dim_]());
    }
  }
  return Status::Ok();
}

void SimpleKvCache::blocks(int32_t slot, int64_t layer, std::vector<float*>& k,
                           std::vector<float*>& v) {
  auto it = slots_.find(slot);
  MILES_CHECK(it != slots_.end(), "blocks() of a slot that was never reserved");
  k.clear();
  v.clear();
  for (auto& b : it->second.k[layer]) k.push_back(b.get());
  for (auto& b : it->second.v[layer]) v.push_back(b.get());
}

}  // namespace miles
