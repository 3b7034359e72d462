// The job file and its overrides → RunConfig: sections and keys checked against the schema
// (run_config_schema.cc), values typed (run_config_node.cc), then defaults resolved and the whole
// validated (run_config_validate.cc).
//
// Why: every error is reported at once, each as `file:line: section.key: problem` (or
// `override section.key=value: ...`), with a "did you mean" for unknown names, so that a job file
// is fixed in one edit instead of one run per typo.
#include <filesystem>
#include <string>

#include "controller/run_config_internal.h"
#include "controller/run_config_node.h"
#include "miles/controller/run_config.h"
#include "miles/durable_file.h"

namespace miles {
namespace {

using run_config_internal::Field;
using run_config_internal::Origins;

std::string join(const std::vector<std::string_view>& words, std::string_view separator) {
  std::string out;
  for (std::string_view word : words) {
    if (!out.empty()) out += separator;
    out += word;
  }
  return out;
}

std::string location(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1);
}

// yaml-cpp's own message, except for its nesting bound, which it calls "bad file".
std::string yaml_message(const YAML::Exception& e) {
  if (const auto* deep = dynamic_cast<const YAML::DeepRecursion*>(&e))
    return "lists and maps nested too deep (yaml-cpp's parser stops at depth " +
           std::to_string(deep->depth()) + ")";
  return e.msg;
}

class Parser {
 public:
  explicit Parser(const std::string& source) : source_(source) { config_.source = source; }

  void file(const YAML::Node& root);
  void apply_override(const std::string& text);

