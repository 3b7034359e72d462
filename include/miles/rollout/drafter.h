// Drafter: what proposes the tokens a speculative verify step checks (docs/speculative.md).
//
// Why an interface: the engine's verification makes a speculative rollout emit exactly the tokens,
// logprobs, weight versions and routed experts of the plain rollout whatever the draft, so a
// drafter only decides speed. The model-free suffix drafter (make_suffix_drafter) ships; tests plug
// in drafters that know the answer, or are wrong on purpose.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace miles {

// One running sample asking for a draft.
struct DraftQuery {
  std::span<const int32_t> tokens;  // prompt + output so far (the last one is not yet in the KV)
  int64_t prompt_len = 0;
  uint64_t prompt_key = 0;  // hash of the prompt's ids: same prompt, same key
  // Other samples of the same prompt now in the engine (GRPO siblings, whether sent as one request
  // with n > 1 or as separate requests): their prompt + output so far.
  std::vector<std::span<const int32_t>> siblings;
  int64_t max_tokens = 0;  // propose at most this many
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
  // A sample finished (not aborted) with this output after this prompt: drafters that learn from
  // earlier responses to a prompt (RL recycles prompts every epoch) keep it.
  virtual void observe(std::span<const int32_t> prompt, std::span<const int32_t> output) {}
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

// FNV-1a over the ids: DraftQuery::prompt_key.
uint64_t prompt_key(std::span<const int32_t> prompt);

}  // namespace miles
