// libFuzzer target: arbitrary bytes as a chat template (ChatTemplate::create), rendered with a
// small fixed conversation (system, user, an assistant turn with reasoning and a tool call, the
// tool's answer, a user turn), a tool list and the generation prompt. Bad templates, runtime
// errors and runaway templates (endless loops, exponential growth) must come back as an error
// value: no crash, no UB, no leak, no hang past the engine's step and size limits.
#include <cstddef>
#include <cstdint>
#include <string>

#include "miles/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

const ojson& messages() {
  static const ojson m = ojson::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+3? Use the tool."},
    {"role": "assistant", "content": "", "reasoning_content": "Add them.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "user", "content": "Thanks, é ✓"}])");
  return m;
}

const miles::RenderOptions& options() {
  static const miles::RenderOptions o = [] {
    miles::RenderOptions r;
    r.add_generation_prompt = true;
    r.tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
      "description": "a + b", "parameters": {"type": "object", "properties":
      {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
    r.kwargs = ojson{{"enable_thinking", false}};
    return r;
  }();
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = miles::ChatTemplate::create(source, "<s>", "</s>", "fuzz");
  if (t.ok()) (void)t->render(messages(), options());
  return 0;
}
