// PagedKvCache: block tables and their reference counting.
#include "rollout/paged_kv_cache.h"

#include "miles/check.h"

namespace miles::rollout {

int64_t PagedKvCache::blocks_needed(int32_t slot, int64_t n_positions) const {
  const int64_t want = (n_positions + pool_.block_tokens() - 1) / pool_.block_tokens();
  auto it = tables_.find(slot);
  const int64_t have = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
  return want > have ? want - have : 0;
}

Status PagedKvCache::reserve(int32_t slot, int64_t n_positions) {
  const int64_t need = blocks_needed(slot, n_positions);
  if (need > pool_.free_blocks())
    return Status::Error("KV cache full: request " + std::to_string(slot) + " needs " +
                         std::to_string(need) + " more blocks, " +
                         std::to_string(pool_.free_blocks()) + " free");
  auto& t = tables_[slot];
  for (int64_t i = 0; i < need; ++i) t.push_back(*pool_.alloc());
  return Status::Ok();
}

void PagedKvCache::blocks(int32_t slot, int64_t layer, std::vector<float*>& k,
                          std::vector<float*>& v) {
  auto it = tables_.find(slot);
  MILES_CHECK(it != tables_.end(), "blocks() of an unknown request");
  k.clear();
  v.clear();
  for (int32_t b : it->second) {
    k.push_back(pool_.keys(b, layer));
    v.push_back(pool_.values(b, layer));
  }
}

void PagedKvCache::adopt(int32_t slot, const std::vector<int32_t>& shared) {
  auto& t = tables_[slot];
  MILES_CHECK(t.empty(), "adopt() needs an empty table");
  for (int32_t b : shared) {
    pool_.ref(b);
    t.push_back(b);
  }
}

const std::vector<int32_t>& PagedKvCache::table(int32_t slot) const { return tables_.at(slot); }

void PagedKvCache::release(int32_t slot) {
  auto it = tables_.find(slot);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) pool_.unref(b);
  tables_.erase(it);
}

void PagedKvCache::truncate(int32_t slot, int64_t n_positions) {
  auto it = tables_.find(slot);
  if (it == tables_.end()) return;
  const size_t keep =
      static_cast<size_t>((n_positions + pool_.block_tokens() - 1) / pool_.block_tokens());
  while (it->second.size() > keep) {
    pool_.unref(it->second.back());
    it->second.pop_back();
  }
}

}  // namespace miles::rollout
