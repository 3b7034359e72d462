// Tool calls in a model's text: Hermes / Qwen style `<tool_call>{"name": ..., "arguments": {...}}
// </tool_call>` blocks, turned into OpenAI `tool_calls` (the chat endpoint, when the request gave
// tools).
//
// Why: the chat templates of Qwen2.5 / Qwen3 / Hermes tell the model to answer a tool request with
// such blocks; agents read `message.tool_calls`, as from SGLang's and vLLM's `hermes` / `qwen25`
// parsers. A block whose JSON does not parse, or lacks a string "name", stays in the content.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace miles::rollout {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object as text (OpenAI's spelling)
};

struct ParsedToolCalls {
  std::string content;  // the text outside the parsed blocks, whitespace-trimmed
  std::vector<ToolCall> calls;
};

ParsedToolCalls parse_tool_calls(const std::string& text);

// The length of `text` a stream may send as content: up to the first "<tool_call>", and short of
// a trailing partial "<tool_c" that may still become one.
size_t tool_call_free_prefix(const std::string& text);

// The OpenAI `tool_calls` array; ids are "call_" + `id_prefix` + "_" + index.
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, const std::string& id_prefix);

}  // namespace miles::rollout
