// Template: lex + parse at load, interpret at render within the limits of jinja_limits.h;
// TemplateError becomes a Status here.
#include "chat/jinja.h"
#include "chat/jinja_interp.h"
#include "chat/jinja_limits.h"
#include "chat/jinja_parser.h"

namespace miles::jinja {
namespace {

Status error_status(const std::string& name, const TemplateError& e, int fallback_line) {
  const int line = e.line > 0 ? e.line : fallback_line;
  return Status::Error("template '" + name + "' line " + std::to_string(line) + ": " + e.message);
}

}  // namespace

Result<Template> Template::parse(std::string_view source, std::string name,
                                 const LexOptions& options) {
  try {
    auto body = std::make_shared<Body>(jinja::parse(lex(source, options)));
    return Template(std::move(body), std::move(name));
  } catch (const TemplateError& e) {
    return error_status(name, e, 1);
  }
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object())
    return Status::Error("template '" + name_ + "': the render context must be a JSON object");
  std::vector<std::pair<std::string, Value>> vars;
  try {
    for (const auto& [k, v] : context.items()) vars.emplace_back(k, from_json(v));
  } catch (const TemplateError& e) {
    return Status::Error("template '" + name_ + "': context: " + e.message);
  }
  return render(std::move(vars));
}

Result<std::string> Template::render(std::vector<std::pair<std::string, Value>> variables) const {
  Frame root(nullptr);
  root.vars = std::move(variables);
  const RenderBudget budget;  // the steps and bytes of this render
  Interp interp(root);
  try {
    return interp.render(*body_);
  } catch (const TemplateError& e) {
    return error_status(name_, e, interp.line());
  }
}

}  // namespace miles::jinja
