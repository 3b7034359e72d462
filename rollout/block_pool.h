// BlockPool: the rollout engine's KV memory — a fixed number of blocks, each holding block_tokens
// positions of keys and values for every layer, with reference counts.
//
// Why: requests share prefix blocks (radix cache, GRPO groups), so a block returns to the free list only
// when the last holder (a request's block table or the radix tree) lets go. The free count is what the
// server reports and what tests check returns to its idle value after aborts.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "miles/huge_pages.h"

namespace miles::rollout {

class BlockPool {
 public:
  // experts_per_position: moe layers × top_k (0 for dense models) — routed expert ids stored beside the
  // KV so that prefix-cache hits can report the experts of cached positions.
  BlockPool(int64_t num_blocks, int64_t block_tokens, int64_t num_layers, int64_t kv_dim,
            int64_t experts_per_position = 0);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t block_tokens() const { return block_tokens_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // A free block with reference count 1, or nothing when all are taken.
  std::optional<int32_t> alloc();
  void ref(int32_t block);
  void unref(int32_t block);
  int32_t refs(int32_t block) const { return refs_.at(block); }

  // Keys / values of (block, layer): block_tokens * kv_dim floats each, laid out as kernels::KvSpan
  // says.
  float* keys(int32_t block, int64_t layer);
  float* values(int32_t block, int64_t layer);
  // Routed expert ids of (block): [block_tokens][experts_per_position].
  int32_t* experts(int32_t block) { return experts_.data() + block * block_tokens_ * experts_per_pos_; }
  int64_t experts_per_position() const { return experts_per_pos_; }
  // Frees the keys and values (every block must be free), and allocates them again (zeros): SGLang's
  // release / resume_memory_occupation of the KV cache.
  void release_storage();
  void restore_storage();
  bool storage_released() const { return released_; }
  // Copies the first `positions` rows of every layer from src to dst (copy-on-write of a partial block).
  void copy_prefix(int32_t src, int32_t dst, int64_t positions);

 private:
  int64_t block_tokens_, num_layers_, kv_dim_, experts_per_pos_;
  std::vector<int32_t> experts_;  // (num_blocks, block_tokens, experts_per_position)
  LargeVector<float> data_;       // (num_blocks, num_layers, 2, block_tokens, kv_dim)
  std::vector<int32_t> refs_;    // (num_blocks)
  std::vector<int32_t> free_;    // stack of free block ids
  bool released_ = false;
};

}  // namespace miles::rollout
