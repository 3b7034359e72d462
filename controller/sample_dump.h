// SampleDump: RUN_DIR/samples/step_N.jsonl, every sample a step trained on (slime's debug rollout
// dump): prompt, response text and ids, reward and its parts, advantage, logprobs, weight versions.
//
// Why: the metrics say that the reward moved; the samples say why (a reward hack, a template bug,
// truncation). Each file is published whole (temporary, fsync, rename); only the newest `keep`
// files stay, and a resumed run drops the files of steps it will redo.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "controller/group_runner.h"
#include "controller/train_batch.h"
#include "miles/status.h"
#include "miles/tokenizer.h"

namespace miles::controller {

class SampleDump {
 public:
  // every: dump every N-th step (0: never); keep: files kept (0: all). resume_step >= 0: files of
  // later steps are removed.
  static Result<SampleDump> open(const std::string& run_dir, int64_t every, int64_t keep,
                                 int64_t resume_step);
  // Writes step `step`'s file when it is due; `batch` holds the groups' samples in order.
  Status write(int64_t step, const std::vector<RolloutGroup>& groups, const TrainBatch& batch,
               const Tokenizer& tok) const;
  std::string path_of(int64_t step) const;
  // RUN_DIR/eval_samples/step_N.jsonl: an evaluation's samples (prompt, label, response, reward
  // and its parts, finish reason), published whole; every evaluation keeps its file.
  static Status write_eval(const std::string& run_dir, int64_t step,
                           const std::vector<RolloutGroup>& groups, const Tokenizer& tok);

 private:
  Status prune() const;
  std::string dir_;
  int64_t every_ = 1, keep_ = 0;
};

}  // namespace miles::controller
