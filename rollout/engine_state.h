// The engine's bookkeeping: requests, their samples (decode streams) and the shared KV structures.
// Private to rollout/; Engine::Impl owns one EngineState and mutates it only from step() and the
// lifecycle calls.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "miles/rollout/engine.h"
#include "rollout/block_pool.h"
#include "rollout/paged_kv_cache.h"
#include "rollout/radix_cache.h"

namespace miles::rollout {

enum class SampleState {
  kWaiting,     // needs (more) prefill
  kForkWaiting, // a group sibling waiting for the leader's prefill to finish
  kRunning,     // decoding: its last token is not yet in the KV cache
  kFinished,
};

struct Sample {
  uint64_t request_id = 0;
  int32_t index = 0;
  int32_t slot = 0;              // KV table id, unique per sample
  SampleState state = SampleState::kWaiting;
  std::vector<int32_t> tokens;   // prompt + output ids
  int64_t prompt_len = 0;
  int64_t computed = 0;          // positions whose KV is cached
  int64_t cached_tokens = 0;     // prompt positions that came from the prefix cache
  bool matched_prefix = false;   // prefix lookup done
  int64_t kv_epoch = 0;          // Engine weights_epoch when its KV started (at the lookup)
  SamplingParams sampling;       // seed derived per sample
  std::vector<TokenOutput> output;
  std::vector<TokenOutput> pending;  // not yet reported
  std::string text;              // decoded output (only with stop strings)
  FinishReason finish = FinishReason::kNone;
  std::string matched_stop;
  // Speculative decoding: the drafted ids fed after the newest token this iteration (verified and
  // cleared by the same iteration), the drafter's confidence in each, the prompt's key, and the
  // acceptance history (draft tokens reached and accepted; the confidences predicted for them).
  std::vector<int32_t> draft;
  std::vector<float> draft_confidence;
  uint64_t prompt_key = 0;
  double spec_predicted = 0, spec_accepted = 0;
};

struct Request {
  uint64_t id = 0;
  GenerateRequest req;
  SampleListener listener;
  std::vector<std::unique_ptr<Sample>> samples;
  // Prompt positions logprob_start_len.. (req.logprob_start_len >= 0), filled by sample 0's
  // prefill; once it completed, a re-prefill (retraction) may reuse cached blocks again.
  std::vector<InputLogprob> input_logprobs;
  bool input_logprobs_done = false;
  bool wants_input_logprobs() const { return req.logprob_start_len >= 0 && !input_logprobs_done; }
};

}  // namespace miles::rollout
