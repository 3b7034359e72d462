// make_train_batch / loss_config (train_batch.h).
#include "controller/train_batch.h"

#include <algorithm>

#include "miles/check.h"

namespace miles::controller {

namespace {

rl::AdvantageEstimator estimator_of(Advantage a) {
  switch (a) {
    case Advantage::kGrpo:
      return rl::AdvantageEstimator::kGrpo;
    case Advantage::kDrGrpo:
      return rl::AdvantageEstimator::kDrGrpo;
    case Advantage::kReinforcePp:
      return rl::AdvantageEstimator::kReinforcePlusPlus;
    case Advantage::kReinforcePpBaseline:
      return rl::AdvantageEstimator::kReinforcePlusPlusBaseline;
  }
  MILES_CHECK(false, "algorithm.advantage: an enumerator without an estimator");
}

rl::KlEstimator kl_of(KlEstimatorKind k) {
  switch (k) {
    case KlEstimatorKind::kNone:
      return rl::KlEstimator::kNone;
    case KlEstimatorKind::kK1:
      return rl::KlEstimator::kK1;
    case KlEstimatorKind::kK2:
      return rl::KlEstimator::kK2;
    case KlEstimatorKind::kK3:
      return rl::KlEstimator::kK3;
  }
  MILES_CHECK(false, "algorithm.kl_estimator: an enumerator without an estimator");
}

rl::LossReduction reduction_of(Reduction r) {
  switch (r) {
    case Reduction::kTokenMean:
      return rl::LossReduction::kTokenMean;
    case Reduction::kSampleMean:
      return rl::LossReduction::kSampleMean;
    case Reduction::kConstant:
      return rl::LossReduction::kConstant;
  }
  MILES_CHECK(false, "algorithm.loss_reduction: an enumerator without a reduction");
}

rl::IsCorrection correction_of(Correction c) {
  switch (c) {
    case Correction::kNone:
      return rl::IsCorrection::kNone;
    case Correction::kTis:
      return rl::IsCorrection::kTis;
    case Correction::kMisToken:
      return rl::IsCorrection::kMisToken;
    case Correction::kMisSequence:
      return rl::IsCorrection::kMisSequence;
  }
  MILES_CHECK(false, "algorithm.correction: an enumerator without a correction");
}

Result<rl::AdvantageConfig> advantage_config(const AlgorithmSection& a) {
  rl::AdvantageConfig c;
  c.estimator = estimator_of(a.advantage);
  c.std_normalize = a.std_normalize;
  MILES_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace

Result<rl::LossConfig> loss_config(const AlgorithmSection& a) {
  rl::LossConfig c;
  c.policy =
      a.policy_loss == PolicyLoss::kGspo ? rl::PolicyLossKind::kGspo : rl::PolicyLossKind::kPpoClip;
  c.eps_low = a.eps_clip;
  c.eps_high = a.eps_clip_high;
  c.dual_clip_c = a.dual_clip_c;
  c.kl = kl_of(a.kl_estimator);
  c.kl_coef = a.kl_coef;
  c.entropy_coef = a.entropy_coef;
  c.reduction = reduction_of(a.loss_reduction);
  c.constant_normaliser = a.constant_normaliser;
  c.correction = correction_of(a.correction);
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
  int64_t failed = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const RolloutGroup& g = groups[gi];
    for (const RolloutSample& s : g.samples) {
      if (!s.failed() && s.tokens.empty())
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
      } else if (s.failed()) {
        // A rollout function that failed before its first turn: the prompt alone, its last
        // token in the (masked) response slot.
        t.tokens = g.prompt->ids;
        t.response_length = 1;
        t.loss_mask = {0.0f};
        d.old_logp = {0.0f};
      } else {
        t.tokens = g.prompt->ids;
        for (const TokenOutput& tok : s.tokens) {
          t.tokens.push_back(tok.id);
          d.old_logp.push_back(tok.raw_logprob);
        }
        t.response_length = static_cast<int64_t>(s.tokens.size());
        t.loss_mask.assign(s.tokens.size(), 1.0f);
      }
      // A failed sample fills its slot of the batch but trains nothing: mask 0, a group of its
      // own (advantage 0; its group's statistics are the others').
      if (s.failed()) std::fill(t.loss_mask.begin(), t.loss_mask.end(), 0.0f);
      d.rollout_logp = d.old_logp;
      t.routed_experts = s.routed_experts;
      mask.insert(mask.end(), t.loss_mask.begin(), t.loss_mask.end());
      offsets.push_back(offsets.back() + t.response_length);
      b.rewards.push_back(s.failed() ? 0.0f : static_cast<float>(s.reward.score));
      b.group_index.push_back(s.failed() ? -1 - failed++ : static_cast<int64_t>(gi));
      b.versions.push_back(s.tokens.empty() ? g.min_version() : s.min_version());
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
