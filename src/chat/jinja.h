// A Jinja template: parse once, render many times. The interpreter's only entry point.
//
// Why: chat templates ship with every Hugging Face model as Jinja source and are rendered by
// transformers with jinja2 in an ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) plus a few globals. This is that environment in C++ for the subset chat
// templates use (see docs in chat_template.h for what is and is not supported); everything a user
// can get wrong comes back as a Status naming the template and line, never as a crash.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"
#include "chat/jinja_value.h"
#include "miles/status.h"

namespace miles::jinja {

class Template {
 public:
  // `name` appears in errors: "template 'qwen3' line 12: unknown filter 'foo'".
  static Result<Template> parse(std::string_view source, std::string name,
                                const LexOptions& options = {});

  // Renders with the keys of `context` (a JSON object) as template variables.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  // The same with values already converted (key order of dicts preserved).
  Result<std::string> render(std::vector<std::pair<std::string, Value>> variables) const;

  const std::string& name() const { return name_; }

 private:
  Template(std::shared_ptr<const Body> body, std::string name)
      : body_(std::move(body)), name_(std::move(name)) {}
  std::shared_ptr<const Body> body_;  // immutable once parsed: renders may run concurrently
  std::string name_;
};

}  // namespace miles::jinja
