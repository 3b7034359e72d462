// ThreadPool: each parallel_for is a generation whose items are claimed one at a time with an
// atomic counter (items are coarse: a GEMM panel, an attention head row). Between generations a
// worker first spins briefly on the generation counter, then sleeps on a condition variable: a
// forward calls parallel_for hundreds of times with items of a few microseconds, and waking a
// sleeping thread costs about as much as such an item (measured ~11 us on the 2-core CI machine).
#include "miles/thread_pool.h"

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace miles {

namespace {

// Spins until done() or `budget` has passed; says whether done() became true.
template <typename Done>
bool spin_until(Done done, std::chrono::microseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  for (int i = 0;; ++i) {
    if (done()) return true;
#if defined(__x86_64__)
    _mm_pause();
#endif
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return done();
  }
}

constexpr std::chrono::microseconds kWorkerSpin{50};   // idle worker, before it sleeps
constexpr std::chrono::microseconds kCallerSpin{200};  // caller waiting for the last items

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (num_threads <= 0) num_threads = 1;
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_items(const std::function<void(int64_t)>* fn, int64_t n) {
  // Items are claimed one at a time (one shared counter), but counted finished once per thread,
  // after its last item: a second contended atomic per item cost ~3 % of a weight-gradient GEMM
  // whose items take a few microseconds (the line bounces between the cores).
  int64_t ran = 0;
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) break;
    (*fn)(i);
    ++ran;
  }
  if (ran > 0 && finished_.fetch_add(ran, std::memory_order_acq_rel) + ran == n) {
    std::lock_guard<std::mutex> lock(mu_);  // a waiter checks under mu_: no lost wake-up
    done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; }, kWorkerSpin);
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      // A generation is open from its start until its caller, having seen every item finished and
      // no worker active, clears fn_ (all under mu_). A worker arriving after that must not run:
      // the caller may already be resetting the counters for the next one.
      if (fn_ == nullptr) continue;
      ++active_;
      fn = fn_;
      n = n_;
    }
    run_items(fn, n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  run_items(&fn, n);
  spin_until([&] { return finished_.load(std::memory_order_acquire) == n && active_.load() == 0; },
             kCallerSpin);
  std::unique_lock<std::mutex> lock(mu_);
  // Wait for all items and for every worker to leave run_items (so fn_ can be reused safely).
  done_.wait(lock, [&] { return finished_ == n_ && active_ == 0; });
  fn_ = nullptr;
}

}  // namespace miles
