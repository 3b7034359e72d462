// RewardModel: validates the specs, names them uniquely, builds one Scorer per spec, and sums the
// weighted parts of each sample.
//
// Why: the controller sees one reward per sample; the parts (by name) and the errors (by name) are
// what its metrics report.
#include <exception>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "controller/reward_internal.h"

namespace miles {
namespace {

using reward::Scorer;

// Default name = kind; a name already taken gets "_2", "_3", ... in spec order.
void assign_unique_names(std::vector<RewardSpec>& specs) {
  std::set<std::string> taken;
  for (RewardSpec& spec : specs) {
    std::string base = spec.name.empty() ? std::string(name_of(spec.kind)) : spec.name;
    std::string name = base;
    for (int k = 2; taken.count(name) > 0; ++k) name = base + "_" + std::to_string(k);
    spec.name = name;
    taken.insert(name);
  }
}

Result<std::unique_ptr<Scorer>> make_scorer(const RewardSpec& spec) {
  switch (spec.kind) {
    case RewardKind::kHttp:
      return reward::make_http_scorer(spec);
    case RewardKind::kCommand:
      return reward::make_command_scorer(spec);
    case RewardKind::kPython:
      return reward::make_python_scorer(spec);
    default:
      return reward::make_verifier(spec);
  }
}

class WeightedSum : public RewardModel {
 public:
  WeightedSum(std::vector<RewardSpec> specs, std::vector<std::unique_ptr<Scorer>> scorers)
      : specs_(std::move(specs)), scorers_(std::move(scorers)) {}

  std::vector<RewardResult> score(std::span<const RewardInput> inputs) override {
    std::vector<RewardResult> results(inputs.size());
    for (size_t s = 0; s < specs_.size(); ++s) {
      std::vector<Result<double>> parts = score_part(s, inputs);
      for (size_t i = 0; i < inputs.size(); ++i) add_part(specs_[s], parts[i], results[i]);
    }
    return results;
  }

  const std::vector<RewardSpec>& specs() const override { return specs_; }

 private:
  // Scorers handle their own errors; this is the last guard that keeps a batch alive.
  std::vector<Result<double>> score_part(size_t s, std::span<const RewardInput> inputs) {
    std::vector<Result<double>> parts;
    try {
      parts = scorers_[s]->score(inputs);
    } catch (const std::exception& e) {
      parts.clear();
      parts.resize(inputs.size(), Status::Error(std::string("scoring failed: ") + e.what()));
    }
    if (parts.size() != inputs.size()) {
      parts.assign(inputs.size(), Status::Error("scorer returned a wrong number of scores"));
    }
    return parts;
  }

  static void add_part(const RewardSpec& spec, const Result<double>& part, RewardResult& result) {
    double value = part.ok() ? part.value() : 0.0;
    result.parts[spec.name] = value;
    result.score += spec.weight * value;
    if (!part.ok()) {
      if (!result.error.empty()) result.error += "; ";
      result.error += spec.name + ": " + part.message();
    }
  }

  std::vector<RewardSpec> specs_;
  std::vector<std::unique_ptr<Scorer>> scorers_;  // one per spec
};

}  // namespace

Result<std::unique_ptr<RewardModel>> RewardModel::create(std::vector<RewardSpec> specs) {
  if (specs.empty()) return Status::Error("rewards: at least one reward spec is needed");
  for (size_t i = 0; i < specs.size(); ++i) {
    MILES_RETURN_IF_ERROR(specs[i].validate().with_context("rewards[" + std::to_string(i) + "]"));
  }
  assign_unique_names(specs);
  std::vector<std::unique_ptr<Scorer>> scorers;
  for (const RewardSpec& spec : specs) {
    auto scorer = make_scorer(spec);
    if (!scorer.ok()) return scorer.status().with_context("reward '" + spec.name + "'");
    scorers.push_back(std::move(scorer).value());
  }
  return std::unique_ptr<RewardModel>(new WeightedSum(std::move(specs), std::move(scorers)));
}

}  // namespace miles
