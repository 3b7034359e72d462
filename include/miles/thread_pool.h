// ThreadPool: a fixed set of worker threads running parallel_for over an index range.
//
// Why: kernels split work across threads, and results must not depend on how. parallel_for hands out
// whole work items; each item computes its own outputs completely, so no reduction ever crosses threads.
// A pool is an object passed to whoever needs it (no global pool).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace miles {

class ThreadPool {
 public:
  // num_threads <= 0: std::thread::hardware_concurrency(). The calling thread is one of them.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(i) for every i in [0, n), items claimed dynamically by the threads; returns when all are done.
  // Not reentrant: fn must not call parallel_for on the same pool.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  void run_items(const std::function<void(int64_t)>* fn, int64_t n);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  // Items are claimed and counted without the lock (fetch_add); reset under mu_ between
  // generations, when no worker is inside run_items.
  // Each on its own cache line: next_ is claimed per item, finished_ written once per thread.
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int64_t> finished_{0};
  alignas(64) std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};
  bool stop_ = false;
};

// Runs fn over [0, n) on the pool when there is one and more than one item, else inline.
inline void parallel_for(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool && pool->num_threads() > 1 && n > 1) {
    pool->parallel_for(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

// Runs fn(begin, end) over pieces of [0, n) that together cover it once, on the pool when the work
// (n * cost_per_item, in arbitrary units ~ floats touched) is worth waking it. For element-wise and
// row-wise phases whose results do not depend on how the range is cut.
inline void parallel_ranges(ThreadPool* pool, int64_t n, int64_t cost_per_item,
                            const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kMinParallelCost = 1 << 15;
  const int threads = pool ? pool->num_threads() : 1;
  if (n <= 0) return;
  if (threads <= 1 || n < 2 || n * cost_per_item < kMinParallelCost) {
    fn(0, n);
    return;
  }
  const int64_t pieces = std::min<int64_t>(n, 4 * threads);
  pool->parallel_for(pieces, [&](int64_t p) { fn(n * p / pieces, n * (p + 1) / pieces); });
}

}  // namespace miles
