// parse_json_text: JSON text from outside (a file, a request body) to a value or an error.
//
// Why: nlohmann's parse throws more than parse_error — a number beyond a double (1e999) is
// out_of_range — and a reader that caught only parse_error ended the process on such a file. Every
// reader of outside JSON that needs the whole value goes through here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "miles/status.h"

namespace miles {

// The parsed value, or an error holding nlohmann's message (which names the position and the
// reason); callers prefix the file or field. Json: nlohmann::json or nlohmann::ordered_json.
template <class Json = nlohmann::json>
Result<Json> parse_json_text(std::string_view text) {
  try {
    return Json::parse(text);
  } catch (const typename Json::exception& e) {
    return Status::Error(e.what());
  }
}

}  // namespace miles
