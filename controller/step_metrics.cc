// StepMetrics (step_metrics.h): measuring a step's samples and training, and the metrics line.
#include "controller/step_metrics.h"

#include <algorithm>
#include <cmath>

#include "miles/trainer/rl_objective.h"

namespace miles::controller {

using nlohmann::json;

RolloutStats rollout_stats(const std::vector<RolloutGroup>& groups, int64_t version_before) {
  RolloutStats r;
  double rsum = 0, rsq = 0, len_sum = 0, stale_sum = 0, turns_sum = 0, truncated = 0;
  std::map<std::string, double> parts;
  for (const RolloutGroup& g : groups) {
    r.continuations += g.continuations;
    for (const RolloutSample& s : g.samples) {
      ++r.samples;
      rsum += s.reward.score;
      rsq += s.reward.score * s.reward.score;
      const double len = static_cast<double>(s.tokens.size());
      len_sum += len;
      r.tokens += static_cast<int64_t>(len);
      r.length_max = std::max(r.length_max, len);
      truncated += s.finish_reason == "length";
      r.reward_errors += !s.reward.error.empty();
      for (const auto& [name, v] : s.reward.parts) parts[name] += v;
      int64_t vmax = s.min_version();
      for (const TokenOutput& t : s.tokens) vmax = std::max(vmax, t.weight_version);
      r.multi_version += vmax != s.min_version();  // a partial rollout across a weight update
      r.multi_turn += s.turns > 1;
      r.append_errors += !s.append_error.empty();
      if (s.failed() && r.rollout_errors++ == 0) r.first_rollout_error = s.rollout_error;
      turns_sum += static_cast<double>(s.turns);
      const double stale = static_cast<double>(
          version_before - (s.tokens.empty() ? g.min_version() : s.min_version()));
      stale_sum += stale;
      r.staleness_max = std::max(r.staleness_max, stale);
    }
  }
  r.groups = static_cast<int64_t>(groups.size());
  const double n = static_cast<double>(std::max<int64_t>(r.samples, 1));
  r.reward_mean = rsum / n;
  r.reward_std = std::sqrt(std::max(0.0, rsq / n - r.reward_mean * r.reward_mean));
  r.length_mean = len_sum / n;
  r.truncated_frac = truncated / n;
  r.staleness_mean = stale_sum / n;
  r.turns_mean = turns_sum / n;
  for (const auto& [name, v] : parts) r.reward_part_means[name] = v / n;
  return r;
}

TrainStats train_stats(const TrainOutcome& outcome, double seconds) {
  TrainStats t;
  t.loss = outcome.loss;
  t.grad_norm = outcome.grad_norm;
  t.lr = outcome.lr;
  t.mismatch_max = outcome.mismatch_max;
  t.seconds = seconds;
  std::map<std::string, double> sums = outcome.sums;
  const double tokens = sums["mismatch_tokens"];
  t.mismatch_mean = tokens > 0 ? sums["mismatch_abs_sum"] / tokens : 0.0;
  t.mismatch_nonzero_frac = tokens > 0 ? sums["mismatch_nonzero"] / tokens : 0.0;
  for (const char* k : {"mismatch_tokens", "mismatch_abs_sum", "mismatch_nonzero"}) sums.erase(k);
  t.mismatch_hist.assign(kMismatchBuckets, 0.0);
  for (int k = 0; k < kMismatchBuckets; ++k) {
    const std::string key = "mismatch_hist_" + std::to_string(k);
    t.mismatch_hist[k] = sums[key];
    sums.erase(key);
  }
  t.objective = rl_step_metrics(sums);
  return t;
}

json StepMetrics::to_json() const {
  const RolloutStats& r = rollout;
  const double gen_s = timing.generate_s;
  json m = {{"step", step},
            {"weight_version", weight_version},
            {"mode", name_of(mode)},
            {"samples", r.samples},
            {"groups", r.groups},
            {"reward_mean", r.reward_mean},
            {"reward_std", r.reward_std},
            {"reward_errors", r.reward_errors},
            {"response_length_mean", r.length_mean},
            {"response_length_max", r.length_max},
            {"truncated_frac", r.truncated_frac},
            {"staleness_mean", r.staleness_mean},
            {"staleness_max", r.staleness_max},
            {"groups_launched", timing.launched},
            {"groups_filtered", timing.filtered},
            {"groups_cancelled", timing.cancelled},
            {"groups_stale_dropped", timing.stale_dropped},
            {"groups_stale_retried", timing.stale_retried},
            {"filled_with_filtered", timing.filled_with_filtered},
            {"groups_without_signal", timing.without_signal},
            {"continued_samples", r.continuations},
            {"multi_version_samples", r.multi_version},
            {"multi_turn_samples", r.multi_turn},
            {"turns_mean", r.turns_mean},
            {"session_append_errors", r.append_errors},
            {"rollout_errors", r.rollout_errors},
            {"loss", train.loss},
            {"grad_norm", train.grad_norm},
            {"lr", train.lr},
            {"logp_abs_diff_mean", train.mismatch_mean},
            {"logp_abs_diff_max", train.mismatch_max},
            {"logp_diff_nonzero_frac", train.mismatch_nonzero_frac},
            {"time_step_s", step_s},
            {"time_generate_s", gen_s},
            {"time_train_s", train.seconds},
            {"time_sync_s", sync_s},
            {"time_idle_s", timing.idle_s},
            {"rollout_tokens_per_s", gen_s > 0 ? static_cast<double>(r.tokens) / gen_s : 0.0},
            {"train_tokens_per_s",
             train.seconds > 0 ? static_cast<double>(r.tokens) / train.seconds : 0.0},
            {"samples_per_s", step_s > 0 ? static_cast<double>(r.samples) / step_s : 0.0},
            {"engine_failures", pool.failures},
            {"engine_restarts", pool.restarts},
            {"groups_redispatched", pool.redispatched}};
  if (speculative) {
    m["spec_verifies"] = spec.verifies;
    m["spec_draft_tokens"] = spec.draft_tokens;
    m["spec_accepted_tokens"] = spec.accepted_tokens;
    m["spec_emitted_tokens"] = spec.emitted_tokens;
    m["spec_accept_rate"] =
        spec.draft_tokens ? static_cast<double>(spec.accepted_tokens) / spec.draft_tokens : 0.0;
    m["spec_tokens_per_verify"] =
        spec.verifies ? static_cast<double>(spec.emitted_tokens) / spec.verifies : 0.0;
  }
  for (const auto& [name, v] : r.reward_part_means) m["reward_" + name + "_mean"] = v;
  for (const auto& [name, v] : train.objective) m[name] = v;
  return m;
}

}  // namespace miles::controller
