// Small helpers shared by the HTTP handlers: JSON bodies in, JSON errors out.
#pragma once

#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "miles/status.h"

namespace miles::rollout {

inline Result<nlohmann::json> parse_json_body(const std::string& body) {
  if (body.empty()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::Error(std::string("malformed JSON: ") + e.what());
  }
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
  res.set_content(j.dump(), "application/json");
}

}  // namespace miles::rollout
