// Drafter: what proposes the tokens a speculative verify step checks (docs/speculative.md).
//
// Why an interface: the engine's verification makes a speculative rollout emit exactly the tokens,
// logprobs, weight versions and routed experts of the plain rollout whatever the draft, so a
// drafter only decides speed. The model-free suffix drafter (make_suffix_drafter) ships; tests plug
// in drafters that know the answer, or are wrong on purpose.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "miles/sampler.h"

namespace miles {

class DraftHead;
class ThreadPool;

// One running sample asking for a draft.
struct DraftQuery {
  std::span<const int32_t> tokens;  // prompt + output so far (the last one is not yet in the KV)
  int64_t prompt_len = 0;
  uint64_t prompt_key = 0;  // hash of the prompt's ids: same prompt, same key
  // Other samples of the same prompt now in the engine (GRPO siblings, whether sent as one request
  // with n > 1 or as separate requests): their prompt + output so far.
  std::vector<std::span<const int32_t>> siblings;
  int64_t max_tokens = 0;  // propose at most this many
  uint64_t sample = 0;     // the engine's id of the sample, stable while it lives
  // How the sample draws its tokens, and the output index (the sampler's step) of the first drafted
  // token: draft j will be checked against the sampler's draw with sampling_uniform(seed, step +
  // j). A drafter with a distribution of its own draws its draft with that same number (coupled
  // drafting): where its distribution is close to the target's, both draws land on the same token
  // far more often than the target's probability of any one fixed token.
  SamplingParams sampling;
  int64_t step = 0;
};

// Up to max_tokens ids continuing the query's tokens, and for each the drafter's estimate of the
// chance that it is accepted given that the ones before it were (in (0, 1]).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<float> confidence;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual Draft propose(const DraftQuery& query) = 0;
  // One iteration's queries at once (a model drafter runs them as one batch); by default each
  // query's propose() in order.
  virtual std::vector<Draft> propose_all(std::span<const DraftQuery> queries);
  // A sample finished (not aborted) with this output after this prompt: drafters that learn from
  // earlier responses to a prompt (RL recycles prompts every epoch) keep it.
  virtual void observe(std::span<const int32_t> prompt, std::span<const int32_t> output) {}
  // Model drafters: whether the engine should hand over the target's hidden states (hidden()),
  // and of which layers (ForwardOptions::tap_layers: each layer's output; the last layer's is the
  // last hidden state before the final norm).
  virtual bool wants_hidden() const { return false; }
  virtual std::vector<int64_t> hidden_layers() const { return {}; }
  // The target's outputs of hidden_layers() ([n, layers, hidden]) at positions [first, first + n)
  // of `sample`, whose ids are now fixed; what was known at or past `first` is replaced (a
  // retracted sample's prefill starts again).
  virtual void hidden(uint64_t sample, int64_t first, std::span<const float> rows) {}
  // Sample `to` starts from `from`'s prompt (a GRPO sibling forked from its leader's prefill).
  virtual void fork(uint64_t from, uint64_t to) {}
  // The sample left the engine (finished, aborted, retracted): its state can go.
  virtual void forget(uint64_t sample) {}
};

// The model-free drafter: the longest suffix of the query's tokens (at least min_match ids, at most
// max_match) is looked up in the sample's own tokens, its siblings and the responses kept for its
// prompt; the continuations found vote, longer matches weighing more, and the draft follows the
// majority while its estimated acceptance stays above min_confidence.
struct SuffixDrafterOptions {
  int64_t min_match = 2;
  int64_t max_match = 16;
  float min_confidence = 0.05f;     // stop drafting when the running product falls below
  int64_t history_prompts = 4096;   // prompts whose earlier responses are kept (least recent go)
  int64_t history_per_prompt = 16;  // responses kept per prompt (oldest go)
  int64_t history_max_tokens = 4 << 20;  // all kept responses' ids together (least recent go)
};
std::unique_ptr<Drafter> make_suffix_drafter(const SuffixDrafterOptions& options);

// The co-trained draft head as a drafter (include/miles/draft_head.h, docs/speculative.md): from
// the target's hidden states of each sample's newest fixed positions it runs the head once over
// them, then once per further draft token on its own outputs, all samples of an iteration in one
// batch. A greedy sample's draft is the head's argmax. A sampled one's is the argmax or the head's
// coupled draw (the sampler's own draw with the sample's params over the head's distribution, with
// the uniform number the target will draw that position with: DraftQuery::step), unsharpened or at
// half the temperature: every way is drafted for each sample's first position and scored when its
// token lands, and the way that matched most often lately is proposed (a head close to the policy
// wins with the coupled draw, a rough one with its argmax). Each token's confidence is the head's
// probability of it.
// Its own KV per sample (one layer). `head` is read, never changed, while the drafter has it;
// set_head() swaps it between iterations (a new weight version's head; null: no head, no drafts).
struct HeadDrafterOptions {
  float min_confidence = 0.02f;  // stop drafting a sample when the running product falls below
};
// How the head's first drafts of sampled queries fared, every way, since the drafter was made.
struct HeadDrafterStats {
  uint64_t scored = 0;  // first drafts whose position's token has landed
  // ... equal to the head's argmax, its coupled draw, its coupled draw at half the temperature
  std::array<uint64_t, 3> hits{};
};
class HeadDrafter : public Drafter {
 public:
  virtual void set_head(std::shared_ptr<const DraftHead> head) = 0;
  virtual HeadDrafterStats stats() const = 0;
};
std::unique_ptr<HeadDrafter> make_head_drafter(std::shared_ptr<const DraftHead> head,
                                               ThreadPool* pool,
                                               const HeadDrafterOptions& options = {});

// FNV-1a over the ids: DraftQuery::prompt_key.
uint64_t prompt_key(std::span<const int32_t> prompt);

}  // namespace miles
