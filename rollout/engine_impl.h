// Engine::Impl: the engine's state and the phases of one iteration (private to rollout/).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "miles/rollout/engine.h"
#include "miles/sampler.h"
#include "rollout/engine_state.h"
#include "rollout/spec_policy.h"

namespace miles {

struct Engine::Impl {
  std::unique_ptr<ModelRunner> runner;
  EngineOptions opt;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<rollout::BlockPool> pool;
  std::unique_ptr<rollout::PagedKvCache> kv;
  std::unique_ptr<rollout::RadixCache> radix;
  int64_t experts_per_pos = 0;

  std::map<uint64_t, std::unique_ptr<rollout::Request>> requests;
  std::deque<rollout::Sample*> waiting;   // samples needing prefill, FIFO
  std::vector<rollout::Sample*> running;  // samples decoding
  uint64_t next_request_id = 1;
  int32_t next_slot = 1;
  int64_t version = 0;
  // Bumped by every update_weights: KV computed under an older epoch never enters the prefix cache
  // (a sample kept across an in-place update finishes on its old KV, but nobody reuses it).
  int64_t weights_epoch = 0;
  bool paused = false;
  bool updating = false;  // between begin_weight_update and end_weight_update
  bool weights_released = false;  // release_weights() until the next update_weights()
  IterationRecord last;
  EngineStats counters;
  uint64_t seed_state = 0;  // the fresh-seed generator (splitmix64), EngineOptions::random_seed
  uint64_t fresh_seed();
  // Speculative decoding (EngineOptions::speculative): the drafter, the measured iteration costs
  // (drafting, forward, sampling) the adaptive policy reads, and the acceptance history of every
  // sample so far (its calibration prior).
  std::unique_ptr<Drafter> drafter;
  rollout::ForwardCostModel iteration_cost;
  double spec_predicted = 0, spec_accepted = 0;
  int64_t spec_since_plain = 0;  // speculative iterations since the last one without drafts
  int64_t spec_cooldown = 0;     // iterations left without asking the drafter (drafting_pays)
  int64_t spec_cooldown_next = 0;  // the next cool-down's length: doubles while probes fail
  double draft_seconds = 0;      // the drafter's time this iteration (not the forward's cost)
  bool warned_no_hidden = false;  // a model drafter on a runner without hidden states

  Status validate(const GenerateRequest& r) const;

  // Phases of step() (engine_step.cc).
  struct Item {
    rollout::Sample* sample;
    int64_t start, n;
    bool prefill;
    int64_t draft = 0;  // the last `draft` of the n positions are drafted ids (sample->draft)
  };
  std::vector<Item> schedule();
  bool ensure_blocks(rollout::Sample& s, int64_t positions);
  void match_prefix(rollout::Sample& s);
  // Whether `s` (not yet matched) should wait for one of `in_flight`'s prefills: they share at
  // least one whole block, which the prefix cache will hold once that prefill completes.
  bool waits_for_prefix(const rollout::Sample& s,
                        const std::vector<const rollout::Sample*>& in_flight) const;
  // Gives running samples drafted ids to verify within the iteration's remaining token budget
  // (engine_spec.cc): the drafter proposes, the adaptive policy picks how many to feed.
  void plan_drafts(std::vector<Item>& items, int64_t budget);
  // The drafter's query for a running sample: its tokens, and the other samples of its prompt.
  DraftQuery draft_query(const rollout::Sample& s, int64_t max_tokens,
                         std::span<const rollout::Sample* const> same_prompt) const;
  // The chance that each of `s`'s draft tokens is accepted, from the drafter's confidences and
  // the sample's (and the engine's) acceptance history.
  std::vector<float> accept_chances(const rollout::Sample& s) const;
  // Commits a verified item's tokens: the sample draws at each of its rows in turn, as plain
  // decoding would, while its draw equals the draft; returns the positions whose KV holds the
  // sample's own ids (the newest token's and the accepted drafts').
  int64_t verify(const Item& it, const float* rows, int64_t vocab);
  void run_batch(const std::vector<Item>& items);
  // The routed expert ids of positions [start, start + n) of `s` (ids: [n, experts_per_pos]), kept
  // beside its KV.
  void store_experts(const rollout::Sample& s, int64_t start, int64_t n, const int32_t* ids);
  // Whether the item's positions include prompt positions whose input logprobs are still wanted.
  bool needs_input_rows(const Item& it) const;
  // Records the input logprobs of the item's positions from its rows of logits ([it.n, vocab]).
  void record_input_logprobs(const Item& it, const float* rows, int64_t vocab);
  void complete_prefill(rollout::Sample& s, const float* logits);
  void fork_sibling(rollout::Sample& leader, rollout::Sample& sib, const float* logits);
  void sample_next(rollout::Sample& s, const float* logits);
  // Draws, across the runner's threads, the next token of every sample of the batch that will
  // sample from its row of logits (`rows[i]` for items[i]; a pure function of the row, params and
  // step), for sample_next.
  // A verified item's rows are drawn too, each as if the drafts before it were accepted.
  void presample(const std::vector<Item>& items, const std::vector<const float*>& rows);
  // The next token of `s` from its row of logits: the request's logit adjustments, the sampler,
  // and the top logprobs when asked (a pure function of the row, the sample's record and params).
  // ahead > 0: as if s.draft's first `ahead` ids had been accepted (a verify row).
  TokenOutput draw(const rollout::Sample& s, const float* logits, int64_t ahead = 0) const;
  std::map<const rollout::Sample*, std::deque<TokenOutput>> presampled;
  void finish(rollout::Sample& s, FinishReason why, std::string matched);
  void retract(rollout::Sample& s);
  void release(rollout::Sample& s);
  std::vector<int32_t> routed_experts(const rollout::Sample& s) const;
  void report_and_reap();
};

}  // namespace miles
