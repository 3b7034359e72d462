// The RlJob class behind run_rl_job (rl_job.h): setup (rl_job.cc), the three schedules
// (rl_schedules.cc), one training step with its metrics (rl_step.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "controller/engine_pool.h"
#include "controller/evaluator.h"
#include "controller/group_batch.h"
#include "controller/group_runner.h"
#include "controller/job_runtime.h"
#include "controller/metrics_log.h"
#include "controller/prompt_data.h"
#include "controller/sample_dump.h"
#include "controller/step_metrics.h"
#include "controller/tensorboard_log.h"
#include "controller/train_batch.h"
#include "controller/weight_publisher.h"
#include "miles/controller/controller_service.h"
#include "miles/controller/reward.h"
#include "miles/controller/rl_job.h"
#include "miles/controller/trainer_group.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"

namespace miles::controller {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Whether a step publishes and syncs its weights, pausing the engines how, after what.
struct SyncPlan {
  bool sync = true;
  const PauseMode* pause = nullptr;     // async: engines keep generating through the update
  std::function<Status()> before_sync;  // one-step-off: wait for the next batch first
};

class RlJob {
 public:
  RlJob(const RunConfig& config, const RunResources& resources)
      : cfg_(config), res_(resources), rt_(config, [this](const std::string& s) { log_line(s); }) {}
  ~RlJob();
  Status setup();
  Result<RunSummary> run();
  // `miles check` (rl_check.cc): one rollout batch at version 0, scored by the trainer, one
  // optimizer step, a sync, the other layouts; the report (and whether every gate passed).
  Result<nlohmann::json> check();
  // `miles eval`: one evaluation of the loaded weights (a checkpoint's with checkpoint.resume).
  Result<EvalResult> evaluate_once();
  int64_t eval_k() const { return evaluator_ ? evaluator_->k() : 0; }

 private:
  // setup phases (rl_job.cc)
  Status start_service();
  Status setup_trainer();
  Status setup_engines();
  // schedules (rl_schedules.cc)
  Status run_sync();
  Status run_one_step_off();
  Status run_async();
  std::unique_ptr<GroupBatch> launch_batch();
  // one step (rl_step.cc), stage by stage: train on the groups, publish and sync (when `sync`),
  // measure, log (metrics.jsonl, TensorBoard, samples, report, console), checkpoint
  Status train_step(std::vector<RolloutGroup> groups, StepTiming& timing, const SyncPlan& plan);
  Result<TrainStats> train_stage(TrainBatch& batch);  // old / reference logp, optimizer steps
  Result<double> sync_stage(const SyncPlan& plan);    // its seconds
  Status log_stage(const StepMetrics& m, const std::vector<RolloutGroup>& groups,
                   const TrainBatch& batch);
  void show_step_line(const StepMetrics& m);
  Status sync_engines(const Trainer& full, const PauseMode* pause);
  Status checkpoint_if_due(bool final_step);
  // evaluation (rl_step.cc): due after this step (or before the first), logged to eval.jsonl,
  // TensorBoard and the console; the metrics' keys returned for the step's line
  bool eval_due() const;
  // RUN_DIR/report.html (logging.report_every): live pages reload themselves while the run goes on.
  static constexpr int kLiveReportRefreshS = 15;
  void write_live_report(bool live);
  Result<nlohmann::json> evaluate_and_log();
  void log_line(const std::string& line);
  bool should_stop() const;

  RunConfig cfg_;
  RunResources res_;
  JobRuntime rt_;                            // run dir, service, trainer group (destroyed last)
  TrainerRank* group_ = nullptr;             // rt_'s rank 0: this process
  std::unique_ptr<ThreadPool> pool_;         // the reference model's
  // What the service's threads may read while setup runs: set once it exists.
  std::atomic<WeightPublisher*> published_{nullptr};
  std::unique_ptr<Trainer> reference_;       // frozen initial policy for the KL term
  std::unique_ptr<RewardModel> rewards_;
  std::unique_ptr<PromptData> data_;
  std::unique_ptr<WeightPublisher> publisher_;
  std::unique_ptr<EnginePool> engines_;
  std::unique_ptr<RolloutFunction> rollout_function_;  // rollout.function, when set
  std::unique_ptr<GroupRunner> runner_;
  std::unique_ptr<MetricsLog> metrics_;
  std::optional<SampleDump> samples_;
  std::unique_ptr<TensorBoardLog> tensorboard_;  // null with logging.tensorboard: false
  std::unique_ptr<Evaluator> evaluator_;         // null without eval.data
  std::unique_ptr<MetricsLog> eval_log_;         // RUN_DIR/eval.jsonl
  std::vector<EvalResult> evals_;                // of this process

  int64_t rollout_step_ = 0;      // rollout steps done
  int64_t next_position_ = 0;     // next prompt stream position to launch
  int64_t trained_position_ = 0;  // stream position after the last trained batch (checkpoints)
  Clock::time_point last_step_end_;
  std::vector<double> reward_means_;  // of this process's steps
  std::atomic<double> last_reward_{0};
  SpecCounters last_spec_;  // the engines' speculative-decoding counters at the last step
};

}  // namespace miles::controller
