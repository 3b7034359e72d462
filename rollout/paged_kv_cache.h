// PagedKvCache: per-request block tables over a BlockPool; the model sees it as a KvStore.
//
// Why: a request's KV lives in fixed-size blocks it may share with others (prefix hits, GRPO
// siblings). The table maps a request's positions to blocks; only the blocks past a shared prefix
// are ever written.
#pragma once

#include <map>
#include <vector>

#include "miles/kv_cache.h"
#include "rollout/block_pool.h"

namespace miles::rollout {

class PagedKvCache final : public KvStore {
 public:
  explicit PagedKvCache(BlockPool& pool) : pool_(pool) {}
  int64_t block_tokens() const override { return pool_.block_tokens(); }
  // Allocates blocks so that slot can hold n_positions; an error when the pool has too few free
  // blocks (nothing is allocated then).
  Status reserve(int32_t slot, int64_t n_positions) override;
  void blocks(int32_t slot, int64_t layer, std::vector<float*>& k, std::vector<float*>& v) override;

  // Starts slot's table with shared blocks (each gains a reference).
  void adopt(int32_t slot, const std::vector<int32_t>& shared);
  const std::vector<int32_t>& table(int32_t slot) const;
  bool has(int32_t slot) const { return tables_.count(slot) > 0; }
  // Drops the slot's references.
  void release(int32_t slot);
  // Drops the blocks past those holding n_positions (a speculative verify's rejected positions).
  void truncate(int32_t slot, int64_t n_positions);
  // Blocks still needed to hold n_positions for slot.
  int64_t blocks_needed(int32_t slot, int64_t n_positions) const;

 private:
  BlockPool& pool_;
  std::map<int32_t, std::vector<int32_t>> tables_;
};

}  // namespace miles::rollout
