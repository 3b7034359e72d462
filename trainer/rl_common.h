// Shared private helpers of the RL loss files: batch layout validation and the reduction weights.
//
// Why: advantages, policy loss and SFT loss all read the same offsets / loss_mask layout and must
// reject the same malformed inputs with the same messages; the reduction weights are the one place
// where the token_mean / sample_mean / constant conventions live.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "miles/trainer/rl_loss.h"
#include "miles/status.h"

namespace miles::rl::detail {

// offsets: (S + 1) starting at 0, non-decreasing; loss_mask: (offsets.back()) of 0 / 1 values.
Status check_layout(std::span<const int64_t> offsets, std::span<const float> loss_mask);

// An optional per-token array must be empty (when !required) or have num_tokens entries.
Status check_array(const char* name, std::span<const float> values, size_t num_tokens,
                   bool required);

// Masked token count of sample s.
int64_t masked_count(std::span<const int64_t> offsets, std::span<const float> loss_mask, size_t s);

// rho_t: d(reduced value) / d(per-token value) for each token, so that reduce(l) = sum_t rho_t l_t.
// Zero on tokens with loss_mask 0. Errors name the normaliser field.
Result<std::vector<double>> reduction_weights(const LossConfig& config,
                                              std::span<const int64_t> offsets,
                                              std::span<const float> loss_mask);

// Importance-sampling correction against rollout logprobs, per token: keep_t (0 or 1, MIS)
// multiplies every loss term of the token, pg_weight_t (TIS) the policy-gradient term only.
// corrected counts the masked tokens truncated or dropped. Without a correction keep = pg_weight
// = 1.
struct IsCorrectionTerms {
  std::vector<double> keep;       // (T)
  std::vector<double> pg_weight;  // (T)
  int64_t corrected = 0;
};
IsCorrectionTerms is_correction(const LossConfig& config, const TokenBatch& batch);

// Fills the train-rollout mismatch metrics of `metrics` (needs batch.rollout_logp non-empty).
void mismatch_metrics(const TokenBatch& batch, LossMetrics& metrics);

}  // namespace miles::rl::detail
