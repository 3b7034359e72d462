// Percentiles of measured durations, for `miles bench rollout`.
//
// Why: latency tables report p50 / p90 / p99, and a benchmark's statistics must be unambiguous.
// This is the nearest-rank definition (the smallest value with at least q of the samples at or
// below it), so a reported p99 is always a value that was really measured, never an interpolation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace miles::cli {

// Nearest-rank percentile, q in (0, 1]; 0 for no samples.
inline double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

}  // namespace miles::cli
