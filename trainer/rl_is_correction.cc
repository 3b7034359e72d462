// Importance-sampling corrections (TIS, token and sequence MIS) and the train-rollout mismatch
// metrics.
//
// Why here: both read the same weight w_t = exp(old_logp - rollout_logp), the ratio between the
// trainer's behaviour-policy logprob and the logprob of the distribution the rollout engine sampled
// from (docs/contracts.md §6). Conventions learned from slime's vanilla TIS (pg loss x clamp(w,
// max=C)) and Miles' MIS helper (drop tokens, or whole sequences by the geometric-mean weight,
// outside [low, high]).
#include <algorithm>
#include <cmath>

#include "miles/trainer/rl_loss.h"
#include "trainer/rl_common.h"

namespace miles::rl::detail {

IsCorrectionTerms is_correction(const LossConfig& config, const TokenBatch& batch) {
  const size_t num_tokens = batch.loss_mask.size();
  IsCorrectionTerms out;
  out.keep.assign(num_tokens, 1.0);
  out.pg_weight.assign(num_tokens, 1.0);
  if (config.correction == IsCorrection::kNone) return out;
  auto log_w = [&](size_t t) {
    return static_cast<double>(batch.old_logp[t]) - static_cast<double>(batch.rollout_logp[t]);
  };
  switch (config.correction) {
    case IsCorrection::kNone:
      break;
    case IsCorrection::kTis:
      for (size_t t = 0; t < num_tokens; ++t) {
        const double w = std::exp(log_w(t));
        if (w > config.tis_c) {
          out.pg_weight[t] = config.tis_c;
          out.corrected += batch.loss_mask[t] == 1.0f ? 1 : 0;
        } else {
          out.pg_weight[t] = w;
        }
      }
      break;
    case IsCorrection::kMisToken:
      for (size_t t = 0; t < num_tokens; ++t) {
        const double w = std::exp(log_w(t));
        if (w < config.mis_low || w > config.mis_high) {
          out.keep[t] = 0.0;
          out.corrected += batch.loss_mask[t] == 1.0f ? 1 : 0;
        }
      }
      break;
    case IsCorrection::kMisSequence:
      for (size_t s = 0; s + 1 < batch.offsets.size(); ++s) {
        double sum = 0;
        int64_t n = 0;
        for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t) {
          if (batch.loss_mask[t] != 1.0f) continue;
          sum += log_w(t);
          ++n;
        }
        const double w = std::exp(sum / static_cast<double>(n > 0 ? n : 1));
        if (w < config.mis_low || w > config.mis_high) {
          for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t) out.keep[t] = 0.0;
          out.corrected += n;
        }
      }
      break;
  }
  return out;
}

void mismatch_metrics(const TokenBatch& batch, LossMetrics& metrics) {
  double abs_sum = 0, abs_max = 0, kl = 0, w_sum = 0, w_sq = 0;
  int64_t n = 0;
  for (size_t t = 0; t < batch.loss_mask.size(); ++t) {
    if (batch.loss_mask[t] != 1.0f) continue;
    const double d =
        static_cast<double>(batch.old_logp[t]) - static_cast<double>(batch.rollout_logp[t]);
    const double w = std::exp(d);
    abs_sum += std::fabs(d);
    abs_max = std::max(abs_max, std::fabs(d));
    kl += w - 1.0 - d;  // k3 for KL(rollout || train) with tokens sampled from the rollout policy
    w_sum += w;
    w_sq += w * w;
    ++n;
  }
  const double count = static_cast<double>(n);
  metrics.rollout_abs_diff_mean = abs_sum / count;
  metrics.rollout_abs_diff_max = abs_max;
  metrics.rollout_kl = kl / count;
  metrics.is_ess = w_sum * w_sum / (count * w_sq);
}

}  // namespace miles::rl::detail
