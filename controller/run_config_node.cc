// YAML value → typed job-config field, strictly: integers are decimal integers (1.5 and 1e3 are
// not), numbers are finite, booleans are true or false, lists are YAML sequences of scalars.
//
// Why: YAML's own typing is loose (yes/no/on/off, 0x10, .inf); a job file is read once, by us,
// and a value that does not mean exactly one thing should stop the run with a clear message.
#include "controller/run_config_node.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace miles::run_config_internal {
namespace {

std::string got(std::string_view expected, const YAML::Node& node) {
  return "expected " + std::string(expected) + ", got " + describe(node);
}

// The whole of `text` as T via std::from_chars ('+' allowed in front).
template <typename T>
bool parse_number(std::string_view text, T* out, bool* out_of_range) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  std::from_chars_result r;
  if constexpr (std::is_floating_point_v<T>) {
    r = std::from_chars(text.data(), text.data() + text.size(), *out, std::chars_format::general);
  } else {
    r = std::from_chars(text.data(), text.data() + text.size(), *out);
  }
  *out_of_range = r.ec == std::errc::result_out_of_range;
  return r.ec == std::errc() && r.ptr == text.data() + text.size();
}

Status assign(std::string* out, const YAML::Node& node) {
  if (node.IsNull()) {
    out->clear();
    return Status::Ok();
  }
  if (!node.IsScalar()) return Status::Error(got("a string", node));
  MILES_ASSIGN_OR_RETURN(*out, expand_env(node.Scalar()));
  return Status::Ok();
}

Status assign(int64_t* out, const YAML::Node& node) {
  bool out_of_range = false;
  if (node.IsScalar() && parse_number(node.Scalar(), out, &out_of_range)) return Status::Ok();
  return Status::Error(got("an integer", node) + (out_of_range ? " (out of range)" : ""));
}

Status assign(uint64_t* out, const YAML::Node& node) {
  bool out_of_range = false;
  if (node.IsScalar() && !node.Scalar().starts_with('-') &&
      parse_number(node.Scalar(), out, &out_of_range)) {
    return Status::Ok();
  }
  return Status::Error(got("a non-negative integer", node) +
                       (out_of_range ? " (out of range)" : ""));
}

Status assign(double* out, const YAML::Node& node) {
  bool out_of_range = false;
  if (node.IsScalar() && parse_number(node.Scalar(), out, &out_of_range) && std::isfinite(*out)) {
    return Status::Ok();
  }
  return Status::Error(got("a number", node) + (out_of_range ? " (out of range)" : ""));
}

Status assign(bool* out, const YAML::Node& node) {
  if (node.IsScalar() && (node.Scalar() == "true" || node.Scalar() == "false")) {
    *out = node.Scalar() == "true";
    return Status::Ok();
  }
  return Status::Error(got("true or false", node));
}

Status assign(std::vector<std::string>* out, const YAML::Node& node) {
  if (node.IsNull()) {
    out->clear();
    return Status::Ok();
  }
  if (!node.IsSequence()) {
    return Status::Error(
        got("a list of strings", node) +
        (node.IsScalar() ? " (write [" + double_quoted(node.Scalar()) + "])" : ""));
  }
  std::vector<std::string> items;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) {
      return Status::Error("expected a list of strings, got " + describe(item) + " in the list");
    }
    MILES_ASSIGN_OR_RETURN(std::string value, expand_env(item.Scalar()));
    items.push_back(std::move(value));
  }
  *out = std::move(items);
  return Status::Ok();
}

Status assign(std::vector<int64_t>* out, const YAML::Node& node) {
  if (node.IsNull()) {
    out->clear();
    return Status::Ok();
  }
  if (!node.IsSequence()) {
    return Status::Error(got("a list of integers", node) +
                         (node.IsScalar() ? " (write [" + node.Scalar() + "])" : ""));
  }
  std::vector<int64_t> items;
  for (const YAML::Node& item : node) {
    int64_t value = 0;
    if (Status s = assign(&value, item); !s.ok())
      return Status::Error(s.message() + " in the list of integers");
    items.push_back(value);
  }
  *out = std::move(items);
  return Status::Ok();
}

// An enum key: one of its names, else the list and the nearest name.
template <typename E>
requires std::is_enum_v<E> Status assign(E* out, const YAML::Node& node) {
  const auto& names = ConfigEnum<E>::names;
  if (node.IsScalar()) {
    MILES_ASSIGN_OR_RETURN(const std::string text, expand_env(node.Scalar()));
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == text) {
        *out = static_cast<E>(i);
        return Status::Ok();
      }
    }
    const std::string near = nearest(text, names);
    return Status::Error("expected one of " + enum_choices<E>() + ", got " + double_quoted(text) +
                         (near.empty() ? "" : " (did you mean " + near + "?)"));
  }
  return Status::Error(got("one of " + enum_choices<E>(), node));
}

}  // namespace

Status assign_field(const FieldPtr& ptr, const YAML::Node& node) {
  return std::visit([&](auto* field) { return assign(field, node); }, ptr);
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return double_quoted(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

std::string double_quoted(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(ch));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace miles::run_config_internal
