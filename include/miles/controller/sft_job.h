// SftJob: supervised fine-tuning as a job of the controller — `miles run` on a job file with an
// `sft:` section, and `miles sft` (its flags make the same RunConfig).
//
// Why: SFT and RL are two ways of feeding one trainer group. An SFT job has the RL job's run
// directory (config.yaml, metrics.jsonl, TensorBoard), its controller service (GetStatus, Stop,
// JoinTrainer: ranks joining from other hosts), its trainer group (parallel.dp × pp × tp ranks,
// rank 0 here broadcasting each batch, so only this process reads the data) and its checkpoints.
// Step k trains on lines [k·B, (k+1)·B) of sft.data taken cyclically (B = global_batch_size), so
// a resumed run continues where it stopped, bit for bit.
#pragma once

#include <cstdint>
#include <memory>

#include "miles/controller/run_config.h"
#include "miles/tokenizer.h"

namespace miles::controller {

struct SftJobOptions {
  // Each step as one JSON object on stdout ({"step", "loss", "grad_norm", "lr", "tokens",
  // "step_time_s"}, `miles sft`'s output); else the log line of logging.progress.
  bool json_lines = false;
};

struct SftSummary {
  int64_t first_step = 0;                // steps done before this process started (a resumed run)
  int64_t steps = 0;                     // steps done at the end
  double first_loss = 0, last_loss = 0;  // of this process's first and last step
};

// Runs the whole job; `tokenizer` may be null when sft.data holds token ids only. Errors name what
// failed (the data file and line, the layout, a step).
Result<SftSummary> run_sft_job(const RunConfig& config, std::shared_ptr<const Tokenizer> tokenizer,
                               const SftJobOptions& options);

}  // namespace miles::controller
