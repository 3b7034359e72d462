// From scored groups to what the trainer consumes (TITO: the engine's token ids, logprobs and
// routed experts, untouched), and the RL loss configuration from the job's algorithm section.
#pragma once

#include <vector>

#include "controller/group_runner.h"
#include "miles/trainer/rl_objective.h"
#include "miles/controller/run_config.h"
#include "miles/trainer/trainer.h"

namespace miles::controller {

struct TrainBatch {
  std::vector<TrainSample> samples;  // group by group, sample index order
  std::vector<RlSampleData> data;    // old_logp / rollout_logp = the engine's raw logprobs
  std::vector<float> rewards;        // (samples)
  std::vector<int64_t> group_index;  // (samples)
  std::vector<int64_t> versions;     // (samples) the oldest weight version among its tokens
};

// Samples, engine logprobs and advantages (algorithm.advantage over each group's rewards).
Result<TrainBatch> make_train_batch(const std::vector<RolloutGroup>& groups,
                                    const AlgorithmSection& algorithm);

// The loss configuration of algorithm (normalisers left 0: rl_objective fills them per step).
Result<rl::LossConfig> loss_config(const AlgorithmSection& algorithm);

}  // namespace miles::controller
