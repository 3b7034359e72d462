// RewardSpec::validate: the checks a reward's configuration must pass before any sample is scored.
//
// Why: a typo in a reward config (an unknown kind, a missing url, a bad regex) should stop a job at
// start-up with a message naming the field, not surface as thousands of failed samples later.
#include <algorithm>
#include <cmath>
#include <string>

#include "controller/reward_internal.h"

namespace miles {
namespace reward {

const std::vector<std::string>& known_kinds() {
  static const std::vector<std::string> kKinds = {"exact_match", "numeric", "regex",  "keyword",
                                                  "length",      "http",    "command"};
  return kKinds;
}

}  // namespace reward

Status RewardSpec::validate() const {
  const std::string who = "reward '" + (name.empty() ? kind : name) + "'";
  auto error = [&](const std::string& message) { return Status::Error(who + ": " + message); };
  const auto& kinds = reward::known_kinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    std::string known;
    for (const auto& k : kinds) known += (known.empty() ? "" : ", ") + k;
    return error("kind '" + kind + "' is unknown (known: " + known + ")");
  }
  if (!std::isfinite(weight)) return error("weight must be finite, got " + std::to_string(weight));
  if (kind == "numeric" && !(std::isfinite(tolerance) && tolerance >= 0)) {
    return error("tolerance must be finite and >= 0, got " + std::to_string(tolerance));
  }
  if (kind == "regex" && !pattern.empty()) {
    auto re = reward::SafeRegex::compile(pattern);
    if (!re.ok()) return error(re.message());
  }
  if (kind == "keyword") {
    for (const auto& k : keywords) {
      if (k.empty()) return error("keywords must not contain an empty string");
    }
  }
  if (kind == "length" && max_tokens <= 0) {
    return error("max_tokens must be > 0 for a length reward, got " + std::to_string(max_tokens));
  }
  if (kind == "http") {
    if (url.empty()) return error("url is required for an http reward");
    auto parsed = reward::parse_http_url(url);
    if (!parsed.ok()) return error(parsed.message());
  }
  if (kind == "command" && command.empty()) {
    return error("command is required for a command reward");
  }
  if ((kind == "http" || kind == "command") && !(std::isfinite(timeout_s) && timeout_s > 0)) {
    return error("timeout_s must be finite and > 0, got " + std::to_string(timeout_s));
  }
  return Status::Ok();
}

}  // namespace miles
