// adjust_logits: the request's penalties, mask and biases over one row, in a fixed order.
#include "rollout/logit_adjust.h"

#include <algorithm>
#include <cmath>

namespace miles::rollout {

namespace {

// Distinct ids of `ids` with their counts, ascending by id.
std::vector<std::pair<int32_t, int64_t>> counts_of(std::span<const int32_t> ids) {
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::pair<int32_t, int64_t>> out;
  for (int32_t id : sorted) {
    if (!out.empty() && out.back().first == id) {
      ++out.back().second;
    } else {
      out.emplace_back(id, 1);
    }
  }
  return out;
}

void repetition(std::vector<float>& x, float r, std::span<const int32_t> seen) {
  for (const auto& [id, count] : counts_of(seen)) {
    float& v = x[static_cast<size_t>(id)];
    v = v < 0.0f ? v * r : v / r;
  }
}

void frequency_presence(std::vector<float>& x, float frequency, float presence,
                        std::span<const int32_t> output) {
  for (const auto& [id, count] : counts_of(output))
    x[static_cast<size_t>(id)] -= frequency * static_cast<float>(count) + presence;
}

}  // namespace

std::vector<float> adjust_logits(std::span<const float> logits, const LogitAdjustments& a,
                                 std::span<const int32_t> prompt_and_output, size_t output_len,
                                 std::span<const int32_t> stop_ids) {
  std::vector<float> x(logits.begin(), logits.end());
  const std::span<const int32_t> output = prompt_and_output.last(output_len);
  if (a.frequency_penalty != 0.0f || a.presence_penalty != 0.0f)
    frequency_presence(x, a.frequency_penalty, a.presence_penalty, output);
  if (static_cast<int64_t>(output_len) < a.min_new_tokens)
    for (int32_t id : stop_ids) x[static_cast<size_t>(id)] = -INFINITY;
  if (a.repetition_penalty != 1.0f) repetition(x, a.repetition_penalty, output);
  for (const auto& [id, bias] : a.logit_bias) x[static_cast<size_t>(id)] += bias;
  return x;
}

}  // namespace miles::rollout
