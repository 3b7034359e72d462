// RlJob: `miles run` — the RL loop of one job config, from the first rollout to the last sync.
//
// Why: this is the product a user launches. It owns the trainer (in this process), the pool of
// rollout engines (processes), the controller's gRPC service, the weight publisher, rewards,
// metrics and checkpoints, and runs one of three schedules (docs/contracts.md §1):
//   sync          generate step k with version k, train, publish k + 1, sync: on-policy; the
//                 trainer's logprobs equal the engine's bit for bit (mismatch metrics exactly 0).
//   one_step_off  step k + 1 generates (with version k) while step k trains; sync after both:
//                 every sample is exactly one version stale.
//   async         a producer keeps `buffer_groups` groups generating; the trainer takes finished
//                 groups as they come; weights sync every `update_weights_interval` steps with the
//                 engines paused per `pause_mode` (in-flight samples continue: partial rollouts,
//                 each token carrying its version); groups staler than `max_weight_staleness`
//                 versions are dropped or retried.
// Every rollout step appends one JSON line to RUN_DIR/metrics.jsonl and prints a log line.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "miles/chat_template.h"
#include "miles/controller/run_config.h"
#include "miles/tokenizer.h"

namespace miles::controller {

struct RunResources {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat;  // null when the model has none
};

struct RunSummary {
  int64_t rollout_steps = 0;
  double first_reward_mean = 0;  // mean reward of the first (up to) 5 steps of this run
  double last_reward_mean = 0;   // and of the last 5
};

// Runs the whole job; errors name what failed (config, engines, a step).
Result<RunSummary> run_rl_job(const RunConfig& config, const RunResources& resources);

// `miles check`: the train–rollout agreement gate of the job (config.check holds the thresholds).
// The report (also written to check.report) has "passed" and one entry per gate.
Result<nlohmann::json> run_rl_check(const RunConfig& config, const RunResources& resources);

}  // namespace miles::controller
