// The FMA peak of this machine, measured in the same run as a benchmark so that ratios to it (MFU,
// % of peak) are taken under the same clock and contention.
#pragma once

#include <algorithm>
#include <chrono>

#include "miles/kernels.h"

namespace miles::cli {

// Seconds per call of fn: the fastest of the calls made in min_seconds (after one warm-up call).
// The minimum is the figure least disturbed by other work on the machine.
template <typename Fn>
double time_per_call(Fn fn, double min_seconds) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30;
  const auto t0 = Clock::now();
  do {
    const auto a = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - a).count());
  } while (std::chrono::duration<double>(Clock::now() - t0).count() < min_seconds);
  return best;
}

// GFLOP/s of independent fma chains on `threads` threads at once: the fastest of the calls made in
// min_seconds (cmd_bench.cc).
double fma_peak_gflops(kernels::Isa isa, int threads, double min_seconds);

}  // namespace miles::cli
