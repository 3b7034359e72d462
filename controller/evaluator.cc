// Evaluator (evaluator.h).
#include "controller/evaluator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <optional>
#include <thread>

namespace miles::controller {

namespace {

// Evaluation groups draw their seeds from a stream of their own: the same at every evaluation and
// apart from the training prompts' (group_seed of the run's seed).
constexpr uint64_t kEvalSeedSalt = 0x6576616C75617465ull;  // "evaluate"

void add_group(const RolloutGroup& g, double threshold, EvalResult& r, int64_t& passed_prompts) {
  bool any = false;
  for (const RolloutSample& s : g.samples) {
    const bool pass = s.reward.error.empty() && s.reward.score >= threshold;
    any = any || pass;
    r.pass_at_1 += pass;
    r.reward_mean += s.reward.score;
    r.errors += !s.reward.error.empty();
    r.response_length_mean += static_cast<double>(s.tokens.size());
    r.truncated_frac += s.finish_reason == "length";
    for (const auto& [name, v] : s.reward.parts) r.parts[name] += v;
    for (const TokenOutput& t : s.tokens) {
      r.min_version = std::min(r.min_version, t.weight_version);
      r.max_version = std::max(r.max_version, t.weight_version);
    }
    ++r.samples;
  }
  passed_prompts += any;
}

}  // namespace

nlohmann::json EvalResult::metrics(int64_t k) const {
  nlohmann::json m = {{"eval_reward_mean", reward_mean},
                      {"eval_pass_at_1", pass_at_1},
                      {"eval_pass_at_" + std::to_string(k), pass_at_k},
                      {"eval_response_length_mean", response_length_mean},
                      {"eval_truncated_frac", truncated_frac},
                      {"eval_reward_errors", errors},
                      {"eval_prompts", prompts},
                      {"eval_samples", samples},
                      {"eval_weight_version", max_version},
                      {"eval_time_s", seconds}};
  for (const auto& [name, v] : parts) m["eval_reward_" + name + "_mean"] = v;
  return m;
}

Result<std::unique_ptr<Evaluator>> Evaluator::create(const RunConfig& config, EnginePool& engines,
                                                     const std::vector<RewardSpec>& rewards,
                                                     const Tokenizer& tokenizer,
                                                     const ChatTemplate* chat,
                                                     int64_t experts_per_token) {
  if (config.eval.data.empty()) return Status::Error("eval.data: no held-out prompts given");
  auto e = std::unique_ptr<Evaluator>(new Evaluator());
  e->eval_ = config.eval;
  DataSection data = config.data;
  data.path = config.eval.data;
  data.shuffle = false;  // file order: max_prompts takes the first ones
  MILES_ASSIGN_OR_RETURN(PromptData d, PromptData::load(data, tokenizer, chat));
  e->data_ = std::make_unique<PromptData>(std::move(d));
  e->prompts_ = config.eval.max_prompts > 0 ? std::min(config.eval.max_prompts, e->data_->size())
                                            : e->data_->size();
  MILES_ASSIGN_OR_RETURN(e->rewards_, RewardModel::create(rewards));
  e->rollout_ = config.rollout;
  e->rollout_.n_samples_per_prompt = config.eval.n_samples;
  e->rollout_.temperature = config.eval.temperature;
  e->rollout_.top_p = 1.0;
  e->rollout_.top_k = 0;
  if (config.eval.max_new_tokens > 0) e->rollout_.max_new_tokens = config.eval.max_new_tokens;
  e->rollout_.seed = config.rollout.seed ^ kEvalSeedSalt;
  if (!config.rollout.function.empty()) {
    MILES_ASSIGN_OR_RETURN(
        e->function_, RolloutFunction::load(config.rollout.function, config.rollout.python_path));
  }
  e->runner_ = std::make_unique<GroupRunner>(engines, *e->rewards_, tokenizer, e->rollout_,
                                             experts_per_token, chat, e->function_.get());
  return e;
}

Result<EvalResult> Evaluator::run() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::optional<Result<RolloutGroup>>> got(static_cast<size_t>(prompts_));
  std::atomic<bool> cancel{false};
  // One stream per prompt, at most kConcurrent at once (the engines queue and batch them).
  constexpr int64_t kConcurrent = 256;
  for (int64_t first = 0; first < prompts_; first += kConcurrent) {
    std::vector<std::thread> threads;
    for (int64_t p = first; p < std::min(prompts_, first + kConcurrent); ++p)
      threads.emplace_back([&, p] { got[p].emplace(runner_->run(p, data_->at(p), cancel)); });
    for (std::thread& t : threads) t.join();
  }
  EvalResult r;
  r.prompts = prompts_;
  r.min_version = INT64_MAX;
  int64_t passed_prompts = 0;
  for (auto& g : got) {
    if (!g->ok()) return g->status().with_context("eval");
    add_group(g->value(), eval_.pass_threshold, r, passed_prompts);
    r.groups.push_back(std::move(g->value()));
  }
  if (r.min_version == INT64_MAX) r.min_version = 0;
  const double n = std::max<int64_t>(r.samples, 1);
  r.reward_mean /= n;
  r.pass_at_1 /= n;
  r.response_length_mean /= n;
  r.truncated_frac /= n;
  for (auto& [name, v] : r.parts) v /= n;
  r.pass_at_k = static_cast<double>(passed_prompts) / std::max<int64_t>(r.prompts, 1);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace miles::controller
