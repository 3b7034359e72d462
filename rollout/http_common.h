// Small helpers shared by the HTTP handlers: JSON bodies in, JSON errors out.
#pragma once

#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "miles/json_text.h"
#include "miles/status.h"

namespace miles::rollout {

inline Result<nlohmann::json> parse_json_body(const std::string& body) {
  if (body.empty()) return nlohmann::json::object();
  auto j = parse_json_text(body);
  if (!j.ok()) return Status::Error("malformed JSON: " + j.message());
  return j;
}

// {"error": {"message": ..., "type": ..., "code": status}} — the OpenAI shape, which SGLang clients
// also accept.
inline void reply_error(httplib::Response& res, int status, const std::string& message,
                        std::atomic<uint64_t>& error_count) {
  ++error_count;
  res.status = status;
  nlohmann::json j = {{"error",
                       {{"message", message},
                        {"type", status < 500 ? "invalid_request_error" : "server_error"},
                        {"code", status}}}};
  // The message may quote the client's bytes: invalid UTF-8 is replaced, never a throw (a 500).
  res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

}  // namespace miles::rollout
