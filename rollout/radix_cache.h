// RadixCache: a prefix tree over token ids at block granularity, sharing KV blocks between requests.
//
// Why: GRPO groups and multi-turn agents resend long common prefixes; their KV is computed once. Each
// tree node is one full block (block_tokens ids) and holds one reference on its block. A request that
// matches a prefix adopts those blocks (its own references). Eviction frees least-recently-used leaves
// whose block nobody but the tree holds. Runs without a model (tests/radix_cache_test.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "rollout/block_pool.h"

namespace miles::rollout {

class RadixCache {
 public:
  explicit RadixCache(BlockPool& pool) : pool_(pool) {}
  ~RadixCache() { clear(); }

  // Blocks of the longest cached prefix of `tokens`, whole blocks only, at most max_blocks.
  std::vector<int32_t> match(std::span<const int32_t> tokens, int64_t max_blocks);
  // Records the whole blocks of `tokens` held in `blocks` (a request's table). Blocks already in the
  // tree for the same ids are kept; new nodes take a reference on the request's block.
  void insert(std::span<const int32_t> tokens, const std::vector<int32_t>& blocks);
  // Frees up to `want` blocks by evicting LRU leaves only the tree holds; returns how many it freed.
  int64_t evict(int64_t want);
  // Drops every node (flush_cache). Blocks still held by requests stay allocated.
  void clear();
  int64_t num_nodes() const { return num_nodes_; }

 private:
  struct Node {
    int32_t block = -1;
    uint64_t last_used = 0;
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  };
  void collect_evictable(Node* n, std::vector<Node*>& out);
  void drop_subtree(Node* n);

  BlockPool& pool_;
  Node root_;
  uint64_t clock_ = 0;
  int64_t num_nodes_ = 0;
};

}  // namespace miles::rollout
