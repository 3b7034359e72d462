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
  // Mean reward of the first and of the last `window_steps` steps of this run: disjoint windows
  // of up to 5 steps (at most half the steps each; 0 when the run had fewer than 2).
  int64_t window_steps = 0;
  double first_reward_mean = 0;
  double last_reward_mean = 0;
  // Evaluations (eval.every): how many, and the first's and last's reward mean, pass@1, pass@k.
  struct Eval {
    double reward_mean = 0, pass_at_1 = 0, pass_at_k = 0;
  };
  int64_t evaluations = 0, eval_k = 0;
  Eval first_eval, last_eval;
};

// Runs the whole job; errors name what failed (config, engines, a step).
Result<RunSummary> run_rl_job(const RunConfig& config, const RunResources& resources);

// `miles check`: the train–rollout agreement gate of the job (config.check holds the thresholds).
// The report (also written to check.report) has "passed" and one entry per gate.
Result<nlohmann::json> run_rl_check(const RunConfig& config, const RunResources& resources);

// `miles eval`: the job's engines and rewards, one evaluation on eval.data of the weights loaded
// (with checkpoint.resume, the newest checkpoint of checkpoint.dir): the eval_* metrics.
Result<nlohmann::json> run_rl_eval(const RunConfig& config, const RunResources& resources);

}  // namespace miles::controller
