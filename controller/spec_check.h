// `miles check`'s speculative-decoding gate: the job's batch generated again in this process by a
// plain engine and by one verifying drafts (every proposal verified, the model-free drafter primed
// with the batch's responses as an earlier epoch's), and compared bit for bit — with each other,
// and the plain one with the job's engines (the same requests give the same samples wherever the
// engine runs).
//
// Why in process: the gate must hold whatever the job's engines run (speculation on or off, any
// device); two engines here over the job's model, prompts and sampling give the comparison with
// nothing else changed, and the engine's counters say how many drafts were verified.
#pragma once

#include <memory>
#include <vector>

#include "controller/group_runner.h"
#include "miles/controller/run_config.h"
#include "miles/status.h"
#include "miles/tokenizer.h"

namespace miles::controller {

struct SpecCheck {
  int64_t samples = 0, tokens = 0;
  int64_t mismatched_samples = 0;  // speculative vs plain: any token, logprob, version or expert
  int64_t same_as_job = 0;         // plain samples equal to the job's engines' (tokens, logprobs)
  uint64_t draft_tokens = 0, accepted_tokens = 0, verifies = 0, emitted_tokens = 0;
  uint64_t plain_iterations = 0, spec_iterations = 0;
};

// Single-turn jobs only (an environment or a rollout function runs sessions: an error says so).
Result<SpecCheck> check_speculative(const RunConfig& config,
                                    const std::vector<RolloutGroup>& groups,
                                    std::shared_ptr<const Tokenizer> tokenizer);

}  // namespace miles::controller
