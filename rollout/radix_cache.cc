// RadixCache: block-granular prefix tree with LRU eviction of tree-only leaves.
#include "rollout/radix_cache.h"

#include <algorithm>

#include "miles/check.h"

namespace miles::rollout {

namespace {
std::vector<int32_t> chunk(std::span<const int32_t> tokens, int64_t i, int64_t bt) {
  return std::vector<int32_t>(tokens.begin() + i * bt, tokens.begin() + (i + 1) * bt);
}
}  // namespace

std::vector<int32_t> RadixCache::match(std::span<const int32_t> tokens, int64_t max_blocks) {
  const int64_t bt = pool_.block_tokens();
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(tokens.size()) / bt, max_blocks);
  std::vector<int32_t> out;
  Node* n = &root_;
  ++clock_;
  for (int64_t i = 0; i < full; ++i) {
    auto it = n->children.find(chunk(tokens, i, bt));
    if (it == n->children.end()) break;
    n = it->second.get();
    n->last_used = clock_;
    out.push_back(n->block);
  }
  return out;
}

void RadixCache::insert(std::span<const int32_t> tokens, const std::vector<int32_t>& blocks) {
  const int64_t bt = pool_.block_tokens();
  const int64_t full =
      std::min<int64_t>(static_cast<int64_t>(tokens.size()) / bt, static_cast<int64_t>(blocks.size()));
  Node* n = &root_;
  ++clock_;
  for (int64_t i = 0; i < full; ++i) {
    auto key = chunk(tokens, i, bt);
    auto it = n->children.find(key);
    if (it == n->children.end()) {
      auto child = std::make_unique<Node>();
      child->block = blocks[i];
      child->parent = n;
      pool_.ref(blocks[i]);
      ++num_nodes_;
      it = n->children.emplace(std::move(key), std::move(child)).first;
    }
    n = it->second.get();
    n->last_used = clock_;
  }
}

void RadixCache::collect_evictable(Node* n, std::vector<Node*>& out) {
  for (auto& [key, child] : n->children) {
    if (child->children.empty()) {
      if (pool_.refs(child->block) == 1) out.push_back(child.get());
    } else {
      collect_evictable(child.get(), out);
    }
  }
}

int64_t RadixCache::evict(int64_t want) {
  int64_t freed = 0;
  while (freed < want) {
    std::vector<Node*> leaves;
    collect_evictable(&root_, leaves);
    if (leaves.empty()) break;
    std::sort(leaves.begin(), leaves.end(), [](const Node* a, const Node* b) {
      return a->last_used != b->last_used ? a->last_used < b->last_used : a->block < b->block;
    });
    for (Node* leaf : leaves) {
      if (freed >= want) break;
      Node* parent = leaf->parent;
      pool_.unref(leaf->block);
      --num_nodes_;
      ++freed;
      for (auto it = parent->children.begin(); it != parent->children.end(); ++it)
        if (it->second.get() == leaf) {
          parent->children.erase(it);
          break;
        }
    }
  }
  return freed;
}

void RadixCache::drop_subtree(Node* n) {
  for (auto& [key, child] : n->children) {
    drop_subtree(child.get());
    pool_.unref(child->block);
    --num_nodes_;
  }
  n->children.clear();
}

void RadixCache::clear() { drop_subtree(&root_); }

}  // namespace miles::rollout
