// The FMA peak of this machine, measured in the same run as a benchmark so that ratios to it (MFU,
// % of peak) are taken under the same clock and contention.
#pragma once

#include "miles/kernels.h"

namespace miles::cli {

// GFLOP/s of independent fma chains on `threads` threads at once: the fastest of the calls made in
// min_seconds (cmd_bench.cc).
double fma_peak_gflops(kernels::Isa isa, int threads, double min_seconds);

}  // namespace miles::cli
