// RlJob::train_step (rl_job_internal.h): one rollout step's training, weight publish and sync,
// metrics line, checkpoint.
#include <cmath>
#include <mutex>

#include "controller/rl_job_internal.h"
#include "controller/train_batch.h"
#include "miles/trainer/rl_objective.h"
#include "miles/trainer/train_checkpoint.h"

namespace miles::controller {

using nlohmann::json;

Status RlJob::sync_engines(const Trainer& full, const PauseMode* pause) {
  WeightPublisher* pub = publisher_.get();
  if (pub->broadcasts())
    return engines_->update_all_group(
        [pub, &full, pause](const std::vector<std::shared_ptr<EngineClient>>& engines) {
          return pub->broadcast(engines, full, pause);
        });
  return engines_->update_all([pub, pause](EngineClient& e) { return pub->bring(e, pause); });
}

Status RlJob::train_step(std::vector<RolloutGroup> groups, StepTiming& timing,
                         const SyncPlan& plan) {
  const auto t_train = Clock::now();
  Trainer& local = group_->trainer();
  const int64_t version_before = local.steps_done();
  MILES_ASSIGN_OR_RETURN(TrainBatch b, make_train_batch(groups, cfg_.algorithm));
  if (cfg_.algorithm.old_logp == OldLogp::kRecompute) {
    MILES_ASSIGN_OR_RETURN(auto scored, local.score(b.samples, /*replay=*/true));
    for (size_t i = 0; i < b.data.size(); ++i) b.data[i].old_logp = scored[i].logp;
  }
  if (reference_) {
    MILES_ASSIGN_OR_RETURN(auto ref, reference_->score(b.samples, /*replay=*/true));
    for (size_t i = 0; i < b.data.size(); ++i) b.data[i].ref_logp = ref[i].logp;
  }
  MILES_ASSIGN_OR_RETURN(TrainOutcome trained, group_->train(b.samples, b.data));
  std::map<std::string, double>& sums = trained.sums;
  const double mm_tokens = sums["mismatch_tokens"];
  const double mm_mean = mm_tokens > 0 ? sums["mismatch_abs_sum"] / mm_tokens : 0.0;
  const double mm_nonzero = mm_tokens > 0 ? sums["mismatch_nonzero"] / mm_tokens : 0.0;
  for (const char* k : {"mismatch_tokens", "mismatch_abs_sum", "mismatch_nonzero"}) sums.erase(k);
  const double train_s = seconds_since(t_train);

  if (plan.before_sync) MILES_RETURN_IF_ERROR(plan.before_sync());
  const auto t_sync = Clock::now();
  if (plan.sync) {
    MILES_ASSIGN_OR_RETURN(const Trainer* full, group_->full());
    MILES_RETURN_IF_ERROR(publisher_->publish(full->steps_done(), *full));
    MILES_RETURN_IF_ERROR(sync_engines(*full, plan.pause));
  }
  const double sync_s = seconds_since(t_sync);
  ++rollout_step_;

  // ---- metrics
  double rsum = 0, rsq = 0, len_sum = 0, len_max = 0, truncated = 0, errors = 0;
  double stale_sum = 0, stale_max = 0;
  std::map<std::string, double> parts;
  int64_t samples = 0, tokens = 0, continuations = 0, multi_version = 0, multi_turn = 0;
  double turns_sum = 0;
  int64_t append_errors = 0;
  for (const RolloutGroup& g : groups) {
    continuations += g.continuations;
    for (const RolloutSample& s : g.samples) {
      ++samples;
      rsum += s.reward.score;
      rsq += s.reward.score * s.reward.score;
      const double len = static_cast<double>(s.tokens.size());
      len_sum += len;
      tokens += static_cast<int64_t>(len);
      len_max = std::max(len_max, len);
      truncated += s.finish_reason == "length";
      errors += !s.reward.error.empty();
      for (const auto& [name, v] : s.reward.parts) parts[name] += v;
      int64_t vmax = s.min_version();
      for (const TokenOutput& t : s.tokens) vmax = std::max(vmax, t.weight_version);
      multi_version += vmax != s.min_version();  // a partial rollout across a weight update
      multi_turn += s.turns > 1;
      append_errors += !s.append_error.empty();
      turns_sum += static_cast<double>(s.turns);
      const double stale = static_cast<double>(version_before - s.min_version());
      stale_sum += stale;
      stale_max = std::max(stale_max, stale);
    }
  }
  const double n = std::max<int64_t>(samples, 1);
  const double mean = rsum / n;
  const double var = std::max(0.0, rsq / n - mean * mean);
  const double step_s = seconds_since(last_step_end_);
  last_step_end_ = Clock::now();
  const PoolCounters pc = engines_->counters();
  json m = {{"step", rollout_step_},
            {"weight_version", local.steps_done()},
            {"mode", name_of(cfg_.async.mode)},
            {"samples", samples},
            {"groups", static_cast<int64_t>(groups.size())},
            {"reward_mean", mean},
            {"reward_std", std::sqrt(var)},
            {"reward_errors", errors},
            {"response_length_mean", len_sum / n},
            {"response_length_max", len_max},
            {"truncated_frac", truncated / n},
            {"staleness_mean", stale_sum / n},
            {"staleness_max", stale_max},
            {"groups_launched", timing.launched},
            {"groups_filtered", timing.filtered},
            {"groups_cancelled", timing.cancelled},
            {"groups_stale_dropped", timing.stale_dropped},
            {"groups_stale_retried", timing.stale_retried},
            {"filled_with_filtered", timing.filled_with_filtered},
            {"continued_samples", continuations},
            {"multi_version_samples", multi_version},
            {"multi_turn_samples", multi_turn},
            {"turns_mean", turns_sum / n},
            {"session_append_errors", append_errors},
            {"loss", trained.loss},
            {"grad_norm", trained.grad_norm},
            {"lr", trained.lr},
            {"logp_abs_diff_mean", mm_mean},
            {"logp_abs_diff_max", trained.mismatch_max},
            {"logp_diff_nonzero_frac", mm_nonzero},
            {"time_step_s", step_s},
            {"time_generate_s", timing.generate_s},
            {"time_train_s", train_s},
            {"time_sync_s", sync_s},
            {"time_idle_s", timing.idle_s},
            {"rollout_tokens_per_s", timing.generate_s > 0 ? tokens / timing.generate_s : 0.0},
            {"train_tokens_per_s", train_s > 0 ? tokens / train_s : 0.0},
            {"samples_per_s", step_s > 0 ? samples / step_s : 0.0},
            {"engine_failures", pc.failures},
            {"engine_restarts", pc.restarts},
            {"groups_redispatched", pc.redispatched}};
  for (const auto& [name, v] : parts) m["reward_" + name + "_mean"] = v / n;
  for (const auto& [name, v] : rl_step_metrics(sums)) m[name] = v;
  MILES_RETURN_IF_ERROR(metrics_->write(m));
  reward_means_.push_back(mean);
  last_reward_ = mean;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %lld/%lld  reward %.3f ± %.3f  len %.1f  loss %.4f  |Δlogp| max %.2g  "
                "stale %.1f  %.2fs (gen %.2f train %.2f sync %.2f idle %.2f)",
                static_cast<long long>(rollout_step_),
                static_cast<long long>(cfg_.rollout.num_rollouts), mean, std::sqrt(var),
                len_sum / n, trained.loss, trained.mismatch_max, stale_sum / n, step_s,
                timing.generate_s, train_s, sync_s, timing.idle_s);
  metrics_->show(rollout_step_, line);
  return checkpoint_if_due(rollout_step_ == cfg_.rollout.num_rollouts || should_stop());
}

Status RlJob::checkpoint_if_due(bool final_step) {
  const CheckpointSection& c = cfg_.checkpoint;
  const bool due = (c.save_every > 0 && rollout_step_ % c.save_every == 0) ||
                   (final_step && (c.save_final || c.save_every > 0));
  if (!due) return Status::Ok();
  TrainState st;
  st.step = rollout_step_;
  st.data_position = trained_position_;
  st.rng_seed = cfg_.rollout.seed;
  MILES_ASSIGN_OR_RETURN(const Trainer* full, group_->full());
  st.extra_json = json{{"weight_version", full->steps_done()}}.dump();
  SaveOptions so;
  so.overwrite = true;
  const std::string dir = c.dir + "/" + checkpoint_dir_name(rollout_step_);
  MILES_RETURN_IF_ERROR(save_checkpoint(dir, *full, st, so));
  log_line("checkpoint " + dir);
  return Status::Ok();
}

}  // namespace miles::controller
