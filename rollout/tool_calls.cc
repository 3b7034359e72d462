// parse_tool_calls: <tool_call> blocks scanned left to right; each body parsed as JSON.
#include "rollout/tool_calls.h"

#include <algorithm>

#include "miles/json_text.h"

namespace miles::rollout {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The call in one block's body, or false when it is not {"name": string, "arguments":
// object|string}.
bool parse_call(const std::string& body, ToolCall* out) {
  const nlohmann::json j = parse_json_or_discarded(body);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out->name = j["name"].get<std::string>();
  const nlohmann::json args = j.contains("arguments")    ? j["arguments"]
                              : j.contains("parameters") ? j["parameters"]
                                                         : nlohmann::json::object();
  if (args.is_string()) {
    out->arguments = args.get<std::string>();
  } else if (args.is_object()) {
    out->arguments = args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    return false;
  }
  return true;
}

}  // namespace

ParsedToolCalls parse_tool_calls(const std::string& text) {
  ParsedToolCalls out;
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string::npos) break;
    size_t close = text.find(kClose, open + kOpen.size());
    // An unclosed last block (the model stopped on its stop token): its body runs to the end.
    const size_t body_end = close == std::string::npos ? text.size() : close;
    ToolCall call;
    const std::string body = text.substr(open + kOpen.size(), body_end - open - kOpen.size());
    const size_t next = close == std::string::npos ? text.size() : close + kClose.size();
    if (!parse_call(trim(body), &call)) {
      content += text.substr(at, next - at);
    } else {
      content += text.substr(at, open - at);
      out.calls.push_back(std::move(call));
    }
    at = next;
  }
  if (at < text.size()) content += text.substr(at);
  out.content = out.calls.empty() ? text : trim(content);
  return out;
}

size_t tool_call_free_prefix(const std::string& text) {
  const size_t open = text.find(kOpen);
  if (open != std::string::npos) return open;
  for (size_t keep = std::min(text.size(), kOpen.size() - 1); keep > 0; --keep)
    if (text.compare(text.size() - keep, keep, kOpen.substr(0, keep)) == 0)
      return text.size() - keep;
  return text.size();
}

nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, const std::string& id_prefix) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    out.push_back({{"id", "call_" + id_prefix + "_" + std::to_string(i)},
                   {"index", i},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  return out;
}

}  // namespace miles::rollout
