// GroupRunner: one prompt → a scored group of n samples (docs/contracts.md §2 sample records).
//
// Why: the unit the RL loop schedules, filters and trains on is the group (GRPO normalises within
// it). Generation goes through the EnginePool (re-dispatched whole when an engine dies); samples
// the engine returns aborted (a weight update with pause mode `abort`) are continued from their
// partial output — prompt + partial ids as the new prompt — so their tokens carry several weight
// versions; then every sample is decoded and scored. The group's seed is a pure function of (run
// seed, stream position), so a re-dispatched or resumed group samples the same tokens under the
// same weights.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "controller/engine_pool.h"
#include "controller/prompt_data.h"
#include "controller/rollout_function.h"
#include "miles/controller/reward.h"
#include "miles/controller/run_config.h"
#include "miles/tokenizer.h"

namespace miles::controller {

struct RolloutSample {
  int32_t index = 0;                    // within the group
  std::vector<TokenOutput> tokens;      // the response, with logprobs and weight versions
  std::string finish_reason;            // stop | length
  int64_t prompt_tokens = 0;            // as the engine counted them (TITO check)
  std::vector<int32_t> routed_experts;  // (prompt + response − 1, moe layers, top_k) or empty
  std::string response;                 // decoded (multi-turn: the last model turn)
  RewardResult reward;
  // Multi-turn (rollout.environment): the whole session record from `response_start` on — model
  // turns (mask 1) and environment turns (mask 0) — replaces prompt + `tokens` for training;
  // `tokens` then holds the generated tokens only (versions, lengths).
  std::vector<int32_t> trajectory;     // the whole record, prompt first
  std::vector<float> trajectory_mask;  // (trajectory − response_start)
  std::vector<float> trajectory_logp;  // (trajectory − response_start), 0 where mask 0
  int64_t response_start = 0;
  int64_t turns = 1;
  std::string append_error;     // why a tool result could not be appended (the episode ended there)
  // rollout.function: what it returned (null for None), and the traceback when it failed. A failed
  // sample is kept for the record (sample dumps, metrics) but neither scored nor trained.
  nlohmann::json rollout_result;
  std::string rollout_error;
  bool failed() const { return !rollout_error.empty(); }
  int64_t min_version() const;  // oldest weight version among its tokens (0: none)
};

struct RolloutGroup {
  int64_t position = 0;  // stream position of its prompt (PromptData::at)
  const Prompt* prompt = nullptr;
  std::vector<RolloutSample> samples;
  int64_t continuations = 0;  // aborted samples continued
  double seconds = 0;         // generation + scoring wall time
  int64_t min_version() const;  // over the samples with tokens
  bool zero_variance() const;   // all rewards of the samples that did not fail equal (no signal)
};

// The seed of the group at stream position `position` of a run seeded with `seed`.
uint64_t group_seed(uint64_t seed, int64_t position);

class GroupRunner {
 public:
  GroupRunner(EnginePool& pool, RewardModel& rewards, const Tokenizer& tokenizer,
              const RolloutSection& rollout, int64_t experts_per_token,
              const ChatTemplate* chat = nullptr, const RolloutFunction* function = nullptr)
      : pool_(pool),
        rewards_(rewards),
        tok_(tokenizer),
        cfg_(rollout),
        experts_(experts_per_token > 0),
        experts_per_token_(experts_per_token),
        chat_(chat),
        function_(function) {}
  // Thread-safe (rewards are scored one group at a time). Errors: cancelled, or no engine left.
  Result<RolloutGroup> run(int64_t position, const Prompt& prompt, const std::atomic<bool>& cancel);

 private:
  Status continue_aborted(const Prompt& prompt, uint64_t seed, RolloutGroup& g,
                          const std::atomic<bool>& cancel);
  // Multi-turn (agent_runner.cc): one TITO session per sample, driven by rollout.environment
  // calculator or by rollout.function.
  struct SessionRun;
  class FunctionHost;
  Result<RolloutSample> run_session(const Prompt& prompt, uint64_t seed, int32_t index,
                                    const std::atomic<bool>& cancel);
  Result<RolloutSample> run_function(SessionRun& run);
  EnginePool& pool_;
  RewardModel& rewards_;
  std::mutex rewards_mu_;
  const Tokenizer& tok_;
  RolloutSection cfg_;
  bool experts_;
  int64_t experts_per_token_ = 0;
  const ChatTemplate* chat_ = nullptr;
  const RolloutFunction* function_ = nullptr;
};

}  // namespace miles::controller
