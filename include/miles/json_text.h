// parse_json_text: JSON text from outside (a file, a request body) to a value or an error.
//
// Why: nlohmann's parse throws more than parse_error — a number beyond a double (1e999) is
// out_of_range — and a reader that caught only parse_error ended the process on such a file. The
// readers of whole files and request bodies go through here. The others either parse with
// allow_exceptions = false (any error, 1e999 included, gives a discarded value: the JSONL line
// readers, weight_sync's routes) or catch json::exception itself (the safetensors header, whose
// parse also watches for duplicate names).
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
