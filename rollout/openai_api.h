// OpenAI-compatible request parsing and response shapes (/v1/completions, /v1/chat/completions).
//
// Why: agents and evaluation harnesses speak the OpenAI API. miles answers in its shapes and adds what
// RL needs and OpenAI lacks: `token_ids` per choice and `prompt_token_ids`, so a client can keep the
// exact token record (TITO) without re-tokenizing.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "miles/rollout/engine.h"

namespace miles::rollout {

struct OpenAiCall {
  GenerateRequest request;  // the prompt's request (completions: one per prompt of `prompts`)
  std::vector<std::vector<int32_t>> prompts;  // completions: a batched `prompt` gives several
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool logprobs = false;
  int32_t top_logprobs = 0;    // chat: top_logprobs; completions: logprobs = N
  bool echo = false;           // completions: the prompt (and its logprobs) before the completion
  bool skip_special_tokens = true;
  std::string model;
  nlohmann::json messages;  // chat only
  nlohmann::json tools;     // chat only (may be null)
  bool parse_tools = false; // chat: tools given and tool_choice not "none"
  nlohmann::json template_kwargs = nlohmann::json::object();  // chat only: e.g. enable_thinking
};

// Sampling fields shared by both endpoints; `max_tokens_key` is "max_tokens" (or
// "max_completion_tokens" for chat, also accepted).
Status parse_openai_sampling(const nlohmann::json& body, OpenAiCall& call);
// A /v1/completions body: prompt is a string (needs a tokenizer) or a list of token ids.
Result<OpenAiCall> parse_completion(const nlohmann::json& body, const Tokenizer* tok);
// A /v1/chat/completions body (messages are rendered by the caller with the chat template).
Result<OpenAiCall> parse_chat(const nlohmann::json& body);

// The longest prefix of `text` that ends on a whole UTF-8 character (streaming deltas never split one).
size_t utf8_complete_prefix(const std::string& text);
// JSON text with invalid UTF-8 replaced (model output can end inside a character).
std::string dump_json(const nlohmann::json& j);
const char* openai_finish_reason(FinishReason r);
// The text of a finished sample, with a matched stop string and a final stop token cut off (as
// OpenAI does); empty without a tokenizer.
std::string openai_final_text(const Tokenizer* tok, const GenerateRequest& req,
                              const SampleEvent& fin, const std::vector<TokenOutput>& out,
                              bool skip_special = true);

}  // namespace miles::rollout
