// A sample's logit adjustments (GenerateRequest::adjust): penalties, the min-new-tokens mask and
// logit_bias, applied to a copy of its row of logits before the sampler.
//
// Why a function of its own: the adjusted row is a pure function of the model's row, the sample's
// tokens so far and the request, so the sampler's determinism carries over (same inputs, same bits,
// whatever the batch), and a test can pin each adjustment to its formula.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "miles/rollout/engine.h"

namespace miles::rollout {

// In SGLang's order (docs/api.md, "Sampling"); penalties count output tokens only, as SGLang's:
//   frequency and presence: x - (frequency * count + presence) for every id in the output, count
//     being its occurrences there (one multiply, so the order of the output does not matter);
//   min_new_tokens: while the output is shorter, every id of `stop_ids` becomes -inf;
//   repetition: every id in the output: x < 0 ? x * r : x / r;
//   logit_bias: x + bias, in the order given.
// prompt_and_output: the sample's whole record; output_len: its last output_len ids are output.
std::vector<float> adjust_logits(std::span<const float> logits, const LogitAdjustments& a,
                                 std::span<const int32_t> prompt_and_output, size_t output_len,
                                 std::span<const int32_t> stop_ids);

}  // namespace miles::rollout
