// The RL objective of a trainer step: rl::policy_loss (PPO / GSPO, KL, entropy, IS corrections)
// over the step's samples, as a TokenObjective (trainer.h).
//
// Why: the trainer only knows "a loss of the response tokens' logprobs"; this binds each sample's
// behaviour, reference and rollout logprobs and advantages, and fixes the loss normalisers to the
// whole step (every micro-batch and data-parallel rank divides by the same global counts).
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "miles/trainer/rl_loss.h"
#include "miles/trainer/trainer.h"

namespace miles {

// Per-sample RL inputs, each (response_length) long; empty when the loss does not use it.
struct RlSampleData {
  std::vector<float> old_logp;      // behaviour policy (required)
  std::vector<float> ref_logp;      // reference model (KL)
  std::vector<float> rollout_logp;  // from the engine (IS corrections, mismatch metrics)
  std::vector<float> advantages;    // (required)
};

// loss_config's token / sample normalisers, when 0, become the step's masked-token and sample
// counts. Metric sums (per masked token) land in TokenLoss::sums; rl_step_metrics averages them.
Result<TokenObjective> rl_objective(std::span<const TrainSample> batch,
                                    std::span<const RlSampleData> data, rl::LossConfig loss_config);

// Step-level metrics from summed TokenLoss::sums: ppo_kl, clipfrac, mean rollout |Δ logp|,
// rollout KL, ESS ((Σw)² / (N Σw²)), correction fraction, pg / kl / entropy losses, and `entropy`
// (the policy's mean entropy in nats over the masked tokens) when the trainer computed entropies.
std::map<std::string, double> rl_step_metrics(const std::map<std::string, double>& sums);

}  // namespace miles
