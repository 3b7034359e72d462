// GroupRunner (group_runner.h): generate, continue aborted samples, decode, score.
#include "controller/group_runner.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

namespace miles::controller {

int64_t RolloutSample::min_version() const {
  int64_t v = INT64_MAX;
  for (const TokenOutput& t : tokens) v = std::min(v, t.weight_version);
  return tokens.empty() ? 0 : v;
}

int64_t RolloutGroup::min_version() const {
  int64_t v = INT64_MAX;
  for (const RolloutSample& s : samples)
    if (!s.tokens.empty()) v = std::min(v, s.min_version());
  return v == INT64_MAX ? 0 : v;
}

bool RolloutGroup::zero_variance() const {
  const RolloutSample* first = nullptr;
  for (const RolloutSample& s : samples) {
    if (s.failed()) continue;
    if (first && s.reward.score != first->reward.score) return false;
    if (!first) first = &s;
  }
  return true;
}

uint64_t group_seed(uint64_t seed, int64_t position) {
  // splitmix64 of the pair: well mixed, portable, no state.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(position) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Result<RolloutGroup> GroupRunner::run(int64_t position, const Prompt& prompt,
                                      const std::atomic<bool>& cancel) {
  const auto t0 = std::chrono::steady_clock::now();
  RolloutGroup g;
  g.position = position;
  g.prompt = &prompt;
  GroupRequest req;
  req.input_ids = prompt.ids;
  req.n = static_cast<int32_t>(cfg_.n_samples_per_prompt);
  req.max_new_tokens = cfg_.max_new_tokens;
  req.temperature = cfg_.temperature;
  req.top_p = cfg_.top_p;
  req.top_k = cfg_.top_k;
  req.seed = group_seed(cfg_.seed, position);
  req.stop = cfg_.stop;
  req.return_routed_experts = experts_;
  std::vector<GeneratedSample> gen;
  if (cfg_.environment != Environment::kNone || function_) {
    // The group's sessions run side by side (the engines batch their turns); each sample's tokens
    // depend only on its seed and index, so the order they finish in changes nothing.
    std::vector<std::optional<Result<RolloutSample>>> done(static_cast<size_t>(req.n));
    std::vector<std::thread> sessions;
    for (int32_t i = 0; i < req.n; ++i)
      sessions.emplace_back([&, i] { done[i].emplace(run_session(prompt, req.seed, i, cancel)); });
    for (std::thread& t : sessions) t.join();
    for (auto& r : done) {
      if (!r->ok()) return r->status();
      g.samples.push_back(std::move(*r).value());
    }
  } else {
    MILES_ASSIGN_OR_RETURN(gen, pool_.generate(req, cancel));
  }
  for (GeneratedSample& s : gen) {
    RolloutSample r;
    r.index = s.index;
    r.tokens = std::move(s.tokens);
    r.finish_reason = std::move(s.finish_reason);
    r.prompt_tokens = s.prompt_tokens;
    r.routed_experts = std::move(s.routed_experts);
    g.samples.push_back(std::move(r));
  }
  MILES_RETURN_IF_ERROR(continue_aborted(prompt, req.seed, g, cancel));

  std::vector<RewardInput> inputs;
  std::vector<size_t> scored;  // the samples that did not fail
  for (size_t i = 0; i < g.samples.size(); ++i) {
    RolloutSample& s = g.samples[i];
    if (s.failed()) continue;
    scored.push_back(i);
    std::vector<int32_t> ids;
    for (const TokenOutput& t : s.tokens) ids.push_back(t.id);
    if (s.trajectory.empty()) s.response = tok_.decode(ids);
    RewardInput in;
    in.prompt = prompt.text;
    in.response = s.response;
    in.label = prompt.label;
    in.finish_reason = s.finish_reason;
    in.response_tokens = static_cast<int64_t>(ids.size());
    in.rollout_result = s.rollout_result;
    inputs.push_back(std::move(in));
  }
  std::vector<RewardResult> scores;
  {
    std::lock_guard<std::mutex> lock(rewards_mu_);
    scores = rewards_.score(inputs);
  }
  for (size_t i = 0; i < scored.size(); ++i) g.samples[scored[i]].reward = std::move(scores[i]);
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

Status GroupRunner::continue_aborted(const Prompt& prompt, uint64_t seed, RolloutGroup& g,
                                     const std::atomic<bool>& cancel) {
  for (RolloutSample& s : g.samples) {
    for (int round = 0; s.finish_reason == "abort"; ++round) {
      if (round >= 64) return Status::Error("a sample was aborted 64 times in a row");
      const int64_t have = static_cast<int64_t>(s.tokens.size());
      if (have >= cfg_.max_new_tokens) {
        s.finish_reason = "length";
        break;
      }
      ++g.continuations;
      GroupRequest req;
      req.input_ids = prompt.ids;
      for (const TokenOutput& t : s.tokens) req.input_ids.push_back(t.id);
      req.n = 1;
      req.max_new_tokens = cfg_.max_new_tokens - have;
      req.temperature = cfg_.temperature;
      req.top_p = cfg_.top_p;
      req.top_k = cfg_.top_k;
      req.seed = group_seed(seed + static_cast<uint64_t>(s.index), have);
      req.stop = cfg_.stop;
      req.return_routed_experts = experts_;
      MILES_ASSIGN_OR_RETURN(std::vector<GeneratedSample> more, pool_.generate(req, cancel));
      GeneratedSample& m = more.front();
      s.tokens.insert(s.tokens.end(), m.tokens.begin(), m.tokens.end());
      s.finish_reason = m.finish_reason;
      if (!m.routed_experts.empty()) s.routed_experts = std::move(m.routed_experts);
    }
  }
  return Status::Ok();
}

}  // namespace miles::controller
