// The built-in verifiers: exact_match, numeric, regex, keyword and length (see miles/controller/reward.h for
// what each scores).
//
// Why: most RL-with-verifiable-rewards recipes need only these, in process and without a service.
// A label of the wrong type fails that sample (an error on its result), never the batch.
#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

// A verifier scores each sample on its own; an exception on one (std::regex may throw on a
// pathological input) becomes that sample's error.
class SampleVerifier : public Scorer {
 public:
  std::vector<Result<double>> score(std::span<const RewardInput> inputs) override {
    std::vector<Result<double>> out;
    out.reserve(inputs.size());
    for (const RewardInput& input : inputs) {
      try {
        out.push_back(score_one(input));
      } catch (const std::exception& e) {
        out.push_back(Status::Error(std::string("verifier failed: ") + e.what()));
      }
    }
    return out;
  }

 protected:
  virtual Result<double> score_one(const RewardInput& input) const = 0;
};

// The part of the response that holds the answer: after the last `answer_prefix` when one is set;
// nullopt when the prefix is set but absent (the response gave no answer).
std::optional<std::string_view> answer_text(const RewardSpec& spec, std::string_view response) {
  if (spec.answer_prefix.empty()) return response;
  return after_last(response, spec.answer_prefix);
}

class ExactMatch : public SampleVerifier {
 public:
  explicit ExactMatch(const RewardSpec& spec) : spec_(spec) {}

 protected:
  Result<double> score_one(const RewardInput& input) const override {
    if (!input.label.is_string()) {
      return Status::Error(std::string("label must be a string, got ") + input.label.type_name());
    }
    auto answer = answer_text(spec_, input.response);
    if (!answer) return 0.0;
    std::string_view got = trim(*answer);
    std::string_view want = trim(input.label.get_ref<const std::string&>());
    bool equal = spec_.case_sensitive ? got == want : to_lower_ascii(got) == to_lower_ascii(want);
    return equal ? 1.0 : 0.0;
  }

 private:
  RewardSpec spec_;
};

class Numeric : public SampleVerifier {
 public:
  explicit Numeric(const RewardSpec& spec) : spec_(spec) {}

 protected:
  Result<double> score_one(const RewardInput& input) const override {
    MILES_ASSIGN_OR_RETURN(double want, number_label(input.label));
    auto answer = answer_text(spec_, input.response);
    if (!answer) return 0.0;
    std::optional<double> got = last_number(*answer);
    if (!got) return 0.0;
    return std::abs(*got - want) <= spec_.tolerance ? 1.0 : 0.0;
  }

 private:
  RewardSpec spec_;
};

class Regex : public SampleVerifier {
 public:
  // An empty pattern means "the label is the pattern".
  explicit Regex(std::optional<SafeRegex> fixed) : fixed_(std::move(fixed)) {}

 protected:
  Result<double> score_one(const RewardInput& input) const override {
    if (fixed_) return matched(*fixed_, input.response);
    if (!input.label.is_string()) {
      return Status::Error(std::string("label must be a regex string, got ") +
                           input.label.type_name());
    }
    MILES_ASSIGN_OR_RETURN(SafeRegex re,
                           SafeRegex::compile(input.label.get_ref<const std::string&>()));
    return matched(re, input.response);
  }

 private:
  static Result<double> matched(const SafeRegex& re, std::string_view text) {
    MILES_ASSIGN_OR_RETURN(bool found, re.search(text));
    return found ? 1.0 : 0.0;
  }

  std::optional<SafeRegex> fixed_;
};

class Keyword : public SampleVerifier {
 public:
  explicit Keyword(const RewardSpec& spec) : spec_(spec) {}

 protected:
  Result<double> score_one(const RewardInput& input) const override {
    MILES_ASSIGN_OR_RETURN(std::vector<std::string> keywords, keywords_of(input.label));
    std::string text = spec_.case_sensitive ? input.response : to_lower_ascii(input.response);
    size_t found = 0;
    for (const std::string& k : keywords) {
      std::string needle = spec_.case_sensitive ? k : to_lower_ascii(k);
      if (text.find(needle) != std::string::npos) ++found;
    }
    return static_cast<double>(found) / static_cast<double>(keywords.size());
  }

 private:
  // The spec's keywords, else the label: a string or a list of strings.
  Result<std::vector<std::string>> keywords_of(const nlohmann::json& label) const {
    if (!spec_.keywords.empty()) return spec_.keywords;
    std::vector<std::string> out;
    if (label.is_string()) {
      out.push_back(label.get<std::string>());
    } else if (label.is_array()) {
      for (const auto& k : label) {
        if (!k.is_string()) {
          return Status::Error(std::string("label keywords must be strings, got ") + k.type_name());
        }
        out.push_back(k.get<std::string>());
      }
    } else {
      return Status::Error(std::string("label must be a keyword or a list of keywords, got ") +
                           label.type_name());
    }
    if (out.empty()) return Status::Error("label has no keywords");
    for (const auto& k : out) {
      if (k.empty()) return Status::Error("label has an empty keyword");
    }
    return out;
  }

  RewardSpec spec_;
};

// What the rollout function returned: a number (or a bool), or a dict's "reward".
class RolloutReturn : public SampleVerifier {
 protected:
  Result<double> score_one(const RewardInput& input) const override {
    nlohmann::json v = input.rollout_result;
    if (v.is_object()) {
      if (!v.contains("reward"))
        return Status::Error("the rollout function returned a dict without \"reward\"");
      v = v["reward"];
    }
    if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
    if (!v.is_number())
      return Status::Error(std::string("the rollout function returned ") +
                           (v.is_null() ? "None" : v.type_name()) + ", not a reward");
    return v.get<double>();
  }
};

class Length : public SampleVerifier {
 public:
  explicit Length(const RewardSpec& spec) : spec_(spec) {}

 protected:
  Result<double> score_one(const RewardInput& input) const override {
    double penalty = 0;
    if (input.response_tokens > spec_.max_tokens) {
      double over = static_cast<double>(input.response_tokens - spec_.max_tokens);
      penalty = -std::min(1.0, over / static_cast<double>(spec_.max_tokens));
    }
    if (spec_.require_finish && input.finish_reason == "length") penalty -= 1.0;
    return penalty;
  }

 private:
  RewardSpec spec_;
};

}  // namespace

Result<std::unique_ptr<Scorer>> make_verifier(const RewardSpec& spec) {
  switch (spec.kind) {
    case RewardKind::kExactMatch:
      return std::unique_ptr<Scorer>(new ExactMatch(spec));
    case RewardKind::kNumeric:
      return std::unique_ptr<Scorer>(new Numeric(spec));
    case RewardKind::kKeyword:
      return std::unique_ptr<Scorer>(new Keyword(spec));
    case RewardKind::kLength:
      return std::unique_ptr<Scorer>(new Length(spec));
    case RewardKind::kRollout:
      return std::unique_ptr<Scorer>(new RolloutReturn());
    case RewardKind::kRegex: {
      if (spec.pattern.empty()) return std::unique_ptr<Scorer>(new Regex(std::nullopt));
      MILES_ASSIGN_OR_RETURN(SafeRegex re, SafeRegex::compile(spec.pattern));
      return std::unique_ptr<Scorer>(new Regex(std::move(re)));
    }
    case RewardKind::kHttp:
    case RewardKind::kCommand:
    case RewardKind::kPython:
      break;
  }
  return Status::Error("'" + std::string(name_of(spec.kind)) + "' is not a built-in verifier");
}

}  // namespace miles::reward
