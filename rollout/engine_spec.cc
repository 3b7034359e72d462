// Speculative decoding inside an engine iteration (docs/speculative.md): after the iteration's
// decodes and prefill chunks are scheduled, running samples get drafted ids to feed after their
// newest token (plan_drafts); the one forward computes a row of logits per fed position, and
// verify() lets the sample draw at each row exactly as plain decoding would, keeping drafts while
// its draw equals them. Every draw is the sampler's pure function of (row, seed, step), and the
// kernels give a position the same row whether it is fed alone or in a chunk, so the emitted
// tokens, logprobs, versions and routed experts are those of the plain rollout.
#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "miles/check.h"
#include "rollout/engine_impl.h"

namespace miles {

using rollout::Sample;
using rollout::SampleState;

namespace {

constexpr double kCalibrationPrior = 4;  // draft tokens' worth of weight on the engine's history

}  // namespace

DraftQuery Engine::Impl::draft_query(const Sample& s, int64_t max_tokens,
                                     std::span<const Sample* const> same_prompt) const {
  DraftQuery q;
  q.tokens = s.tokens;
  q.prompt_len = s.prompt_len;
  q.prompt_key = s.prompt_key;
  q.max_tokens = max_tokens;
  q.sample = static_cast<uint64_t>(s.slot);
  q.sampling = s.sampling;
  q.step = static_cast<int64_t>(s.output.size());  // draw()'s step for the row after the newest
  for (const Sample* o : same_prompt)
    if (o != &s && static_cast<int64_t>(o->tokens.size()) > o->prompt_len)
      q.siblings.emplace_back(o->tokens);
  return q;
}

std::vector<float> Engine::Impl::accept_chances(const Sample& s) const {
  // How the drafter's confidences have fared: accepted over predicted, the sample's own history
  // weighed against the engine's (a new sample starts from the engine's).
  const double engine_rate = (spec_accepted + 1) / (spec_predicted + 1);
  const double rate =
      (s.spec_accepted + kCalibrationPrior * engine_rate) / (s.spec_predicted + kCalibrationPrior);
  std::vector<float> out;
  double p = 1;
  for (const float c : s.draft_confidence) {
    p *= std::min(1.0, c * rate);
    out.push_back(static_cast<float>(p));
  }
  return out;
}

void Engine::Impl::plan_drafts(std::vector<Item>& items, int64_t budget) {
  if (!drafter || !opt.speculative.enabled || budget <= 0) return;
  if (opt.speculative.adaptive && spec_cooldown > 0) {
    --spec_cooldown;
    return;
  }
  const int64_t context = runner->config().max_position_embeddings;
  std::unordered_map<uint64_t, std::vector<const Sample*>>
      by_prompt;  // every sample, running or not
  for (const auto& [id, r] : requests)
    for (const auto& o : r->samples) by_prompt[o->prompt_key].push_back(o.get());
  std::vector<size_t> candidates, asked;
  std::vector<std::vector<float>> chances;
  std::vector<DraftQuery> queries;
  int64_t base_tokens = 0, decodes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    base_tokens += items[i].n;
    if (items[i].prefill) continue;
    ++decodes;
    Sample& s = *items[i].sample;
    const GenerateRequest& req = requests.at(s.request_id)->req;
    // A verify of k drafts emits up to k + 1 tokens at positions up to computed + k.
    const int64_t k = std::min({opt.speculative.max_draft_tokens,
                                req.max_new_tokens - static_cast<int64_t>(s.output.size()) - 1,
                                context - static_cast<int64_t>(s.tokens.size())});
    if (k <= 0) continue;
    queries.push_back(draft_query(s, k, by_prompt[s.prompt_key]));
    asked.push_back(i);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Draft> drafts = drafter->propose_all(queries);
  draft_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t a = 0; a < asked.size(); ++a) {
    const Draft& d = drafts[a];
    Sample& s = *items[asked[a]].sample;
    const size_t n = std::min(
        {d.tokens.size(), d.confidence.size(), static_cast<size_t>(queries[a].max_tokens)});
    if (n == 0) continue;
    s.draft.assign(d.tokens.begin(), d.tokens.begin() + n);
    s.draft_confidence.assign(d.confidence.begin(), d.confidence.begin() + n);
    candidates.push_back(asked[a]);
    chances.push_back(accept_chances(s));
  }
  if (candidates.empty()) return;
  if (opt.speculative.adaptive &&
      (!iteration_cost.measured(base_tokens) || spec_since_plain >= rollout::kSpecRefreshEvery)) {
    spec_since_plain = 0;  // time the plain forward of this size: no drafts this iteration
    for (size_t i : candidates) items[i].sample->draft.clear();
    for (size_t i : candidates) items[i].sample->draft_confidence.clear();
    return;
  }
  const std::vector<int64_t> take = rollout::plan_drafts(iteration_cost, base_tokens, decodes,
                                                         chances, budget, opt.speculative.adaptive);
  // A drafter that did not pay rests, twice as long after each probe that did not pay either (a
  // probe of a model drafter catches up on every skipped position: costly at a large batch).
  if (opt.speculative.adaptive) {
    if (rollout::drafting_pays(iteration_cost, base_tokens, decodes, chances, take,
                               draft_seconds)) {
      spec_cooldown_next = 0;  // the next failure rests kSpecCooldown
    } else {
      spec_cooldown_next = std::clamp<int64_t>(2 * spec_cooldown_next, rollout::kSpecCooldown,
                                               rollout::kSpecCooldownMax);
      spec_cooldown = spec_cooldown_next;
    }
  }
  bool any = false;
  for (size_t c = 0; c < candidates.size(); ++c) {
    Item& it = items[candidates[c]];
    Sample& s = *it.sample;
    int64_t k = take[c];
    // Only free blocks: speculation never evicts the prefix cache.
    while (k > 0 && kv->blocks_needed(s.slot, s.computed + 1 + k) > pool->free_blocks()) --k;
    if (k > 0) MILES_CHECK(kv->reserve(s.slot, s.computed + 1 + k).ok());
    s.draft.resize(static_cast<size_t>(k));
    s.draft_confidence.resize(static_cast<size_t>(k));
    it.draft = k;
    it.n += k;
    any = any || k > 0;
  }
  if (any) ++spec_since_plain;
}

