// ChatTemplate construction and rendering with transformers' apply_chat_template conventions.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/chat_template_impl.h"
#include "miles/json_text.h"

namespace miles {
namespace {

using ojson = nlohmann::ordered_json;

// transformers: keys whose value is None are dropped; the reasoning is exposed under both
// `thinking` and `reasoning_content` ({"thinking": r, **message, "reasoning_content": r}).
ojson normalize_message(const ojson& m) {
  ojson out = ojson::object();
  for (const auto& [k, v] : m.items())
    if (!v.is_null()) out[k] = v;
  const ojson* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if (auto it = out.find(key); it != out.end()) {
      reasoning = &*it;
      break;
    }
  }
  if (!reasoning) return out;
  ojson aliased = ojson::object();
  aliased["thinking"] = *reasoning;
  for (const auto& [k, v] : out.items()) aliased[k] = v;
  aliased["reasoning_content"] = *reasoning;
  return aliased;
}

Status check_messages(const ojson& messages, const char* what) {
  if (!messages.is_array())
    return Status::Error(std::string(what) + " must be a JSON array of message objects");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string where = std::string(what) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::Error(where + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return Status::Error(where + ": 'role' must be a string");
  }
  return Status::Ok();
}

std::string token_string(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

Result<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return Status::Error("cannot open " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<ChatTemplate> ChatTemplate::create(std::string_view source, std::string bos_token,
                                          std::string eos_token, std::string name) {
  MILES_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(source, std::move(name)));
  auto impl = std::make_shared<Impl>(Impl{std::move(tmpl), {}});
  if (!bos_token.empty()) impl->special_tokens.emplace_back("bos_token", std::move(bos_token));
  if (!eos_token.empty()) impl->special_tokens.emplace_back("eos_token", std::move(eos_token));
  return ChatTemplate(std::move(impl));
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer_config.json";
  MILES_ASSIGN_OR_RETURN(std::string text, read_file(file));
  const fs::path jinja_file = file.parent_path() / "chat_template.jinja";
  JinjaFile jinja;
  if (fs::exists(jinja_file)) jinja = [jinja_file] { return read_file(jinja_file); };
  return from_tokenizer_config_text(text, file.string(), jinja);
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config_text(std::string_view text,
                                                              const std::string& source,
                                                              const JinjaFile& jinja) {
  auto parsed = parse_json_text<ojson>(text);
  if (!parsed.ok()) return Status::Error(source + ": invalid JSON: " + parsed.message());
  const ojson& config = *parsed;
  if (!config.is_object()) return Status::Error(source + ": not a JSON object");
  std::string template_source;
  if (auto it = config.find("chat_template"); it != config.end() && it->is_string()) {
    template_source = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    for (const ojson& entry : *it) {
      if (!entry.is_object()) continue;
      const auto name = entry.find("name"), tmpl = entry.find("template");
      if (name != entry.end() && *name == "default" && tmpl != entry.end() && tmpl->is_string())
        template_source = tmpl->get<std::string>();
    }
    if (template_source.empty())
      return Status::Error(source + ": chat_template: no template named \"default\"");
  } else {
    if (!jinja) return Status::Error(source + ": no chat_template (and no chat_template.jinja)");
    MILES_ASSIGN_OR_RETURN(template_source, jinja());
  }
  MILES_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(template_source, source));
  auto impl = std::make_shared<Impl>(Impl{std::move(tmpl), {}});
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (auto it = config.find(key); it != config.end()) {
      std::string tok = token_string(*it);
      if (!tok.empty()) impl->special_tokens.emplace_back(key, std::move(tok));
    }
  }
  return ChatTemplate(std::move(impl));
}

const std::string& ChatTemplate::name() const { return impl_->tmpl.name(); }

Result<std::string> ChatTemplate::render(const ojson& messages,
                                         const RenderOptions& options) const {
  MILES_RETURN_IF_ERROR(check_messages(messages, "messages"));
  if (messages.empty())
    return Status::Error("cannot apply a chat template to an empty conversation");
  if (!options.tools.is_null() && !options.tools.is_array())
    return Status::Error("tools must be null or a JSON array of tool schemas");
  if (!options.kwargs.is_object()) return Status::Error("template kwargs must be a JSON object");

  ojson context = ojson::object();
  for (const auto& [k, v] : impl_->special_tokens) context[k] = v;
  for (const auto& [k, v] : options.kwargs.items()) {
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
      return Status::Error("template kwarg '" + k + "' is reserved (pass it as its own argument)");
    context[k] = v;
  }
  ojson normalized = ojson::array();
  for (const ojson& m : messages) normalized.push_back(normalize_message(m));
  context["messages"] = std::move(normalized);
  context["tools"] = options.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = options.add_generation_prompt;
  return impl_->tmpl.render(context);
}

}  // namespace miles
