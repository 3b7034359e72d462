// BlockPool: one allocation, a free stack, reference counts checked as invariants.
#include "rollout/block_pool.h"

#include <cstring>

#include "miles/check.h"

namespace miles::rollout {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_tokens, int64_t num_layers, int64_t kv_dim,
                     int64_t experts_per_position)
    : block_tokens_(block_tokens),
      num_layers_(num_layers),
      kv_dim_(kv_dim),
      experts_per_pos_(experts_per_position) {
  // kv_dim 0: the keys and values live elsewhere (a device runner's memory); the pool keeps the
  // block ids, reference counts and routed experts only.
  MILES_CHECK(num_blocks > 0 && block_tokens > 0 && num_layers > 0 && kv_dim >= 0);
  data_.assign(static_cast<size_t>(num_blocks * num_layers * 2 * block_tokens * kv_dim), 0.0f);
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  experts_.assign(static_cast<size_t>(num_blocks * block_tokens * experts_per_position), -1);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> BlockPool::alloc() {
  if (free_.empty()) return std::nullopt;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void BlockPool::ref(int32_t block) {
  MILES_CHECK(refs_.at(block) > 0, "ref() of a free block");
  ++refs_[block];
}

void BlockPool::unref(int32_t block) {
  MILES_CHECK(refs_.at(block) > 0, "unref() of a free block");
  if (--refs_[block] == 0) free_.push_back(block);
}

void BlockPool::release_storage() {
  MILES_CHECK(free_blocks() == num_blocks(), "release_storage with blocks in use");
  LargeVector<float>().swap(data_);
  released_ = true;
}

void BlockPool::restore_storage() {
  if (!released_) return;
  data_.assign(static_cast<size_t>(num_blocks() * num_layers_ * 2 * block_tokens_ * kv_dim_), 0.0f);
  released_ = false;
}

float* BlockPool::keys(int32_t block, int64_t layer) {
  return data_.data() + ((block * num_layers_ + layer) * 2) * block_tokens_ * kv_dim_;
}

float* BlockPool::values(int32_t block, int64_t layer) {
  return keys(block, layer) + block_tokens_ * kv_dim_;
}

void BlockPool::copy_prefix(int32_t src, int32_t dst, int64_t positions) {
  MILES_CHECK(positions >= 0 && positions <= block_tokens_);
  // The block layout (kernels::KvSpan) interleaves positions inside each head, so the whole block
  // is copied; positions past `positions` are the destination's to overwrite and are never read
  // before.
  if (positions == 0) return;
  for (int64_t l = 0; l < num_layers_ && kv_dim_ > 0; ++l) {
    std::memcpy(keys(dst, l), keys(src, l), sizeof(float) * block_tokens_ * kv_dim_);
    std::memcpy(values(dst, l), values(src, l), sizeof(float) * block_tokens_ * kv_dim_);
  }
  if (experts_per_pos_ > 0)
    std::memcpy(experts(dst), experts(src), sizeof(int32_t) * positions * experts_per_pos_);
}

}  // namespace miles::rollout
