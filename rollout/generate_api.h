// The SGLang-compatible /generate request and response bodies, as JSON.
//
// Why: RL frameworks (slime, Miles) talk to SGLang's native API; miles serves the same shapes so they can
// point at it unchanged, plus what miles adds per token: the raw-model logprob and the weight version.
// Parsing is strict: unknown fields, wrong types and absurd values are errors naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "miles/engine.h"
#include "miles/tokenizer.h"

namespace miles::rollout {

struct GenerateCall {
  GenerateRequest request;
  bool return_logprob = false;
  bool return_routed_experts = false;
  bool stream = false;
  std::string rid;
  bool no_stop_trim = false;
};

// Parses SamplingParams and limits from SGLang's `sampling_params` object into `out`.
Status parse_sampling_params(const nlohmann::json& sp, GenerateRequest& out);
// A /generate body. `tok` may be null (then only input_ids prompts are accepted).
Result<GenerateCall> parse_generate(const nlohmann::json& body, const Tokenizer* tok);

// One sample's response object (final, or a stream chunk when `final` is false).
nlohmann::json sample_json(const GenerateCall& call, const std::vector<TokenOutput>& output,
                           const SampleEvent* final_event, const Tokenizer* tok,
                           int64_t experts_per_token, int64_t num_moe_layers);

}  // namespace miles::rollout
