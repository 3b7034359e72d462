// RlJob::train_step (rl_job_internal.h): one rollout step's stages — train, publish and sync,
// measure (step_metrics.h), log, checkpoint.
#include <cmath>
#include <cstdio>
#include <filesystem>
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
std::string dynamic_sampling_note(const StepTiming& t, int64_t kept) {
  char note[160];
  std::snprintf(note, sizeof note, "  groups %lld/%lld (%lld no signal, %lld cancelled%s)",
                static_cast<long long>(kept), static_cast<long long>(t.launched),
                static_cast<long long>(t.filtered), static_cast<long long>(t.cancelled),
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
Status log_tensorboard(TensorBoardLog& tb, const StepMetrics& step_metrics, const json& metrics,
                       const std::vector<RolloutGroup>& groups, const TrainBatch& batch) {
  const int64_t step = step_metrics.step;
  const std::vector<double>& mismatch_hist = step_metrics.train.mismatch_hist;
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
  mm.max = step_metrics.train.mismatch_max;
  mm.sum = step_metrics.train.mismatch_mean * mm.num;
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

// One step as its stages: train (rollout and score happened in the schedule), publish and sync,
// measure, log, checkpoint.
Status RlJob::train_step(std::vector<RolloutGroup> groups, StepTiming& timing,
                         const SyncPlan& plan) {
  const int64_t version_before = group_->trainer().steps_done();
  MILES_ASSIGN_OR_RETURN(TrainBatch batch, make_train_batch(groups, cfg_.algorithm));
  MILES_ASSIGN_OR_RETURN(TrainStats trained, train_stage(batch));
  MILES_ASSIGN_OR_RETURN(const double sync_s, sync_stage(plan));
  ++rollout_step_;
  StepMetrics m;
  m.step = rollout_step_;
  m.weight_version = group_->trainer().steps_done();
  m.mode = cfg_.async.mode;
  m.rollout = rollout_stats(groups, version_before);
  m.train = std::move(trained);
  m.timing = timing;
  m.sync_s = sync_s;
  m.step_s = seconds_since(last_step_end_);
  last_step_end_ = Clock::now();
  m.pool = engines_->counters();
  if (cfg_.rollout.speculative) {
    // Since the last step (an engine restarted meanwhile starts again from 0).
    const SpecCounters now = engines_->spec_counters();
    auto since = [](uint64_t a, uint64_t b) { return a >= b ? a - b : a; };
    m.spec = SpecCounters{since(now.verifies, last_spec_.verifies),
                          since(now.draft_tokens, last_spec_.draft_tokens),
                          since(now.accepted_tokens, last_spec_.accepted_tokens),
                          since(now.emitted_tokens, last_spec_.emitted_tokens)};
    m.speculative = true;
    last_spec_ = now;
  }
  MILES_RETURN_IF_ERROR(log_stage(m, groups, batch));
  return checkpoint_if_due(rollout_step_ == cfg_.rollout.num_rollouts || should_stop());
}

Result<TrainStats> RlJob::train_stage(TrainBatch& b) {
  const auto t_train = Clock::now();
  Trainer& local = group_->trainer();
  if (cfg_.algorithm.old_logp == OldLogp::kRecompute) {
    MILES_ASSIGN_OR_RETURN(auto scored, local.score(b.samples, /*replay=*/true));
    for (size_t i = 0; i < b.data.size(); ++i) b.data[i].old_logp = scored[i].logp;
  }
  if (reference_) {
    MILES_ASSIGN_OR_RETURN(auto ref, reference_->score(b.samples, /*replay=*/true));
    for (size_t i = 0; i < b.data.size(); ++i) b.data[i].ref_logp = ref[i].logp;
  }
  MILES_ASSIGN_OR_RETURN(TrainOutcome trained, group_->train(b.samples, b.data));
  return train_stats(trained, seconds_since(t_train));
}

Result<double> RlJob::sync_stage(const SyncPlan& plan) {
  if (plan.before_sync) MILES_RETURN_IF_ERROR(plan.before_sync());
  const auto t_sync = Clock::now();
  if (plan.sync) {
    MILES_ASSIGN_OR_RETURN(const Trainer* full, group_->full());
    MILES_RETURN_IF_ERROR(publisher_->publish(full->steps_done(), *full));
    MILES_RETURN_IF_ERROR(sync_engines(*full, plan.pause));
  }
  return seconds_since(t_sync);
}

Status RlJob::log_stage(const StepMetrics& m, const std::vector<RolloutGroup>& groups,
                        const TrainBatch& batch) {
  json line = m.to_json();
  if (eval_due()) {
    MILES_ASSIGN_OR_RETURN(json e, evaluate_and_log());
    line.update(e);
  }
  MILES_RETURN_IF_ERROR(metrics_->write(line));
  if (tensorboard_) MILES_RETURN_IF_ERROR(log_tensorboard(*tensorboard_, m, line, groups, batch));
  if (samples_) MILES_RETURN_IF_ERROR(samples_->write(m.step, groups, batch, *res_.tokenizer));
  const int64_t report_every = cfg_.logging.report_every;
  if (report_every > 0 && m.step % report_every == 0) write_live_report(/*live=*/true);
  reward_means_.push_back(m.rollout.reward_mean);
  last_reward_ = m.rollout.reward_mean;
  show_step_line(m);
  return Status::Ok();
}

void RlJob::show_step_line(const StepMetrics& m) {
  const RolloutStats& r = m.rollout;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %lld/%lld  reward %.3f ± %.3f  len %.1f  loss %.4f  |Δlogp| max %.2g  "
                "stale %.1f  %.2fs (gen %.2f train %.2f sync %.2f idle %.2f)",
                static_cast<long long>(m.step), static_cast<long long>(cfg_.rollout.num_rollouts),
                r.reward_mean, r.reward_std, r.length_mean, m.train.loss, m.train.mismatch_max,
                r.staleness_mean, m.step_s, m.timing.generate_s, m.train.seconds, m.sync_s,
                m.timing.idle_s);
  std::string shown = line;
  if (cfg_.rollout.filter_zero_variance) shown += dynamic_sampling_note(m.timing, r.groups);
  metrics_->show(m.step, shown);
  if (r.rollout_errors > 0)
    log_line("step " + std::to_string(m.step) + ": " + std::to_string(r.rollout_errors) +
             " sample(s) failed in the rollout function (kept in the sample dump, not trained); "
             "the first: " +
             r.first_rollout_error);
  if (m.timing.filled_with_filtered)
    log_line("step " + std::to_string(m.step) + ": only " +
             std::to_string(r.groups - m.timing.without_signal) + " of " +
             std::to_string(m.timing.launched) +
             " groups drawn carried signal (rewards not all equal); the batch was filled with "
             "groups whose advantages are all zero. The task looks saturated (or unreachable) "
             "for this policy: make it harder, change the reward, or stop the run");
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
  MILES_RETURN_IF_ERROR(
      SampleDump::write_eval(cfg_.logging.run_dir, rollout_step_, r.groups, *res_.tokenizer));
  r.groups.clear();                          // evals_ keeps the figures
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
  // The policy's tokenizer beside its weights: a checkpoint is a model directory to serve or eval.
  if (std::filesystem::is_directory(cfg_.model.path)) so.tokenizer_dir = cfg_.model.path;
  so.overwrite = true;
  const std::string dir = c.dir + "/" + checkpoint_dir_name(rollout_step_);
  MILES_RETURN_IF_ERROR(save_checkpoint(dir, *full, st, so));
  log_line("checkpoint " + dir);
  return Status::Ok();
}

}  // namespace miles::controller
