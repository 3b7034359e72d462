// KvStore: where the model keeps each sequence's keys and values, in blocks of positions.
//
// Why: the rollout engine's paged KV cache (block tables, prefix sharing) and the simple per-slot cache
// used by `miles generate`, `miles score` and the trainer's forward all sit behind this one seam; the
// attention kernel only sees a list of block pointers (kernels::KvSpan).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "miles/status.h"

namespace miles {

class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual int64_t block_tokens() const = 0;
  // Makes slot able to hold positions [0, n_positions) (allocating blocks as needed), or says why not.
  virtual Status reserve(int32_t slot, int64_t n_positions) = 0;
  // The block pointers of (slot, layer), for at least the reserved positions. Each block holds
  // block_tokens() * kv_dim floats of keys in k[b] and of values in v[b], laid out as
  // kernels::KvSpan says.
  virtual void blocks(int32_t slot, int64_t layer, std::vector<float*>& k,
                      std::vector<float*>& v) = 0;
};

// A KvStore that gives every slot its own blocks (no sharing), allocated on demand.
class SimpleKvCache final : public KvStore {
 public:
  SimpleKvCache(int64_t num_layers, int64_t kv_dim, int64_t block_tokens = 16,
                int64_t max_positions = 1 << 20);
  int64_t block_tokens() const override { return block_tokens_; }
  Status reserve(int32_t slot, int64_t n_positions) override;
  void blocks(int32_t slot, int64_t layer, std::vector<float*>& k, std::vector<float*>& v) override;
  void release(int32_t slot) { slots_.erase(slot); }

 private:
  struct Slot {
    int64_t num_blocks = 0;
    // (layer) -> blocks of block_tokens * kv_dim floats (kernels::KvSpan's layout), k and v.
    std::vector<std::vector<std::unique_ptr<float[]>>> k, v;
  };
  int64_t num_layers_, kv_dim_, block_tokens_, max_positions_;
  std::map<int32_t, Slot> slots_;
};

}  // namespace miles
