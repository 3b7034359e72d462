// How Python turns template values into text: str(), repr(), json.dumps(), '%' and str.format.
//
// Why: `{{ x }}` prints Python's str(x), `tojson` is json.dumps as transformers calls it, and a
// tool schema or a float printed one character differently changes the prompt's tokens. Python's
// float repr (shortest round-trip digits, exponent outside 1e-4..1e16), its string repr quoting and
// json.dumps' escaping, separators and indentation are reproduced here exactly.
#pragma once

#include <optional>
#include <string>

#include "chat/jinja_value.h"

namespace miles::jinja {

std::string float_repr(double d);    // repr(float): "1.0", "1e-05", "1e+16", "inf", "nan"
std::string to_str(const Value& v);  // str(v); Undefined prints as ""
std::string repr(const Value& v);    // repr(v)
std::string string_repr(const std::string& s);  // repr(str): quotes and escapes as Python

struct JsonDumpOptions {
  bool ensure_ascii = false;          // transformers' tojson default
  std::optional<std::string> indent;  // nullopt: one line; "" (indent=0) or spaces/string per level
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

// printf-style `fmt % args` (args: a tuple, or a single value; a dict for %(name)s).
std::string percent_format(const std::string& fmt, const Value& args);
// str.format with {} / {0} / {name} fields and simple format specs.
std::string str_format(const std::string& fmt, const Args& args);

}  // namespace miles::jinja
