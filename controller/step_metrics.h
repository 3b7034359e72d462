// StepMetrics: what one RL step measured, typed — the rollout's samples and rewards, the training,
// each stage's time, the engine pool — and its one spelling as a metrics.jsonl line (to_json).
//
// Why: the stages of RlJob::train_step each fill their part; the metrics log, TensorBoard, the
// console line and the report read the same values, and a key is named in one place.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/engine_pool.h"
#include "controller/group_runner.h"
#include "miles/controller/run_config.h"
#include "miles/controller/trainer_group.h"

namespace miles::controller {

// What a schedule hands to the step besides the groups: the generate stage's time and how the
// batch was drawn.
struct StepTiming {
  double generate_s = 0, idle_s = 0;
  int64_t launched = 0, filtered = 0, cancelled = 0, stale_dropped = 0, stale_retried = 0;
  bool filled_with_filtered = false;
  int64_t without_signal = 0;  // groups trained on although they failed the filter (filled)
};

// The samples of the step: the rollout and score stages' output.
struct RolloutStats {
  int64_t samples = 0, groups = 0, tokens = 0;
  int64_t continuations = 0, multi_version = 0, multi_turn = 0, append_errors = 0;
  int64_t rollout_errors = 0;       // samples whose rollout function failed (not trained)
  std::string first_rollout_error;  // the first one's traceback
  double reward_mean = 0, reward_std = 0, reward_errors = 0;
  double length_mean = 0, length_max = 0, truncated_frac = 0;
  double staleness_mean = 0, staleness_max = 0, turns_mean = 0;
  std::map<std::string, double> reward_part_means;  // by reward name
};

// `version_before`: the trainer's version when the step began (staleness is measured from it).
RolloutStats rollout_stats(const std::vector<RolloutGroup>& groups, int64_t version_before);

// The train stage: the optimizer's numbers, the train–rollout mismatch and the objective's
// metrics (rl_step_metrics).
struct TrainStats {
  double loss = 0, grad_norm = 0, lr = 0;
  double mismatch_mean = 0, mismatch_max = 0, mismatch_nonzero_frac = 0;
  std::vector<double> mismatch_hist;  // tokens per kMismatchLimits bucket
  std::map<std::string, double> objective;
  double seconds = 0;
};

TrainStats train_stats(const TrainOutcome& outcome, double seconds);

struct StepMetrics {
  int64_t step = 0, weight_version = 0;
  AsyncMode mode = AsyncMode::kSync;
  RolloutStats rollout;
  TrainStats train;
  StepTiming timing;
  double step_s = 0, sync_s = 0;
  PoolCounters pool;
  bool speculative = false;  // rollout.speculative: the engines' counters over the step
  SpecCounters spec;

  // The metrics.jsonl line (docs/metrics.md names every key).
  nlohmann::json to_json() const;
};

}  // namespace miles::controller
