// libFuzzer target: what the built-in rewards read from outside. A response the policy wrote (any
// bytes), a data row's label (any JSON, or a plain string), the pattern, keywords and answer prefix
// a job file gives, a reward service's reply body (the http and command kinds) and a reward url.
// Every verifier (exact_match, numeric, regex, keyword, length, rollout) scores the sample: each
// result is an error on that sample or a finite score in the kind's range; a spec that fails
// validate() says why; a reply is a finite score or an error; a url that parses has a path and no
// byte that would break the request line. The response also goes through the calculator
// environment's tool-call finder and evaluator (the call found is a piece of the response).
//
// Input: a flags byte, then up to four fields split by '\0': response, label, spec text (pattern;
// keywords split by ','; answer prefix), reply body or url. A pattern with back-references runs
// on libstdc++'s backtracking executor, whose time is exponential in the worst case (reward.h
// says so); such patterns are compiled but matched only on short responses here.
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "controller/calculator.h"
#include "controller/reward_internal.h"

namespace {

using miles::RewardInput;
using miles::RewardKind;
using miles::RewardSpec;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

std::vector<std::string_view> fields(std::string_view rest) {
  std::vector<std::string_view> out;
  while (out.size() < 3) {
    const size_t at = rest.find('\0');
    if (at == std::string_view::npos) break;
    out.push_back(rest.substr(0, at));
    rest.remove_prefix(at + 1);
  }
  out.push_back(rest);
  out.resize(4);
  return out;
}

bool has_back_reference(std::string_view pattern) {
  for (size_t i = 0; i + 1 < pattern.size(); ++i)
    if (pattern[i] == '\\') {
      if (pattern[i + 1] >= '1' && pattern[i + 1] <= '9') return true;
      if (pattern[i + 1] == 'k') return true;
      ++i;
    }
  return false;
}

// [lo, hi] of each kind's score.
void expect_in(const RewardSpec& spec, double score, double lo, double hi) {
  if (!std::isfinite(score) || score < lo || score > hi)
    fail(std::string(miles::name_of(spec.kind)) + " scored " + std::to_string(score));
}

void score_with(const RewardSpec& spec, const RewardInput& input) {
  const miles::Status valid = spec.validate();
  if (!valid.ok()) {
    if (valid.message().empty()) fail("validate() failed without a message");
    return;
  }
  auto scorer = miles::reward::make_verifier(spec);
  if (!scorer.ok()) fail("a valid spec made no verifier: " + scorer.message());
  const auto results = (*scorer)->score(std::span<const RewardInput>(&input, 1));
  if (results.size() != 1) fail("not one result per input");
  if (!results[0].ok()) {
    if (results[0].message().empty()) fail("a sample's error without a message");
    return;
  }
  const double s = *results[0];
  switch (spec.kind) {
    case RewardKind::kKeyword:
      return expect_in(spec, s, 0, 1);
    case RewardKind::kLength:
      return expect_in(spec, s, -2, 0);
    case RewardKind::kRollout:
      return expect_in(spec, s, -DBL_MAX, DBL_MAX);
    default:  // exact_match, numeric, regex
      if (s != 0 && s != 1) fail(std::string(miles::name_of(spec.kind)) + " scored not 0 or 1");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const auto f = fields(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  const std::string_view spec_text = f[2], tail = f[3];

  RewardInput input;
  input.prompt = "What is 6 x 7?";
  input.response = std::string(f[0]);
  input.label = nlohmann::json::parse(f[1], nullptr, false);
  if (input.label.is_discarded()) input.label = std::string(f[1]);
  input.rollout_result = input.label;
  input.finish_reason = flags & 1 ? "length" : "stop";
  input.response_tokens = static_cast<int64_t>(input.response.size() / 3);
  const bool backtracking = has_back_reference(spec_text) ||
                            (input.label.is_string() && has_back_reference(input.label.get<std::string>()));
  if (backtracking && input.response.size() > 24) input.response.resize(24);

  RewardSpec s;
  s.case_sensitive = flags & 2;
  if (flags & 4) s.answer_prefix = std::string(spec_text);
  s.kind = RewardKind::kExactMatch;
  score_with(s, input);
  s.kind = RewardKind::kNumeric;
  s.tolerance = (flags >> 4) * 0.25;
  score_with(s, input);
  s.answer_prefix.clear();
  s.kind = RewardKind::kRegex;
  if (flags & 8) s.pattern = std::string(spec_text);  // else the label is the pattern
  score_with(s, input);
  s.kind = RewardKind::kKeyword;
  if (flags & 8)
    for (size_t at = 0; at <= spec_text.size();) {
      const size_t comma = std::min(spec_text.find(',', at), spec_text.size());
      s.keywords.emplace_back(spec_text.substr(at, comma - at));
      at = comma + 1;
    }
  score_with(s, input);
  s.kind = RewardKind::kLength;
  s.max_tokens = (flags >> 4) + (flags & 1);  // 0 is refused by validate()
  s.require_finish = flags & 4;
  score_with(s, input);
  s.kind = RewardKind::kRollout;
  score_with(s, input);

  // The calculator environment reads the same replies for its tool calls.
  if (const auto call = miles::controller::find_calculator_call(std::string(f[0]))) {
    if (f[0].find(*call) == std::string_view::npos) fail("a call that is not in the reply");
    (void)miles::controller::calculator_reply(*call);
  }

  // A reward service's reply, and the url of one.
  const auto reply = miles::reward::parse_score_reply(tail);
  if (reply.ok() && !std::isfinite(*reply)) fail("a reply's score is not finite");
  if (!reply.ok() && reply.message().empty()) fail("a reply refused without a message");
  const auto url = miles::reward::parse_http_url(tail);
  if (url.ok()) {
    if (!url->path.starts_with("/")) fail("a url's path without its '/': " + url->path);
    if (!url->scheme_host_port.starts_with("http://") &&
        !url->scheme_host_port.starts_with("https://"))
      fail("a url's scheme: " + url->scheme_host_port);
    for (const std::string* part : {&url->scheme_host_port, &url->path})
      for (const char c : *part)
        if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
          fail("a url that parses with a control byte or a space: " + std::string(tail));
  }
  return 0;
}