  RunConfig& config() { return config_; }
  const Origins& origins() const { return origins_; }
  // Every reward names its kind: there is no default kind.
  void require_reward_kinds();
  std::string fixed_where_or_source() const {
    return fixed_where_.empty() ? source_ : fixed_where_;
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  // "job.yaml:12", or the override being applied.
  std::string at(const YAML::Mark& mark) const {
    return fixed_where_.empty() ? location(source_, mark) : fixed_where_;
  }
  void error(const std::string& where, const std::string& message) {
    errors_.push_back(where + ": " + message);
  }
  void section(const std::string& name, const YAML::Node& node, const std::string& where);
  void rewards(const YAML::Node& node, const std::string& where);
  // Each key of `map` into its field; `prefix` ("rollout", "rewards[0]") names the map.
  void assign_map(const YAML::Node& map, const std::vector<Field>& fields,
                  const std::string& prefix);
  void assign_key(const std::vector<Field>& fields, const std::string& key, const YAML::Node& value,
                  const std::string& prefix, const std::string& where);
  std::vector<Field> section_fields(std::string_view name) {
    for (auto& s : run_config_internal::sections_of(config_)) {
      if (s.name == name) return s.fields;
    }
    return {};
  }
  std::string unknown_section(const std::string& name) const {
    std::string near = run_config_internal::nearest(name, run_config_internal::section_names());
    if (!near.empty()) return "unknown section '" + name + "' (did you mean " + near + "?)";
    return "unknown section '" + name + "' (sections: " +
           join({run_config_internal::section_names().begin(),
                 run_config_internal::section_names().end()},
                ", ") +
           ")";
  }

  std::string source_;
  std::string fixed_where_;
  RunConfig config_;
  Origins origins_;
  std::set<std::string> given_;                  // every path a value was given for, valid or not
  std::map<std::string, std::string> entry_at_;  // where each reward entry starts ("rewards[0]")
  std::vector<std::string> errors_;
};

void Parser::file(const YAML::Node& root) {
  if (root.IsNull()) return;
  if (!root.IsMap()) {
    error(at(root.Mark()),
          "the top level must be a map of sections (model: ..., rollout: ...), got " +
              run_config_internal::describe(root));
    return;
  }
  std::map<std::string, int> seen;  // section → line
  for (const auto& entry : root) {
    const std::string where = at(entry.first.Mark());
    if (!entry.first.IsScalar()) {
      error(where, "expected a section name, got " + run_config_internal::describe(entry.first));
      continue;
    }
    const std::string& name = entry.first.Scalar();
    auto [it, inserted] = seen.emplace(name, entry.first.Mark().line + 1);
    if (!inserted) {
      error(where, name + ": duplicate section (first at line " + std::to_string(it->second) + ")");
    } else if (name == "rewards") {
      rewards(entry.second, where);
    } else if (!section_fields(name).empty()) {
      section(name, entry.second, where);
    } else {
      error(where, unknown_section(name));
    }
  }
}

void Parser::section(const std::string& name, const YAML::Node& node, const std::string& where) {
  if (node.IsNull()) return;  // `controller:` with nothing under it: all defaults
  if (!node.IsMap()) {
    error(where, name + ": expected a map of keys, got " + run_config_internal::describe(node));
    return;
  }
  assign_map(node, section_fields(name), name);
}

void Parser::rewards(const YAML::Node& node, const std::string& where) {
  config_.rewards.clear();
  std::erase_if(origins_, [](const auto& kv) { return kv.first.starts_with("rewards"); });
  origins_["rewards"] = where;
  if (node.IsNull()) return;
  if (!node.IsSequence()) {
    error(where, "rewards: expected a list of rewards (- kind: exact_match ...), got " +
                     run_config_internal::describe(node));
    return;
  }
  for (const YAML::Node& entry : node) {
    const std::string prefix = "rewards[" + std::to_string(config_.rewards.size()) + "]";
    RewardSpec& spec = config_.rewards.emplace_back();
    entry_at_[prefix] = at(entry.Mark());
    if (!entry.IsMap()) {
      given_.insert(prefix + ".kind");  // reported below
      error(at(entry.Mark()), prefix + ": expected a map of reward keys (kind, weight, ...), got " +
                                  run_config_internal::describe(entry));
      continue;
    }
    assign_map(entry, run_config_internal::reward_fields(spec), prefix);
  }
}

void Parser::require_reward_kinds() {
  for (size_t i = 0; i < config_.rewards.size(); ++i) {
    const std::string prefix = "rewards[" + std::to_string(i) + "]";
    if (given_.count(prefix + ".kind")) continue;  // set, or wrong and reported
    auto where = entry_at_.find(prefix);
    error(where == entry_at_.end() ? fixed_where_or_source() : where->second,
          prefix + ": kind is required (one of " + run_config_internal::enum_choices<RewardKind>() +
              ")");
  }
}

void Parser::assign_map(const YAML::Node& map, const std::vector<Field>& fields,
                        const std::string& prefix) {
  std::map<std::string, int> seen;  // key → line
  for (const auto& entry : map) {
    const std::string where = at(entry.first.Mark());
    if (!entry.first.IsScalar()) {
      error(where,
            prefix + ": expected a key name, got " + run_config_internal::describe(entry.first));
      continue;
    }
    const std::string& key = entry.first.Scalar();
    auto [it, inserted] = seen.emplace(key, entry.first.Mark().line + 1);
    if (!inserted) {
      error(where, prefix + "." + key + ": duplicate key (first at line " +
                       std::to_string(it->second) + ")");
      continue;
    }
    assign_key(fields, key, entry.second, prefix, where);
  }
}

void Parser::assign_key(const std::vector<Field>& fields, const std::string& key,
                        const YAML::Node& value, const std::string& prefix,
                        const std::string& where) {
  const std::string path = prefix + "." + key;
  std::vector<std::string_view> keys;
  for (const Field& field : fields) {
    if (field.key != key) {
      keys.push_back(field.key);
      continue;
    }
    given_.insert(path);
    Status status = run_config_internal::assign_field(field.ptr, value);
    if (status.ok()) {
      origins_[path] = where;
    } else {
      error(where, path + ": " + status.message());
    }
    return;
  }
  std::string near = run_config_internal::nearest(key, keys);
  error(where, path + ": unknown key " +
                   (near.empty() ? "(known keys: " + join(keys, ", ") + ")"
                                 : "(did you mean " + near + "?)"));
}

void Parser::apply_override(const std::string& text) {
  const std::string where = "override " + text;
  const size_t eq = text.find('=');
  const std::string path = text.substr(0, eq);
  const size_t dot = path.find('.');
  if (eq == std::string::npos || (dot == std::string::npos && path != "rewards")) {
    error(where, "expected section.key=value (e.g. rollout.seed=3)");
    return;
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    error(where, "the value is not valid YAML: " + yaml_message(e));
    return;
  }
  const std::string name = path.substr(0, dot);
  const std::string key = dot == std::string::npos ? "" : path.substr(dot + 1);
  fixed_where_ = where;
  if (name == "rewards" && key.empty()) {
    rewards(value, where);
  } else if (name == "rewards") {
    // rewards.INDEX.key: an index one past the end adds an entry.
    const size_t dot2 = key.find('.');
    const std::string index_text = key.substr(0, dot2);
    const bool numeric = !index_text.empty() && index_text.size() < 6 &&
                         index_text.find_first_not_of("0123456789") == std::string::npos;
    const size_t index = numeric ? std::stoul(index_text) : 0;
    if (!numeric || dot2 == std::string::npos) {
      error(where, "expected rewards.INDEX.key=value or rewards=[{kind: ...}, ...]");
    } else if (index > config_.rewards.size()) {
      error(where, "rewards[" + index_text + "]: no such entry (the list has " +
                       std::to_string(config_.rewards.size()) + "; rewards." +
                       std::to_string(config_.rewards.size()) + ".kind=... adds one)");
    } else {
      if (index == config_.rewards.size()) {
        config_.rewards.emplace_back();
        entry_at_["rewards[" + index_text + "]"] = where;
      }
      assign_key(run_config_internal::reward_fields(config_.rewards[index]), key.substr(dot2 + 1),
                 value, "rewards[" + index_text + "]", where);
    }
  } else if (std::vector<Field> fields = section_fields(name); !fields.empty()) {
    assign_key(fields, key, value, name, where);
  } else {
    error(where, unknown_section(name));
  }
  fixed_where_.clear();
}

// weight_sync.dir, checkpoint.dir and check.report default to the run directory.
void resolve_defaults(RunConfig* config) {
  const std::filesystem::path run_dir(config->logging.run_dir);
  if (config->weight_sync.dir.empty()) config->weight_sync.dir = (run_dir / "weights").string();
  if (config->checkpoint.dir.empty()) {
    config->checkpoint.dir = (run_dir / "checkpoints").string();
  }
  if (config->check.report.empty()) config->check.report = (run_dir / "check.json").string();
}

}  // namespace

Result<RunConfig> parse_run_config(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides) {
  Parser parser(source_name);
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    parser.file(root);
  } catch (const YAML::Exception& e) {
    return Status::Error(location(source_name, e.mark) + ": YAML syntax error: " + yaml_message(e));
  }
  try {
    for (const std::string& text : overrides) parser.apply_override(text);
  } catch (const YAML::Exception& e) {
    return Status::Error("overrides: " + yaml_message(e));
  }
  parser.require_reward_kinds();
  if (!parser.errors().empty()) {
    std::string message;
    for (const std::string& line : parser.errors()) message += (message.empty() ? "" : "\n") + line;
    return Status::Error(message);
  }
  resolve_defaults(&parser.config());
  MILES_RETURN_IF_ERROR(
      run_config_internal::validate_with_origins(parser.config(), parser.origins()));
  return std::move(parser.config());
}

Result<RunConfig> load_run_config(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  MILES_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file_bytes(path));
  return parse_run_config(std::string(bytes.begin(), bytes.end()), path, overrides);
}

Status validate_run_config(const RunConfig& config) {
  return run_config_internal::validate_with_origins(config, {});
}

}  // namespace miles