int64_t Engine::Impl::verify(const Item& it, const float* rows, int64_t vocab) {
  Sample& s = *it.sample;
  MILES_CHECK(it.start == s.computed && it.draft == static_cast<int64_t>(s.draft.size()),
              "a verify item feeds the sample's newest token and its drafts");
  const size_t before = s.output.size();
  int64_t committed = 0, accepted = 0;
  double predicted = 0;
  for (int64_t j = 0; j <= it.draft; ++j) {
    sample_next(s, rows + j * vocab);
    if (s.output.size() == before + static_cast<size_t>(committed)) break;  // finished, no token
    ++committed;
    if (j == it.draft) break;  // every draft accepted: that was the sample's own next token
    predicted += s.draft_confidence[static_cast<size_t>(j)];
    const bool same = s.output.back().id == s.draft[static_cast<size_t>(j)];
    accepted += same ? 1 : 0;
    if (!same || s.state == SampleState::kFinished) break;
  }
  presampled.erase(&s);  // the draws of rows past a rejection
  // Positions start .. start + committed - 1 hold the newest token and the accepted drafts; the
  // last committed token is fed next iteration, as in plain decoding.
  s.computed = it.start + committed;
  if (s.state != SampleState::kFinished) kv->truncate(s.slot, s.computed + 1);
  s.spec_predicted += predicted;
  s.spec_accepted += static_cast<double>(accepted);
  spec_predicted += predicted;
  spec_accepted += static_cast<double>(accepted);
  ++counters.spec_verifies;
  counters.spec_draft_tokens += static_cast<uint64_t>(it.draft);
  counters.spec_accepted_tokens += static_cast<uint64_t>(accepted);
  counters.spec_emitted_tokens += static_cast<uint64_t>(committed);
  s.draft.clear();
  s.draft_confidence.clear();
  return committed;
}

}  // namespace miles
