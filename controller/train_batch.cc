// make_train_batch / loss_config (train_batch.h).
#include "controller/train_batch.h"

namespace miles::controller {

namespace {

Result<rl::AdvantageConfig> advantage_config(const AlgorithmSection& a) {
  rl::AdvantageConfig c;
  if (a.advantage == "grpo")
    c.estimator = rl::AdvantageEstimator::kGrpo;
  else if (a.advantage == "dr_grpo")
    c.estimator = rl::AdvantageEstimator::kDrGrpo;
  else if (a.advantage == "reinforce_pp")
    c.estimator = rl::AdvantageEstimator::kReinforcePlusPlus;
  else if (a.advantage == "reinforce_pp_baseline")
    c.estimator = rl::AdvantageEstimator::kReinforcePlusPlusBaseline;
  else
    return Status::Error("algorithm.advantage: unknown estimator '" + a.advantage + "'");
  c.std_normalize = a.std_normalize;
  MILES_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace

Result<rl::LossConfig> loss_config(const AlgorithmSection& a) {
  rl::LossConfig c;
  if (a.policy_loss == "ppo")
    c.policy = rl::PolicyLossKind::kPpoClip;
  else if (a.policy_loss == "gspo")
    c.policy = rl::PolicyLossKind::kGspo;
  else
    return Status::Error("algorithm.policy_loss: unknown '" + a.policy_loss + "'");
  c.eps_low = a.eps_clip;
  c.eps_high = a.eps_clip_high;
  c.dual_clip_c = a.dual_clip_c;
  if (a.kl_estimator == "none")
    c.kl = rl::KlEstimator::kNone;
  else if (a.kl_estimator == "k1")
    c.kl = rl::KlEstimator::kK1;
  else if (a.kl_estimator == "k2")
    c.kl = rl::KlEstimator::kK2;
  else if (a.kl_estimator == "k3")
    c.kl = rl::KlEstimator::kK3;
  else
    return Status::Error("algorithm.kl_estimator: unknown '" + a.kl_estimator + "'");
  c.kl_coef = a.kl_coef;
  c.entropy_coef = a.entropy_coef;
  if (a.loss_reduction == "token_mean")
    c.reduction = rl::LossReduction::kTokenMean;
  else if (a.loss_reduction == "sample_mean")
    c.reduction = rl::LossReduction::kSampleMean;
  else if (a.loss_reduction == "constant")
    c.reduction = rl::LossReduction::kConstant;
  else
    return Status::Error("algorithm.loss_reduction: unknown '" + a.loss_reduction + "'");
  c.constant_normaliser = a.constant_normaliser;
  if (a.correction == "none")
    c.correction = rl::IsCorrection::kNone;
  else if (a.correction == "tis")
    c.correction = rl::IsCorrection::kTis;
  else if (a.correction == "mis_token")
    c.correction = rl::IsCorrection::kMisToken;
  else if (a.correction == "mis_sequence")
    c.correction = rl::IsCorrection::kMisSequence;
  else
    return Status::Error("algorithm.correction: unknown '" + a.correction + "'");
  c.tis_c = a.tis_c;
  c.mis_low = a.mis_low;
  c.mis_high = a.mis_high;
  MILES_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<TrainBatch> make_train_batch(const std::vector<RolloutGroup>& groups,
                                    const AlgorithmSection& algorithm) {
  TrainBatch b;
  std::vector<int64_t> offsets = {0};
  std::vector<float> mask;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const RolloutGroup& g = groups[gi];
    for (const RolloutSample& s : g.samples) {
      if (s.tokens.empty())
        return Status::Error("prompt row " + std::to_string(g.prompt->row) + " sample " +
                             std::to_string(s.index) + " has no response token");
      TrainSample t;
      RlSampleData d;
      if (!s.trajectory.empty()) {
        // A multi-turn session: the exact record; environment turns carry mask 0.
        t.tokens = s.trajectory;
        t.response_length = static_cast<int64_t>(s.trajectory.size()) - s.response_start;
        t.loss_mask = s.trajectory_mask;
        d.old_logp = s.trajectory_logp;
      } else {
        t.tokens = g.prompt->ids;
        for (const TokenOutput& tok : s.tokens) {
          t.tokens.push_back(tok.id);
          d.old_logp.push_back(tok.raw_logprob);
        }
        t.response_length = static_cast<int64_t>(s.tokens.size());
        t.loss_mask.assign(s.tokens.size(), 1.0f);
      }
      d.rollout_logp = d.old_logp;
      t.routed_experts = s.routed_experts;
      mask.insert(mask.end(), t.loss_mask.begin(), t.loss_mask.end());
      offsets.push_back(offsets.back() + t.response_length);
      b.rewards.push_back(static_cast<float>(s.reward.score));
      b.group_index.push_back(static_cast<int64_t>(gi));
      b.versions.push_back(s.min_version());
      b.samples.push_back(std::move(t));
      b.data.push_back(std::move(d));
    }
  }
  MILES_ASSIGN_OR_RETURN(rl::AdvantageConfig ac, advantage_config(algorithm));
  MILES_ASSIGN_OR_RETURN(std::vector<float> adv,
                         rl::compute_advantages(ac, b.rewards, b.group_index, offsets, mask));
  for (size_t i = 0; i < b.data.size(); ++i)
    b.data[i].advantages.assign(adv.begin() + offsets[i], adv.begin() + offsets[i + 1]);
  return b;
}

}  // namespace miles::controller
