// Rewards of the RL loop: built-in verifiers, a remote reward service over HTTP, and external
// commands speaking JSON lines; a weighted sum of any of them scores each sample.
//
// Why: the controller turns finished samples into scalars for the advantage estimator. A reward
// that fails (a service down, a command that crashes, a label of the wrong type) must not stop a
// run: the failure is recorded on that sample (RewardResult::error, score 0) and counted in the
// metrics.
//
// Built-in kinds (RewardSpec::kind):
//   exact_match  1 if the response (trimmed; the text after the last `answer_prefix` when set)
//                equals the label (a string, trimmed), else 0.
//   numeric      1 if the last number in the response (or after `answer_prefix`) is within
//                `tolerance` (absolute) of the label (a number or a numeric string), else 0. A
//                number: an optional '-' (not after a letter or digit), digits with optional
//                thousands commas ("1,234"), an optional fraction; no exponents.
//                With `answer_prefix` set, a response that lacks it scores 0 (exact_match too).
//   regex        1 if `pattern` (ECMAScript) matches somewhere in the response, else 0; with
//                `pattern` empty the label is the pattern. A pattern with back-references is
//                matched only on responses of at most 2048 bytes (longer ones: a sample error),
//                since std::regex's backtracking executor recurses once per character.
//   keyword      1 if the response contains the keyword (the label, or `keywords` when given: the
//                fraction of them found), case-insensitive unless `case_sensitive`. The label may
//                be a string or a list of strings. Case folding is ASCII only (exact_match too).
//   length       a penalty: 0 while the response has at most `max_tokens` tokens, then
//                −(tokens − max_tokens) / max_tokens, floored at −1; `require_finish` adds −1 to a
//                response that was truncated (finish_reason "length").
//   http         POST `url` with {"prompt", "response", "label", "finish_reason",
//                "response_tokens"}; the reply {"score": x} (or a bare number) is the score.
//                `url`: "host:port/path", "http://host:port/path" or "https://host/path". A batch
//                goes over up to 4 concurrent connections; `timeout_s` bounds the connect, the
//                send and each read of one sample. A non-200 status, a reply that is not JSON or
//                has no finite numeric score or is longer than 1 MiB, a refused connection or a
//                timeout fail that sample.
//   command      `command` (run through /bin/sh once per scorer, kept alive) reads one such JSON
//                object per line on stdin and writes one {"score": x} per line on stdout, in order.
//                It starts at the first sample. When it exits, writes garbage (or a line nobody
//                asked for) or gives no reply within `timeout_s`, that sample fails, the process
//                (its whole process group) is killed and the next sample starts a fresh one; one
//                that exits quietly between samples is restarted without an error. Its stderr is
//                ours.
//   python       `function` ("package.module:name", slime's custom reward as a path) called in
//                this process by an embedded CPython (controller/reward_python.cc) with a dict
//                {"prompt", "response", "label", "finish_reason", "response_tokens"}; it returns a
//                number (or a bool, or {"score": x}). An `async def` function gets the whole batch
//                at once (asyncio.gather), so I/O-bound graders (an LLM judge) overlap. The module
//                is imported when the reward is created (an import error stops the job at start,
//                naming the function), from `python_path` (a directory put first on sys.path),
//                the working directory, and the active virtualenv's packages ($VIRTUAL_ENV). An
//                exception or a result that is not a finite number fails that sample, with the
//                Python traceback as its error.
//   rollout      what the sample's rollout.function returned (controller/rollout_function.h): a
//                number, a bool, or a dict's "reward"; anything else (None) fails that sample. The
//                agent environment's own verdict, weighted and summed with the other kinds.
// The sample's reward is Σ weight_i · score_i over the specs; RewardResult::parts names each.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "miles/controller/config_enum.h"
#include "miles/status.h"

namespace miles {

enum class RewardKind {
  kExactMatch,
  kNumeric,
  kRegex,
  kKeyword,
  kLength,
  kHttp,
  kCommand,
  kPython,
  kRollout
};
template <>
struct ConfigEnum<RewardKind> {
  static constexpr std::array names =
      std::to_array<std::string_view>({"exact_match", "numeric", "regex", "keyword", "length",
                                       "http", "command", "python", "rollout"});
};

struct RewardSpec {
  RewardKind kind = RewardKind::kExactMatch;
  std::string name;          // metrics name (default: kind, made unique by index)
  double weight = 1.0;
  std::string answer_prefix;     // exact_match / numeric: score the text after its last occurrence
  double tolerance = 1e-6;       // numeric
  std::string pattern;           // regex
  std::vector<std::string> keywords;  // keyword (empty: the label)
  bool case_sensitive = false;   // keyword / exact_match
  int64_t max_tokens = 0;        // length: > 0
  bool require_finish = false;   // length
  std::string url;               // http
  std::string command;           // command
  std::string function;          // python: "package.module:name"
  std::string python_path;       // python: a directory searched first for the module
  double timeout_s = 30;         // http / command: per sample, > 0
  // Names the bad field (the kind is checked where the config is parsed): a weight that is not
  // finite, a negative tolerance, an invalid `pattern` (named), an empty keyword, max_tokens <= 0
  // for length, a missing or malformed url, a missing command, timeout_s <= 0 for http / command,
  // a python function that is not "module:name".
  Status validate() const;
};

// What a reward sees of one finished sample.
struct RewardInput {
  std::string prompt;          // the prompt text (decoded)
  std::string response;        // the response text (decoded from the generated ids)
  nlohmann::json label;        // the data row's label (any JSON), null when absent
  std::string finish_reason;   // stop | length | abort
  int64_t response_tokens = 0;
  nlohmann::json rollout_result;  // what rollout.function returned for it (null otherwise)
};

struct RewardResult {
  double score = 0;                      // Σ weight · part (failed parts count 0)
  std::map<std::string, double> parts;   // unweighted score of each spec, by name
  std::string error;                     // non-empty when any part failed: "name: message; ..."
};

// One configured reward (the sum of its specs). Thread-compatible: score() may be called from one
// thread at a time; it scores the batch in order (http requests may run concurrently inside).
class RewardModel {
 public:
  // Validates every spec (the error names "rewards[i]" and the field) and names them uniquely: the
  // name, or the kind, with "_2", "_3", ... on a name already taken, in spec order. At least one
  // spec is required. specs() returns them with their final names.
  static Result<std::unique_ptr<RewardModel>> create(std::vector<RewardSpec> specs);
  virtual ~RewardModel() = default;
  // One result per input, in order. Never fails as a whole: errors land on the samples.
  virtual std::vector<RewardResult> score(std::span<const RewardInput> inputs) = 0;
  virtual const std::vector<RewardSpec>& specs() const = 0;
};

}  // namespace miles
