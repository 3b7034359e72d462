// run_config_to_yaml: the resolved config, every key of every section, as YAML that
// parse_run_config reads back to an equal config.
//
// Why: a run writes it to RUN_DIR/config.yaml, so that what ran is on record with the defaults
// and overrides applied, and `miles run RUN_DIR/config.yaml` repeats it. Strings are written
// double-quoted with `${` escaped (`$${`) so that nothing is expanded twice; numbers in their
// shortest exact form.
#include <type_traits>

#include "controller/run_config_internal.h"
#include "miles/controller/run_config.h"

namespace miles {
namespace {

using run_config_internal::Field;

std::string value_text(const run_config_internal::FieldPtr& ptr) {
  return std::visit(
      [](auto* field) -> std::string {
        using T = std::remove_cvref_t<decltype(*field)>;
        if constexpr (std::is_enum_v<T>) {
          return std::string(name_of(*field));
        } else if constexpr (std::is_same_v<T, std::string>) {
          return run_config_internal::double_quoted(run_config_internal::escape_env(*field));
        } else if constexpr (std::is_same_v<T, bool>) {
          return *field ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          std::string text = run_config_internal::format_number(*field);  // "1" → "1.0": a number
          return text.find_first_not_of("-0123456789") == std::string::npos ? text + ".0" : text;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string out = "[";
          for (const std::string& item : *field) {
            if (out.size() > 1) out += ", ";
            out += run_config_internal::double_quoted(run_config_internal::escape_env(item));
          }
          return out + "]";
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::string out = "[";
          for (const int64_t item : *field)
            out += (out.size() > 1 ? ", " : "") + std::to_string(item);
          return out + "]";
        } else {
          return std::to_string(*field);
        }
      },
      ptr);
}

void write_fields(const std::vector<Field>& fields, std::string_view first_indent,
                  std::string_view indent, std::string* out) {
  for (size_t i = 0; i < fields.size(); ++i) {
    *out += i == 0 ? first_indent : indent;
    *out += fields[i].key;
    *out += ": " + value_text(fields[i].ptr) + "\n";
  }
}

}  // namespace

std::string run_config_to_yaml(const RunConfig& config) {
  RunConfig copy = config;  // the schema points into a mutable config; we only read
  std::string source = config.source;
  for (char& ch : source) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  std::string out =
      "# The resolved job config of `miles run`: every key, with the defaults and\n"
      "# the overrides applied" +
      (source.empty() ? std::string() : " (read from " + source + ")") + ".\n";
  std::vector<run_config_internal::Section> sections = run_config_internal::sections_of(copy);
  for (std::string_view name : run_config_internal::section_names()) {
    if (name == "rewards") {
      if (copy.is_sft()) continue;
      out += copy.rewards.empty() ? "rewards: []\n" : "rewards:\n";
      for (RewardSpec& spec : copy.rewards) {
        write_fields(run_config_internal::reward_fields(spec), "  - ", "    ", &out);
      }
      continue;
    }
    for (auto& section : sections) {
      if (section.name != name) continue;
      // Each kind of job writes only the keys it reads back (run_config_internal::rl_only).
      if (copy.is_sft()) {
        std::erase_if(section.fields, [&](const run_config_internal::Field& f) {
          return run_config_internal::rl_only(name, f.key);
        });
      } else if (name == "sft") {
        section.fields.clear();
      }
      if (section.fields.empty()) continue;
      out += std::string(name) + ":\n";
      write_fields(section.fields, "  ", "  ", &out);
    }
  }
  return out;
}

}  // namespace miles
