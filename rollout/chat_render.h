// Chat prompts for the OpenAI chat endpoint: messages → chat template → token ids, and the assistant
// message of a response.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "miles/status.h"
#include "miles/tokenizer.h"

namespace miles {
class ChatTemplate;
}

namespace miles::rollout {

// Renders messages (+ tools, + template kwargs such as enable_thinking) with the generation prompt and
// tokenizes the text, special tokens included as the template wrote them.
// Takes ordered JSON so that tool schemas render with the client's key order, as Python would.
Result<std::vector<int32_t>> render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                                                const nlohmann::ordered_json& messages,
                                                const nlohmann::ordered_json& tools,
                                                const nlohmann::ordered_json& kwargs);
// {"role": "assistant", "content": text}.
nlohmann::json assistant_message(const std::string& text);

}  // namespace miles::rollout
