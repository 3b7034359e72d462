// The pieces behind RewardModel (include/miles/controller/reward.h): one Scorer per RewardSpec, the JSON wire
// format that the http and command kinds share, and the URL parser of the http kind.
//
// Why: RewardModel only sums weighted parts; each kind of reward lives in its own file behind this
// small interface, so that a new kind is a new file and a factory line in reward_model.cc.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "miles/controller/reward.h"
#include "miles/status.h"

namespace miles::reward {

// Scores one spec over a batch. Thread-compatible, like RewardModel.
class Scorer {
 public:
  virtual ~Scorer() = default;
  // One unweighted score per input, in order; an error on a sample is that sample's failure. Must
  // not throw.
  virtual std::vector<Result<double>> score(std::span<const RewardInput> inputs) = 0;
};

// Built-in verifiers (reward_verifiers.cc): exact_match, numeric, regex, keyword, length. The spec
// must have passed validate().
Result<std::unique_ptr<Scorer>> make_verifier(const RewardSpec& spec);
// POST to a reward service (reward_http.cc).
Result<std::unique_ptr<Scorer>> make_http_scorer(const RewardSpec& spec);
// A long-lived external command speaking JSON lines (reward_command.cc).
Result<std::unique_ptr<Scorer>> make_command_scorer(const RewardSpec& spec);
// A Python function in this process (reward_python.cc); its module is imported here.
Result<std::unique_ptr<Scorer>> make_python_scorer(const RewardSpec& spec);

// Text helpers of the verifiers (reward_text.cc). ASCII only: case folding and whitespace leave
// other bytes as they are.
std::string_view trim(std::string_view text);
std::string to_lower_ascii(std::string_view text);
// The text after the last occurrence of `prefix`; nullopt when it does not occur.
std::optional<std::string_view> after_last(std::string_view text, std::string_view prefix);
// The last number in `text`: an optional '-' (not after a letter or digit), digits with optional
// thousands commas ("1,234"), an optional fraction ("3.5", ".5"). No exponents. nullopt if none.
std::optional<double> last_number(std::string_view text);
// A label that must be a number: a JSON number or a string holding one (commas allowed).
Result<double> number_label(const nlohmann::json& label);

// A std::regex (ECMAScript) that a long response cannot crash (reward_regex.cc). libstdc++'s
// default executor backtracks by recursion, one stack frame chain per character: a pattern such as
// "a.*x" overflows an 8 MB stack on a 40 KB response. Patterns without back-references run on its
// breadth-first executor (recursion bounded by the pattern); those with back-references are
// matched only on texts of at most kMaxBacktrackingBytes. Matching time stays the pattern's
// business (a pattern like "a*y" is quadratic on a long run of 'a').
class SafeRegex {
 public:
  static constexpr size_t kMaxBacktrackingBytes = 2048;
  // An error names the pattern.
  static Result<SafeRegex> compile(const std::string& pattern);
  // Whether the pattern matches somewhere in `text`.
  Result<bool> search(std::string_view text) const;

 private:
  SafeRegex(std::regex re, bool backtracking) : re_(std::move(re)), backtracking_(backtracking) {}
  std::regex re_;
  bool backtracking_;
};

// A timeout in seconds as the clocks take it: a huge one (it passed validate()) becomes 10^7 s
// rather than overflow a time_t or a steady_clock duration.
inline double bounded_timeout(double timeout_s) { return timeout_s < 1e7 ? timeout_s : 1e7; }

// "host:port/path", "http://host:port/path" or "https://host/path", split for httplib.
struct HttpUrl {
  std::string scheme_host_port;  // "http://host:port"
  std::string path;              // "/path" ("/" when absent)
};
Result<HttpUrl> parse_http_url(std::string_view url);

// The JSON wire format of the http and command kinds (reward_wire.cc).
// {"prompt", "response", "label", "finish_reason", "response_tokens"}, on one line. Invalid UTF-8
// in the texts is replaced (U+FFFD) rather than thrown on.
std::string request_json(const RewardInput& input);
// {"score": x} or a bare number x; x must be a finite number.
Result<double> parse_score_reply(std::string_view body);
// At most `max_chars` of `text`, with "..." when cut: for error messages that quote a reply.
std::string excerpt(std::string_view text, size_t max_chars = 120);

}  // namespace miles::reward
