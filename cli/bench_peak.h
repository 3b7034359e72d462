// The FMA peak of this machine, measured in the same run as a benchmark so that ratios to it (MFU,
// % of peak) are taken under the same clock and contention; the timing and operand helpers the
// `miles bench` tables share.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "miles/kernels.h"
#include "miles/thread_pool.h"

namespace miles::cli {

// n values drawn from N(0, 1) with the given seed: benchmark operands.
inline std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// GFLOP/s of independent fma chains on `threads` threads at once: the fastest of the calls made in
// min_seconds (cmd_bench.cc).
double fma_peak_gflops(kernels::Isa isa, int threads, double min_seconds);

// The FMA loop of fma_peak_gflops once on each of the pool's threads (`iters` steps each); returns
// the FLOPs it did (cmd_bench.cc).
double fma_loop_on_pool(ThreadPool& pool, kernels::Isa isa, int64_t iters);

// The fastest call of `fn` and the fastest of `peak` (an FMA loop), the two alternated for
// min_seconds. On a VM the clock and the neighbours move both by tens of percent from one second
// to the next (docs/benchmarks.md, Zen 3), so a rate read against the peak measured beside it
// says how well the code uses the core at that moment; against the peak of the run's start it
// also carries the drift.
template <typename Fn, typename Peak>
std::pair<double, double> time_with_peak(Fn fn, Peak peak, double min_seconds) {
  using Clock = std::chrono::steady_clock;
  fn();
  peak();
  double best = 1e30, best_peak = 1e30;
  const auto t0 = Clock::now();
  do {
    auto a = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - a).count());
    a = Clock::now();
    peak();
    best_peak = std::min(best_peak, std::chrono::duration<double>(Clock::now() - a).count());
  } while (std::chrono::duration<double>(Clock::now() - t0).count() < min_seconds);
  return {best, best_peak};
}

// Seconds per call of fn: the fastest of the calls made in min_seconds (after one warm-up call).
// The minimum is the figure least disturbed by other work on the machine.
template <typename Fn>
double time_per_call(Fn fn, double min_seconds) {
  return time_with_peak(
             fn, [] {}, min_seconds)
      .first;
}

}  // namespace miles::cli
