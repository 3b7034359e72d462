// Chat prompt rendering for /v1/chat/completions.
#include "rollout/chat_render.h"

#include "miles/chat_template.h"

namespace miles::rollout {

Result<std::vector<int32_t>> render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                                                const nlohmann::ordered_json& messages,
                                                const nlohmann::ordered_json& tools,
                                                const nlohmann::ordered_json& kwargs) {
  RenderOptions opt;
  opt.add_generation_prompt = true;
  opt.tools = tools;
  opt.kwargs = kwargs;
  MILES_ASSIGN_OR_RETURN(std::string text, tmpl.render(messages, opt));
  return tok.encode(text, /*add_special=*/false);
}

nlohmann::json assistant_message(const std::string& text) {
  return {{"role", "assistant"}, {"content", text}};
}

}  // namespace miles::rollout
