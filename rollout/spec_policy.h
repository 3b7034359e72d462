// The adaptive policy of speculative decoding: how many drafted tokens each running sample verifies
// this iteration, from the engine's own measured cost of a forward and the drafts' estimated chance
// of acceptance (docs/speculative.md, "Adaptive policy").
//
// Why: verifying k drafts adds k tokens to the forward (and k rows to sample). On a CPU a decode
// forward is bound by reading the weights, so a few more tokens cost little at a small live batch
// and speculation pays by the tokens it gets accepted; at a large batch, or with a model so small
// that per-token work dominates, the same drafts slow every sample down. The engine times every
// iteration (forward, sampling; the drafter's time apart); this keeps that curve (seconds by token
// count) and
// verifies the drafts that maximise the expected tokens emitted per second, none when no choice
// beats not speculating by the margin. Only speed depends on it: outputs never do.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace miles::rollout {

// Seconds of one engine iteration by its token count: an exponential moving average per bucket
// (about 19 % wide in tokens), read by linear interpolation between measured buckets and held flat
// past them (an unmeasured larger batch is assumed to cost what the largest measured one does:
// optimistic, so that it gets tried and measured once).
class ForwardCostModel {
 public:
  void observe(int64_t tokens, double seconds);
  std::optional<double> estimate(int64_t tokens) const;
  // Whether a forward of about this many tokens (its bucket) has been timed.
  bool measured(int64_t tokens) const;

 private:
  struct Bucket {
    double tokens = 0, seconds = 0;
    bool seen = false;
  };
  std::vector<Bucket> buckets_;
};

// Per candidate sample, the chance that each of its draft tokens is accepted (cumulative: token j
// is accepted only if every one before it is; non-increasing). base_tokens: the iteration's tokens
// without drafts (decodes and prefill chunks); decodes: the samples emitting a token this
// iteration. Returns how many of each candidate's tokens to verify (a prefix of each), at most
// `budget` in all. adaptive false: every token within the budget.
std::vector<int64_t> plan_drafts(const ForwardCostModel& cost, int64_t base_tokens, int64_t decodes,
                                 const std::vector<std::vector<float>>& accept, int64_t budget,
                                 bool adaptive);

// Whether asking the drafter paid this iteration: with the drafter's time added to the planned
// forward's, the plan's expected emitted tokens per second still beat not speculating (a plan of
// no drafts pays only if drafting took under kDraftShare of the plain iteration). A drafter that
// costs real time (a model) and gets too few tokens accepted fails it; the engine then stops
// asking for kSpecCooldown iterations, twice as long after each failed probe (kSpecCooldownMax).
// `take`: plan_drafts's result for `accept`.
bool drafting_pays(const ForwardCostModel& cost, int64_t base_tokens, int64_t decodes,
                   const std::vector<std::vector<float>>& accept, const std::vector<int64_t>& take,
                   double draft_seconds);
inline constexpr double kDraftShare = 0.02;
inline constexpr int64_t kSpecCooldown = 16;      // after the first failure
inline constexpr int64_t kSpecCooldownMax = 512;  // doubled per failed probe up to this

// The expected-gain margin a speculative plan must beat not speculating by.
inline constexpr double kSpecMargin = 0.03;
// An adaptive engine runs an iteration without drafts when its size without them has not been
// timed, and every this many speculative iterations (so a stale or cold first timing of the plain
// forward cannot keep speculation on where it no longer pays).
inline constexpr int64_t kSpecRefreshEvery = 32;

}  // namespace miles::rollout
