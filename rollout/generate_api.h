// The SGLang-compatible /generate request and response bodies, as JSON.
//
// Why: RL frameworks (slime, Miles) talk to SGLang's native API; miles serves the same shapes so
// they can point at it unchanged (every field of SGLang's GenerateReqInput and SamplingParams, each
// honoured or refused by name: docs/api.md), plus what miles adds per token: the exact sampling
// logprob the trainer recomputes, the raw-model logprob, the weight version and the seed.
// Parsing is strict: unknown fields, wrong types and absurd values are errors naming the field.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "miles/rollout/engine.h"
#include "miles/tokenizer.h"

namespace miles::rollout {

// One prompt of a /generate body (a batched body gives several).
struct GenerateCall {
  GenerateRequest request;
  std::string rid;
  bool return_logprob = false;
  bool return_text_in_logprobs = false;
  bool return_routed_experts = false;
  bool no_stop_trim = false;
  bool skip_special_tokens = true;            // SGLang's default
  bool spaces_between_special_tokens = true;  // a no-op for our tokenizers, as for HF fast ones
};

struct GenerateBatch {
  std::vector<GenerateCall> calls;
  bool batched = false;  // text / input_ids was a list: the response is a list
  bool stream = false;
};

// `stop` (a string or a list of strings) and `logit_bias` ({"token id": bias}, |bias| <= bound) of
// `obj`, shared by /generate (where = "sampling_params") and the OpenAI routes (where = "").
Status parse_stop(const nlohmann::json& obj, const std::string& where, GenerateRequest& out);
Status parse_logit_bias(const nlohmann::json& obj, const std::string& where, double bound,
                        LogitAdjustments& out);

// Parses SGLang's `sampling_params` object into `out` (and the decode options into `call`).
Status parse_sampling_params(const nlohmann::json& sp, GenerateCall& call);
// A /generate body. `tok` may be null (then only input_ids prompts are accepted).
Result<GenerateBatch> parse_generate(const nlohmann::json& body, const Tokenizer* tok);

// What a response needs besides the call and the sample.
struct ReplyContext {
  const Tokenizer* tok = nullptr;
  int64_t experts_per_token = 0;  // moe layers * top_k
  int64_t moe_layers = 0;
  // SGLang types weight_version as a string: the label a version was given (/update_weight_version)
  std::function<std::string(int64_t)> version_label;
};

// One sample's response object (final, or a stream chunk when `final_event` is null: then
// `output` holds the tokens so far).
nlohmann::json sample_json(const GenerateCall& call, const std::vector<TokenOutput>& output,
                           const SampleEvent* final_event, const ReplyContext& ctx);

// The visible text of a sample: skip_special_tokens applied, a matched stop string cut off (unless
// no_stop_trim), as SGLang's detokenizer gives it.
std::string sample_text(const GenerateCall& call, const std::vector<TokenOutput>& output,
                        const SampleEvent* final_event, const Tokenizer* tok);

}  // namespace miles::rollout
