// parse_json_text: JSON text from outside (a file, a request body, a line of a dataset, a reply of
// a user's service or function) to a value or an error.
//
// Why: two ways outside JSON ended the process. nlohmann's parse throws more than parse_error — a
// number beyond a double (1e999) is out_of_range — and a reader that caught only parse_error died
// on such a file. And nlohmann parses any depth (its parser keeps an explicit stack) but copies,
// compares and dumps a value recursively: a 1 MB body of nested brackets parsed fine and then
// overflowed the stack of the thread that quoted it in an error message (`miles serve` died on one
// request). So every reader of outside JSON goes through here, and a value nested deeper than
// kMaxJsonDepth is an error before it is parsed. parse_json_or_discarded is the same for the
// readers that test is_discarded() (any error gives a discarded value). The safetensors header,
// whose parse also watches for duplicate names, checks json_depth_ok itself.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "miles/status.h"

namespace miles {

// Arrays and objects inside each other, at most. Real files and requests nest tens of levels;
// the chat templates' renderer refuses values nested more than 500 levels deep.
inline constexpr int kMaxJsonDepth = 512;

// Whether no array or object in `text` opens inside more than max_depth others (brackets inside
// strings do not count). A linear scan; it does not check the rest of the syntax.
inline bool json_depth_ok(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// The parsed value, or an error holding nlohmann's message (which names the position and the
// reason); callers prefix the file or field. Json: nlohmann::json or nlohmann::ordered_json.
template <class Json = nlohmann::json>
Result<Json> parse_json_text(std::string_view text) {
  if (!json_depth_ok(text))
    return Status::Error("arrays and objects nest more than " + std::to_string(kMaxJsonDepth) +
                         " levels deep");
  try {
    return Json::parse(text);
  } catch (const typename Json::exception& e) {
    return Status::Error(e.what());
  }
}

// parse_json_text for the readers that only tell good from bad: a discarded value on any error.
template <class Json = nlohmann::json>
Json parse_json_or_discarded(std::string_view text) {
  if (!json_depth_ok(text)) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace miles
