// The JSON that the http and command rewards exchange with their service: one request object per
// sample, one {"score": x} (or bare number) per reply.
//
// Why: both kinds speak the same format, and both must turn a bad reply into an error on the
// sample, never an exception.
#include <cmath>
#include <string>

#include "controller/reward_internal.h"
#include "miles/json_text.h"

namespace miles::reward {
namespace {

// A response cut mid-character is not valid UTF-8: replace, do not throw.
std::string dump_safe(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string request_json(const RewardInput& input) {
  return dump_safe({{"prompt", input.prompt},
                    {"response", input.response},
                    {"label", input.label},
                    {"finish_reason", input.finish_reason},
                    {"response_tokens", input.response_tokens}});
}

std::string excerpt(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return std::string(text.substr(0, max_chars)) + "...";
}

Result<double> parse_score_reply(std::string_view body) {
  nlohmann::json j = parse_json_or_discarded(body);
  if (j.is_discarded()) return Status::Error("reply is not JSON: '" + excerpt(body) + "'");
  const nlohmann::json* score = &j;
  if (j.is_object()) {
    auto it = j.find("score");
    if (it == j.end()) return Status::Error("reply has no \"score\": " + excerpt(dump_safe(j)));
    score = &*it;
  }
  if (!score->is_number()) {
    return Status::Error("reply score is not a number: " + excerpt(dump_safe(*score)));
  }
  double value = score->get<double>();
  if (!std::isfinite(value)) return Status::Error("reply score is not finite");
  return value;
}

}  // namespace miles::reward
