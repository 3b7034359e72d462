// Block pool, paged tables and the radix prefix cache, without a model: sharing, reference counts,
// LRU eviction of tree-only leaves, and the free count returning to idle.
#include <gtest/gtest.h>

#include "rollout/paged_kv_cache.h"
#include "rollout/radix_cache.h"

namespace miles::rollout {
namespace {

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = start + i;
  return t;
}

TEST(BlockPool, RefCountsReturnBlocks) {
  BlockPool pool(4, 2, 1, 3);
  auto a = pool.alloc(), b = pool.alloc();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool.free_blocks(), 2);
  pool.ref(*a);
  pool.unref(*a);
  EXPECT_EQ(pool.free_blocks(), 2);
  pool.unref(*a);
  pool.unref(*b);
  EXPECT_EQ(pool.free_blocks(), 4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.alloc());
  EXPECT_FALSE(pool.alloc());
}

TEST(PagedKvCache, ReserveFailsWithoutPartialAllocation) {
  BlockPool pool(3, 4, 1, 2);
  PagedKvCache kv(pool);
  ASSERT_TRUE(kv.reserve(1, 8).ok());  // 2 blocks
  auto s = kv.reserve(2, 8);           // needs 2, 1 free
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("KV cache full"), std::string::npos);
  EXPECT_EQ(pool.free_blocks(), 1);
  kv.release(1);
  EXPECT_EQ(pool.free_blocks(), 3);
}

TEST(RadixCache, SharesWholeBlocksAndEvictsLruLeaves) {
  BlockPool pool(16, 4, 1, 2);
  PagedKvCache kv(pool);
  RadixCache radix(pool);
  const auto a = iota_tokens(10);  // 2 whole blocks + 2
  ASSERT_TRUE(kv.reserve(1, 10).ok());
  radix.insert(a, kv.table(1));
  EXPECT_EQ(radix.num_nodes(), 2);
  kv.release(1);
  EXPECT_EQ(pool.free_blocks(), 14);  // the tree keeps 2

  // Same prefix, different tail: matches both whole blocks.
  auto b = a;
  b[9] = 99;
  auto hit = radix.match(b, 100);
  ASSERT_EQ(hit.size(), 2u);
  kv.adopt(2, hit);
  // A diverging second block: only the first matches.
  auto c = a;
  c[5] = 77;
  EXPECT_EQ(radix.match(c, 100).size(), 1u);
  EXPECT_EQ(radix.match(a, 1).size(), 1u);  // max_blocks honoured

  // Held by request 2: not evictable.
  EXPECT_EQ(radix.evict(5), 0);
  kv.release(2);
  // Another branch, used later (more recent).
  const auto d = iota_tokens(8, 500);
  ASSERT_TRUE(kv.reserve(3, 8).ok());
  radix.insert(d, kv.table(3));
  kv.release(3);
  EXPECT_EQ(radix.num_nodes(), 4);
  EXPECT_EQ(radix.evict(1), 1);  // the LRU leaf: a's second block
  EXPECT_EQ(radix.match(a, 100).size(), 1u);
  EXPECT_EQ(radix.match(d, 100).size(), 2u);
  radix.clear();
  EXPECT_EQ(pool.free_blocks(), 16);
}

}  // namespace
}  // namespace miles::rollout
