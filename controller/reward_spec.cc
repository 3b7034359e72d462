// RewardSpec::validate: the checks a reward's configuration must pass before any sample is scored.
//
// Why: a slip in a reward config (a missing url, a bad regex) should stop a job at start-up with a
// message naming the field, not surface as thousands of failed samples later. An unknown kind is
// refused where the config is parsed (RewardKind).
#include <algorithm>
#include <cmath>
#include <string>

#include "controller/reward_internal.h"

namespace miles {
Status RewardSpec::validate() const {
  const std::string who = "reward '" + (name.empty() ? std::string(name_of(kind)) : name) + "'";
  auto error = [&](const std::string& message) { return Status::Error(who + ": " + message); };
  if (!std::isfinite(weight)) return error("weight must be finite, got " + std::to_string(weight));
  if (kind == RewardKind::kNumeric && !(std::isfinite(tolerance) && tolerance >= 0)) {
    return error("tolerance must be finite and >= 0, got " + std::to_string(tolerance));
  }
  if (kind == RewardKind::kRegex && !pattern.empty()) {
    auto re = reward::SafeRegex::compile(pattern);
    if (!re.ok()) return error(re.message());
  }
  if (kind == RewardKind::kKeyword) {
    for (const auto& k : keywords) {
      if (k.empty()) return error("keywords must not contain an empty string");
    }
  }
  if (kind == RewardKind::kLength && max_tokens <= 0) {
    return error("max_tokens must be > 0 for a length reward, got " + std::to_string(max_tokens));
  }
  if (kind == RewardKind::kHttp) {
    if (url.empty()) return error("url is required for an http reward");
    auto parsed = reward::parse_http_url(url);
    if (!parsed.ok()) return error(parsed.message());
  }
  if (kind == RewardKind::kCommand && command.empty()) {
    return error("command is required for a command reward");
  }
  if (kind == RewardKind::kPython) {
    const size_t colon = function.find(':');
    if (function.empty())
      return error("function is required for a python reward (\"module:name\")");
    if (colon == std::string::npos || colon == 0 || colon + 1 == function.size() ||
        function.find(':', colon + 1) != std::string::npos)
      return error("function must be \"package.module:name\", got \"" + function + "\"");
  }
  if ((kind == RewardKind::kHttp || kind == RewardKind::kCommand) &&
      !(std::isfinite(timeout_s) && timeout_s > 0)) {
    return error("timeout_s must be finite and > 0, got " + std::to_string(timeout_s));
  }
  return Status::Ok();
}

}  // namespace miles
