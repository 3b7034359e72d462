// rl_objective: a micro-batch's TokenView → rl::TokenBatch → rl::policy_loss (rl_objective.h).
#include "miles/trainer/rl_objective.h"

#include <algorithm>
#include <cmath>

#include "miles/draft_head.h"

namespace miles {

namespace {

// Concatenates field(sample) for the micro-batch's samples.
template <typename Field>
std::vector<float> gather(std::span<const int64_t> samples, Field field) {
  std::vector<float> out;
  for (int64_t s : samples) {
    const std::vector<float>& v = field(s);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

Status check_data(std::span<const TrainSample> batch, std::span<const RlSampleData> data,
                  const rl::LossConfig& c) {
  if (data.size() != batch.size())
    return Status::Error("RL data for " + std::to_string(data.size()) + " samples, batch has " +
                         std::to_string(batch.size()));
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t r = batch[i].response_length;
    const std::string at = "sample " + std::to_string(i) + ": ";
    auto need = [&](const std::vector<float>& v, const char* name, bool required) -> Status {
      if (!required && v.empty()) return Status::Ok();
      if (v.size() != r)
        return Status::Error(at + name + " has " + std::to_string(v.size()) +
                             " values, expected response_length " + std::to_string(r));
      return Status::Ok();
    };
    MILES_RETURN_IF_ERROR(need(data[i].old_logp, "old_logp", true));
    MILES_RETURN_IF_ERROR(need(data[i].advantages, "advantages", true));
    MILES_RETURN_IF_ERROR(need(data[i].ref_logp, "ref_logp", c.kl != rl::KlEstimator::kNone));
    MILES_RETURN_IF_ERROR(
        need(data[i].rollout_logp, "rollout_logp", c.correction != rl::IsCorrection::kNone));
  }
  return Status::Ok();
}

}  // namespace

Result<TokenObjective> rl_objective(std::span<const TrainSample> batch,
                                    std::span<const RlSampleData> data, rl::LossConfig c) {
  MILES_RETURN_IF_ERROR(c.validate());
  MILES_RETURN_IF_ERROR(check_data(batch, data, c));
  double masked = 0;
  for (const TrainSample& s : batch)
    for (float m : s.loss_mask) masked += m;
  if (c.token_normaliser == 0) c.token_normaliser = std::max(masked, 1.0);
  if (c.sample_normaliser == 0) c.sample_normaliser = static_cast<double>(batch.size());
  const bool has_ref = !data.empty() && !data[0].ref_logp.empty();
  const bool has_rollout = !data.empty() && !data[0].rollout_logp.empty();
  return TokenObjective(
      [batch, data, c, has_ref, has_rollout](const TokenView& v) -> Result<TokenLoss> {
        const std::vector<float> old = gather(
            v.samples, [&](int64_t s) -> auto& { return data[s].old_logp; });
        const std::vector<float> adv = gather(
            v.samples, [&](int64_t s) -> auto& { return data[s].advantages; });
        const std::vector<float> mask = gather(
            v.samples, [&](int64_t s) -> auto& { return batch[s].loss_mask; });
        std::vector<float> ref, roll;
        if (has_ref)
          ref = gather(
              v.samples, [&](int64_t s) -> auto& { return data[s].ref_logp; });
        if (has_rollout)
          roll = gather(
              v.samples, [&](int64_t s) -> auto& { return data[s].rollout_logp; });
        rl::TokenBatch tb{v.offsets, v.logp, old, ref, roll, v.entropy, adv, mask};
        MILES_ASSIGN_OR_RETURN(rl::LossResult r, rl::policy_loss(c, tb));
        TokenLoss l;
        l.loss = r.loss;
        l.dlogp = std::move(r.dlogp);
        if (c.entropy_coef != 0) l.dentropy = std::move(r.dentropy);
        const double n = static_cast<double>(r.metrics.num_tokens);
        l.sums["metric_tokens"] = n;
        l.sums["ppo_kl"] = r.metrics.ppo_kl * n;
        l.sums["clipfrac"] = r.metrics.clipfrac * n;
        l.sums["rollout_abs_diff_mean"] = r.metrics.rollout_abs_diff_mean * n;
        l.sums["rollout_kl"] = r.metrics.rollout_kl * n;
        if (has_rollout) {  // ESS of the IS weights w = exp(old − rollout), from Σw and Σw²
          double w1 = 0, w2 = 0;
          for (size_t i = 0; i < mask.size(); ++i) {
            if (mask[i] == 0.0f) continue;
            const double w = std::exp(static_cast<double>(old[i]) - roll[i]);
            w1 += w;
            w2 += w * w;
          }
          l.sums["is_w_sum"] = w1;
          l.sums["is_w2_sum"] = w2;
        }
        if (!v.entropy.empty()) {  // the policy's mean entropy over the trained tokens
          double h = 0;
          for (size_t i = 0; i < mask.size(); ++i)
            if (mask[i] != 0.0f) h += v.entropy[i];
          l.sums["entropy_sum"] = h;
        }
        l.sums["correction_frac"] = r.metrics.correction_frac * n;
        l.sums["pg_loss"] = r.pg_loss;
        l.sums["kl_loss"] = r.kl_loss;
        l.sums["entropy_loss"] = r.entropy_loss;
        return l;
      });
}

std::map<std::string, double> rl_step_metrics(const std::map<std::string, double>& sums) {
  std::map<std::string, double> m;
  auto get = [&](const std::string& k) {
    auto it = sums.find(k);
    return it == sums.end() ? 0.0 : it->second;
  };
  const double n = get("metric_tokens");
  for (const char* k :
       {"ppo_kl", "clipfrac", "rollout_abs_diff_mean", "rollout_kl", "correction_frac"})
    m[k] = n > 0 ? get(k) / n : 0.0;
  const double w1 = get("is_w_sum"), w2 = get("is_w2_sum");
  m["is_ess"] = n > 0 && w2 > 0 ? w1 * w1 / (n * w2) : 1.0;
  if (sums.count("entropy_sum")) m["entropy"] = n > 0 ? get("entropy_sum") / n : 0.0;
  for (const char* k : {"pg_loss", "kl_loss", "entropy_loss"}) m[k] = get(k);
  m["tokens"] = n;
  // The co-trained draft head (TrainerConfig::draft): means over the rows it trained on.
  // Training-time test passes 2, 3, …: draft_<name>_<p> over pass p's rows.
  for (int p = 1; p <= DraftHead::kMaxPasses; ++p) {
    const std::string suffix = p == 1 ? "" : "_" + std::to_string(p);
    if (const double d = get("draft_rows" + suffix); d > 0)
      for (const char* k : {"draft_loss", "draft_agree", "draft_accept", "draft_in_vocab"})
        m[k + suffix] = get(k + suffix) / d;
  }
  return m;
}

}  // namespace miles
