// RlJob::train_step (rl_job_internal.h): one rollout step's training, weight publish and sync,
// metrics line, checkpoint.
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>

#include "controller/rl_job_internal.h"
#include "controller/train_batch.h"
#include "miles/report/report.h"
#include "miles/trainer/rl_objective.h"
#include "miles/trainer/train_checkpoint.h"

namespace miles::controller {

using nlohmann::json;

namespace {

// Dynamic sampling on the step line: groups trained on of those drawn, and why the rest were not.
std::string dynamic_sampling_note(const StepTiming& t, size_t kept) {
  char note[160];
  std::snprintf(note, sizeof note, "  groups %zu/%lld (%lld no signal, %lld cancelled%s)", kept,
                static_cast<long long>(t.launched), static_cast<long long>(t.filtered),
                static_cast<long long>(t.cancelled),
                t.filled_with_filtered ? ", filled: saturated" : "");
  return note;
}

// "|" and line breaks would end a markdown table cell.
std::string table_cell(const std::string& text, size_t max_bytes = 400) {
  std::string out;
  for (char c : text.substr(0, max_bytes)) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += "<br>";
    else
      out += c;
  }
  return text.size() > max_bytes ? out + " …" : out;
}

// A step in TensorBoard: every number of the metrics line as a scalar (same names), histograms of
// the rewards, response lengths and |trainer − engine logp| per token, and a text table of the
// first sample of up to 4 groups.
Status log_tensorboard(TensorBoardLog& tb, int64_t step, const json& metrics,
                       const std::vector<RolloutGroup>& groups, const TrainBatch& batch,
                       const std::vector<double>& mismatch_hist) {
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    if (it.key() == "step" || !(it->is_number() || it->is_boolean())) continue;
    MILES_RETURN_IF_ERROR(
        tb.scalar(step, it.key(), it->is_boolean() ? it->get<bool>() : it->get<double>()));
  }
  std::vector<double> rewards(batch.rewards.begin(), batch.rewards.end()), lengths;
  for (const RolloutGroup& g : groups)
    for (const RolloutSample& s : g.samples)
      lengths.push_back(static_cast<double>(s.tokens.size()));
  MILES_RETURN_IF_ERROR(tb.histogram(step, "reward", make_histogram(rewards)));
  MILES_RETURN_IF_ERROR(tb.histogram(step, "response_length", make_histogram(lengths)));
  Histogram mm;
  for (int k = 0; k < kMismatchBuckets; ++k) {
    mm.limits.push_back(kMismatchLimits[k]);
    mm.counts.push_back(mismatch_hist[k]);
    mm.num += mismatch_hist[k];
  }
  mm.max = metrics.value("logp_abs_diff_max", 0.0);
  mm.sum = metrics.value("logp_abs_diff_mean", 0.0) * mm.num;
  MILES_RETURN_IF_ERROR(tb.histogram(step, "logp_abs_diff", mm));
  std::string table = "| group | sample | reward | response |\n|---|---|---|---|\n";
  for (size_t i = 0; i < groups.size() && i < 4; ++i) {
    if (groups[i].samples.empty()) continue;
    const RolloutSample& s = groups[i].samples.front();
    char reward[32];
    std::snprintf(reward, sizeof reward, "%.4g", s.reward.score);
    table += "| " + std::to_string(groups[i].position) + " | " + std::to_string(s.index) + " | " +
             reward + " | " + table_cell(s.response) + " |\n";
  }
  MILES_RETURN_IF_ERROR(tb.text(step, "samples", table));
  return tb.flush();
}

}  // namespace

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
  std::vector<double> mismatch_hist(kMismatchBuckets);
  for (int k = 0; k < kMismatchBuckets; ++k) {
    const std::string key = "mismatch_hist_" + std::to_string(k);
    mismatch_hist[k] = sums[key];
    sums.erase(key);
  }
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
            {"groups_without_signal", timing.without_signal},
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
  if (eval_due()) {
    MILES_ASSIGN_OR_RETURN(json e, evaluate_and_log());
    m.update(e);
  }
  MILES_RETURN_IF_ERROR(metrics_->write(m));
  if (tensorboard_) {
    MILES_RETURN_IF_ERROR(
        log_tensorboard(*tensorboard_, rollout_step_, m, groups, b, mismatch_hist));
  }
  if (samples_) {
    MILES_RETURN_IF_ERROR(samples_->write(rollout_step_, groups, b, *res_.tokenizer));
  }
  const int64_t report_every = cfg_.logging.report_every;
  if (report_every > 0 && rollout_step_ % report_every == 0) write_live_report(/*live=*/true);
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
  std::string shown = line;
  if (cfg_.rollout.filter_zero_variance) shown += dynamic_sampling_note(timing, groups.size());
  metrics_->show(rollout_step_, shown);
  if (timing.filled_with_filtered)
    log_line("step " + std::to_string(rollout_step_) + ": only " +
             std::to_string(static_cast<int64_t>(groups.size()) - timing.without_signal) + " of " +
             std::to_string(timing.launched) +
             " groups drawn carried signal (rewards not all equal); the batch was filled with "
             "groups whose advantages are all zero. The task looks saturated (or unreachable) "
             "for this policy: make it harder, change the reward, or stop the run");
  return checkpoint_if_due(rollout_step_ == cfg_.rollout.num_rollouts || should_stop());
}

void RlJob::write_live_report(bool live) {
  // The page is a view of the records: a failure to draw it is reported, never fatal to the run.
  auto r = report::write_report(cfg_.logging.run_dir, "", live ? kLiveReportRefreshS : 0);
  if (!r.ok()) log_line("report.html not written: " + r.message());
}

bool RlJob::eval_due() const {
  const int64_t every = cfg_.eval.every;
  return evaluator_ && every > 0 && !should_stop() &&
         (rollout_step_ % every == 0 || rollout_step_ == cfg_.rollout.num_rollouts);
}

Result<json> RlJob::evaluate_and_log() {
  MILES_ASSIGN_OR_RETURN(EvalResult r, evaluator_->run());
  const int64_t k = evaluator_->k();
  json e = r.metrics(k);
  json line = e;
  line["step"] = rollout_step_;
  line["eval_min_weight_version"] = r.min_version;
  MILES_RETURN_IF_ERROR(eval_log_->write(line));
  if (tensorboard_ && rollout_step_ == 0) {  // later evaluations ride on the step's scalars
    for (auto it = e.begin(); it != e.end(); ++it)
      MILES_RETURN_IF_ERROR(tensorboard_->scalar(0, it.key(), it->get<double>()));
    MILES_RETURN_IF_ERROR(tensorboard_->flush());
  }
  char text[256];
  std::snprintf(text, sizeof text,
                "eval after step %lld (weights v%lld): reward %.4f  pass@1 %.4f  pass@%lld %.4f  "
                "(%lld prompts × %lld, %.2fs)",
                static_cast<long long>(rollout_step_), static_cast<long long>(r.max_version),
                r.reward_mean, r.pass_at_1, static_cast<long long>(k), r.pass_at_k,
                static_cast<long long>(r.prompts), static_cast<long long>(k), r.seconds);
  metrics_->message(text);
  evals_.push_back(r);
  return e;
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
