// ThreadPool: every item of every parallel_for runs exactly once and is finished when the call
// returns, over thousands of back-to-back generations of varied sizes on 1–4 threads (the claims
// are an atomic counter, the completion a count checked under the lock).
#include "miles/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace miles {
namespace {

TEST(ThreadPool, EveryItemRunsOnceAndIsDoneOnReturn) {
  for (int threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(97);
    for (int gen = 0; gen < 3000; ++gen) {
      const int64_t n = gen % 97;  // 0 .. 96 items, some fewer than the threads
      for (int64_t i = 0; i < n; ++i) hits[i].store(0);
      pool.parallel_for(n, [&](int64_t i) { hits[i].fetch_add(1, std::memory_order_relaxed); });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << threads << " " << gen << " " << i;
    }
  }
}

TEST(ThreadPool, RangesCoverEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 1000, 123457}) {
    std::vector<int> seen(n, 0);
    parallel_ranges(&pool, n, 1 << 12, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++seen[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << n << " " << i;
  }
}

}  // namespace
}  // namespace miles
