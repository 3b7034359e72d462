// Advantage estimators: GRPO, Dr.GRPO, REINFORCE++ and REINFORCE++-baseline, from one scalar reward
// per sample to one advantage per response token.
//
// Conventions (learned from slime's reward post-processing and ppo_utils, re-derived here):
//  - GRPO: A = (r - mean_g) / (std_g + std_eps), std_g the unbiased (n - 1) std of the group, like
//    torch.std; slime uses exactly this with eps 1e-6. Dr.GRPO: A = r - mean_g.
//  - REINFORCE++: the reward is broadcast to every token of its sample (gamma = 1, no KL in the
//  reward),
//    then whitened over all masked tokens of the batch: (x - mean) / sqrt(var + whiten_eps), var
//    with Bessel's correction when at least 2 tokens (slime's distributed_masked_whiten). The
//    baseline variant subtracts the group mean first.
// Everything is double; sums run in sample / token order.
#include <cmath>
#include <map>

#include "miles/trainer/rl_loss.h"
#include "trainer/rl_common.h"

namespace miles::rl {

Status AdvantageConfig::validate() const {
  if (!(std_eps >= 0)) return Status::Error("std_eps: must be >= 0");
  if (!(whiten_eps >= 0)) return Status::Error("whiten_eps: must be >= 0");
  return Status::Ok();
}

namespace {

// Per-sample r - mean_g, or (r - mean_g) / (std_g + eps) when divide_std.
std::vector<double> group_normalise(std::span<const float> rewards,
                                    std::span<const int64_t> group_index, bool divide_std,
                                    double eps) {
  const size_t n = rewards.size();
  // Members of each group in sample order; std::map keeps group iteration deterministic.
  std::map<int64_t, std::vector<size_t>> groups;
  for (size_t s = 0; s < n; ++s) groups[group_index[s]].push_back(s);
  std::vector<double> out(n, 0.0);
  for (const auto& [id, members] : groups) {
    double sum = 0;
    for (size_t s : members) sum += rewards[s];
    const double mean = sum / static_cast<double>(members.size());
    double sq = 0;
    for (size_t s : members) sq += (rewards[s] - mean) * (rewards[s] - mean);
    const double std_g =
        members.size() > 1 ? std::sqrt(sq / static_cast<double>(members.size() - 1)) : 0.0;
    for (size_t s : members) {
      out[s] = rewards[s] - mean;
      if (divide_std) out[s] /= std_g + eps;
    }
  }
  return out;
}

// Broadcast per-sample values to tokens, whiten over masked tokens; unmasked tokens get 0.
std::vector<float> broadcast_whiten(const std::vector<double>& per_sample,
                                    std::span<const int64_t> offsets,
                                    std::span<const float> loss_mask, bool whiten, double eps) {
  std::vector<float> out(loss_mask.size(), 0.0f);
  double mean = 0, scale = 1;
  if (whiten) {
    double sum = 0, count = 0;
    for (size_t s = 0; s < per_sample.size(); ++s) {
      for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) {
        sum += loss_mask[t] * per_sample[s];
        count += loss_mask[t];
      }
    }
    mean = sum / count;
    double sq = 0;
    for (size_t s = 0; s < per_sample.size(); ++s) {
      for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) {
        sq += loss_mask[t] * (per_sample[s] - mean) * (per_sample[s] - mean);
      }
    }
    const double var = count >= 2 ? sq / (count - 1) : sq / count;
    scale = 1.0 / std::sqrt(var + eps);
  }
  for (size_t s = 0; s < per_sample.size(); ++s) {
    for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) {
      if (loss_mask[t] == 1.0f) out[t] = static_cast<float>((per_sample[s] - mean) * scale);
    }
  }
  return out;
}

}  // namespace

Result<std::vector<float>> compute_advantages(const AdvantageConfig& config,
                                              std::span<const float> rewards,
                                              std::span<const int64_t> group_index,
                                              std::span<const int64_t> offsets,
                                              std::span<const float> loss_mask) {
  MILES_RETURN_IF_ERROR(config.validate());
  MILES_RETURN_IF_ERROR(detail::check_layout(offsets, loss_mask));
  const size_t num_samples = offsets.size() - 1;
  if (rewards.size() != num_samples) {
    return Status::Error("rewards: has " + std::to_string(rewards.size()) + " entries, expected " +
                         std::to_string(num_samples) + " (one per sample)");
  }
  if (group_index.size() != num_samples) {
    return Status::Error("group_index: has " + std::to_string(group_index.size()) +
                         " entries, expected " + std::to_string(num_samples));
  }
  for (size_t s = 0; s < num_samples; ++s) {
    if (!std::isfinite(rewards[s])) {
      return Status::Error("rewards: entry " + std::to_string(s) + " is not finite");
    }
  }
  switch (config.estimator) {
    case AdvantageEstimator::kGrpo:
      return broadcast_whiten(
          group_normalise(rewards, group_index, config.std_normalize, config.std_eps), offsets,
          loss_mask, false, 0);
    case AdvantageEstimator::kDrGrpo:
      return broadcast_whiten(group_normalise(rewards, group_index, false, 0), offsets, loss_mask,
                              false, 0);
    case AdvantageEstimator::kReinforcePlusPlus:
      return broadcast_whiten(std::vector<double>(rewards.begin(), rewards.end()), offsets,
                              loss_mask, true, config.whiten_eps);
    case AdvantageEstimator::kReinforcePlusPlusBaseline:
      return broadcast_whiten(group_normalise(rewards, group_index, false, 0), offsets, loss_mask,
                              true, config.whiten_eps);
  }
  return Status::Error("estimator: unknown value");
}

}  // namespace miles::rl
