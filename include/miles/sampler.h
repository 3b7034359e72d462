// Token sampling: temperature, top-k, top-p and min-p over one row of logits, reproducibly.
//
// Why: RL needs two things from the sampler besides a token. (1) The log-probability of the token
// under the distribution it was really drawn from, and under the raw model, so the trainer can
// compare its own recomputation with what the rollout saw. (2) Reproducibility: the uniform number
// behind the token at output position `step` of a request is a pure function of (seed, step) — a
// counter-based RNG (Philox 4x32-10, key = seed, counter = step) — so a request's tokens do not
// depend on which other requests share its batch or in which order requests are sampled. Sorting
// breaks ties by id and every sum runs in a fixed order, so the same logits, params and step give
// the same bits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "miles/status.h"

namespace miles {

// Temperatures below this are greedy (SGLang's _SAMPLING_EPS: dividing by them overflows the
// logits).
inline constexpr float kGreedyTemperature = 1e-6f;

struct SamplingParams {
  float temperature = 1.0f;  // >= 0; below kGreedyTemperature (e.g. 0) = greedy argmax
  float top_p = 1.0f;        // (0, 1]; 1 = off
  int32_t top_k = 0;         // >= 0; 0 = off
  float min_p = 0.0f;        // [0, 1); 0 = off; relative to the most likely token's probability
  uint64_t seed = 0;         // with the step, selects the uniform number (sampling_uniform)

  // An error naming the field for out-of-range or non-finite values.
  Status validate() const;
  bool greedy() const { return temperature < kGreedyTemperature; }
};

struct SampleResult {
  int32_t token = -1;
  // log p(token) under the distribution it was sampled from: softmax(logits / temperature)
  // restricted to the tokens the filters kept and renormalised. 0 (= log 1) for greedy.
  float logprob = 0.0f;
  // log p(token) under the raw model: log_softmax(logits)[token], no temperature, no filters.
  float raw_logprob = 0.0f;
  // log_softmax(logits / temperature)[token], before the filters; greedy: temperature 1 (= raw).
  // SGLang's and OpenAI's reported logprob.
  float tempered_logprob = 0.0f;
};

// Samples one token from `logits` (vocab) for output position `step` of a request.
// Greedy: argmax, ties to the lowest id. Otherwise, in SGLang's order: p = softmax(logits /
// temperature); top-k keeps the k most likely (ties to the lower id); top-p keeps the smallest
// prefix of those, most likely first, whose renormalised cumulative probability reaches top_p (at
// least one token); min-p keeps the tokens with p >= min_p * max p; then the token is drawn by
// inverse CDF over the kept tokens in that order with u = sampling_uniform(seed, step). note: call
// only with params.validate().ok() and logits free of NaN and +inf with at least one finite value
// (-inf masks a token); anything else aborts with MILES_CHECK.
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          uint64_t step);

// The `count` most likely tokens of log_softmax(logits / temperature) (temperature 1 when greedy),
// most likely first, ties to the lower id; each value is the bits sample_token reports as
// tempered_logprob for that token. Same preconditions on logits as sample_token.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, const SamplingParams& params,
                                       int32_t count);
// log_softmax(logits / temperature)[id] for each of `ids`, in their order (SGLang's
// token_ids_logprob): the bits top_logprobs reports for the same token. Each id must be in the
// vocabulary; same preconditions on logits as sample_token.
std::vector<float> token_logprobs(std::span<const float> logits, const SamplingParams& params,
                                  std::span<const int32_t> ids);
// log_softmax(logits / temperature)[token] (temperature 1 when greedy): tempered_logprob's value.
float tempered_logprob(std::span<const float> logits, const SamplingParams& params, int32_t token);

// The uniform number in [0, 1) used for output position `step` of a request seeded with `seed`: the
// first two 32-bit words of Philox4x32-10(counter = {step lo, step hi, 0, 0}, key = {seed lo, seed
// hi}) as a 64-bit integer (word 1 high), top 53 bits scaled by 2^-53.
double sampling_uniform(uint64_t seed, uint64_t step);

}  // namespace miles
