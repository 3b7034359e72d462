// RL loss math of the trainer: advantage estimators, policy losses (PPO clip, GSPO), KL to a
// reference model, entropy bonus, importance-sampling corrections against rollout logprobs, loss
// reductions, the gradient of the loss with respect to its per-token inputs, and the train-rollout
// mismatch metrics.
//
// Why: this is the seam between "samples with logprobs" and "the backward pass of the model".
// Everything here is a pure function over flat per-token arrays (no model, no threads), so that it
// can be checked token by token against a torch reference (tests/data/rl,
// scripts/make_rl_goldens.py).
//
// Layout. A batch is its samples' response tokens concatenated; sample s covers tokens
// [offsets[s], offsets[s+1]) (offsets has num_samples + 1 entries, offsets[0] == 0,
// non-decreasing). All per-token arrays have offsets.back() entries. loss_mask is 1 on tokens the
// policy generated and 0 on prompt / tool / environment tokens; only 0 and 1 are accepted.
//
// Numerics. Inputs are float32; every intermediate is double and every sum runs in index order
// (token order, sample order), so the same inputs give the same bits whatever the caller. Per-token
// outputs are rounded to float32 once at the end; scalar outputs stay double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "miles/status.h"

namespace miles::rl {

// ---- advantages
// ------------------------------------------------------------------------------------

enum class AdvantageEstimator {
  // (r - mean_g) / (std_g + eps) with std unbiased (torch.std), or r - mean_g without
  // std_normalize.
  kGrpo,
  // r - mean_g: GRPO without the std division (Dr.GRPO's other half is LossReduction::kConstant).
  kDrGrpo,
  // r broadcast to the sample's tokens, then whitened over all masked tokens of the batch.
  kReinforcePlusPlus,
  // r - mean_g broadcast to the sample's tokens, then whitened over all masked tokens of the batch.
  kReinforcePlusPlusBaseline,
};

struct AdvantageConfig {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  bool std_normalize = true;  // kGrpo only: divide by (std + std_eps)
  double std_eps = 1e-6;      // added to the group std (slime: 1e-6)
  double whiten_eps = 1e-8;   // REINFORCE++: (x - mean) / sqrt(var + whiten_eps), var unbiased
  Status validate() const;
};

// rewards: (num_samples) one scalar per sample. group_index: (num_samples) samples with equal
// values form a group (any order, any ids). offsets: (num_samples + 1). loss_mask:
// (offsets.back()). Returns (offsets.back()) per-token advantages; tokens with loss_mask 0 get 0.
// A group of one sample has std 0 by definition (torch would give nan), so its GRPO advantage is 0.
Result<std::vector<float>> compute_advantages(const AdvantageConfig& config,
                                              std::span<const float> rewards,
                                              std::span<const int64_t> group_index,
                                              std::span<const int64_t> offsets,
                                              std::span<const float> loss_mask);

// ---- losses
// ----------------------------------------------------------------------------------------

enum class PolicyLossKind {
  kPpoClip,  // per-token ratio exp(logp - old_logp)
  kGspo,     // per-sample ratio exp(mean over the sample's masked tokens of (logp - old_logp))
};
enum class KlEstimator { kNone, kK1, kK2, kK3 };
enum class LossReduction {
  // sum_t m_t l_t / D, D = token_normaliser if > 0 else the batch's masked token count. Give the
  // global
  // masked token count (all DP ranks, all micro-batches) to normalise by it.
  kTokenMean,
  // sum_s (sum_{t in s} m_t l_t / max(n_s, 1)) / S, n_s = the sample's masked token count,
  // S = sample_normaliser if > 0 else the batch's sample count. Give 1 for slime's
  // sum_of_sample_mean,
  // or the global number of samples.
  kSampleMean,
  // sum_t m_t l_t / constant_normaliser (Dr.GRPO: e.g. max response length x number of samples).
  kConstant,
};
enum class IsCorrection {
  kNone,
  kTis,          // pg term x min(w_t, tis_c), w_t = exp(old_logp - rollout_logp)
  kMisToken,     // drop tokens with w_t outside [mis_low, mis_high]
  kMisSequence,  // drop samples whose exp(mean over masked tokens of (old_logp - rollout_logp))
                 // leaves it
};

struct LossConfig {
  PolicyLossKind policy = PolicyLossKind::kPpoClip;
  double eps_low = 0.2;  // ratio clipped to [1 - eps_low, 1 + eps_high] (DAPO clip-higher)
  double eps_high = 0.2;
  double dual_clip_c = 0.0;  // 0 = off; else > 1: for A < 0 the per-token loss is at most -c A
  KlEstimator kl = KlEstimator::kNone;
  double kl_coef = 0.0;       // loss += kl_coef * kl_loss
  double entropy_coef = 0.0;  // loss -= entropy_coef * entropy_loss
  LossReduction reduction = LossReduction::kTokenMean;
  double token_normaliser = 0.0;     // kTokenMean: 0 = local masked token count
  double sample_normaliser = 0.0;    // kSampleMean: 0 = local sample count
  double constant_normaliser = 0.0;  // kConstant: required, > 0
  IsCorrection correction = IsCorrection::kNone;
  double tis_c = 2.0;    // kTis truncation, > 0
  double mis_low = 0.5;  // kMis*: keep w in [mis_low, mis_high], 0 <= low <= high
  double mis_high = 2.0;
  Status validate() const;
};

// Views over one batch (see the layout above). Optional arrays may be empty: ref_logp unless kl is
// set, entropy unless entropy_coef != 0, rollout_logp unless a correction is set (without it the
// mismatch metrics are 0), advantages for sft_loss.
struct TokenBatch {
  std::span<const int64_t> offsets;  // (num_samples + 1)
  std::span<const float> logp;       // (T) trainer logprobs of the current policy: the only input
                                     //     that carries gradient
  std::span<const float> old_logp;   // (T) behaviour policy, the ratio's denominator
  std::span<const float> ref_logp;   // (T) reference model, for the KL term
  std::span<const float>
      rollout_logp;                   // (T) from the rollout engine, for IS corrections and metrics
  std::span<const float> entropy;     // (T) per-token entropy of the current policy, nats
  std::span<const float> advantages;  // (T) from compute_advantages
  std::span<const float> loss_mask;   // (T) 0 or 1
};

// Metrics. All means are over tokens with loss_mask 1 (before corrections), unweighted.
struct LossMetrics {
  double ppo_kl = 0;         // mean(old_logp - logp)
  double clipfrac = 0;       // fraction of tokens whose ratio clip is active (loss_clipped > loss)
  double dual_clipfrac = 0;  // fraction of tokens where the dual clip bound -c A is taken
  double rollout_abs_diff_mean = 0;  // mean |old_logp - rollout_logp|
  double rollout_abs_diff_max = 0;   // max |old_logp - rollout_logp|
  double rollout_kl =
      0;  // KL(rollout || train), k3 estimate: mean(w - 1 - log w), w = exp(old - rollout)
  double is_ess = 0;           // (sum w)^2 / (N sum w^2), untruncated w; 1 when train == rollout
  double correction_frac = 0;  // fraction of tokens truncated (TIS: w > tis_c) or dropped (MIS)
  int64_t num_tokens = 0;      // masked tokens in the batch
};

struct LossResult {
  double loss = 0;              // pg_loss + kl_coef * kl_loss - entropy_coef * entropy_loss
  double pg_loss = 0;           // reduced policy-gradient (or NLL, for sft_loss) term
  double kl_loss = 0;           // reduced KL estimator, before kl_coef
  double entropy_loss = 0;      // reduced entropy, before entropy_coef
  std::vector<float> dlogp;     // (T) d loss / d logp
  std::vector<float> dentropy;  // (T) d loss / d entropy (zeros when entropy_coef == 0)
  LossMetrics metrics;
};

// The PPO / GSPO loss with its KL, entropy and correction terms and its gradient. A token dropped
// by a MIS correction contributes to no term; TIS weights multiply the policy-gradient term only;
// neither changes a denominator.
Result<LossResult> policy_loss(const LossConfig& config, const TokenBatch& batch);

// Supervised fine-tuning: per-token loss -logp with config.reduction (its normalisers); the policy,
// KL, entropy and correction fields are ignored. pg_loss holds the NLL. Needs offsets, logp,
// loss_mask.
Result<LossResult> sft_loss(const LossConfig& config, const TokenBatch& batch);

}  // namespace miles::rl
