#include "rollout/spec_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace miles::rollout {

namespace {

constexpr double kAlpha = 0.25;  // weight of a new observation

size_t bucket_of(int64_t tokens) {
  const double n = static_cast<double>(std::max<int64_t>(tokens, 1));
  return static_cast<size_t>(std::lround(4.0 * std::log2(n)));
}

}  // namespace

void ForwardCostModel::observe(int64_t tokens, double seconds) {
  if (tokens < 1 || !(seconds >= 0)) return;
  const size_t b = bucket_of(tokens);
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  Bucket& k = buckets_[b];
  if (!k.seen) {
    k = {static_cast<double>(tokens), seconds, true};
    return;
  }
  k.tokens += kAlpha * (static_cast<double>(tokens) - k.tokens);
  k.seconds += kAlpha * (seconds - k.seconds);
}

bool ForwardCostModel::measured(int64_t tokens) const {
  const size_t b = bucket_of(tokens);
  return b < buckets_.size() && buckets_[b].seen;
}

std::optional<double> ForwardCostModel::estimate(int64_t tokens) const {
  const double x = static_cast<double>(tokens);
  const Bucket* below = nullptr;
  const Bucket* above = nullptr;
  for (const Bucket& k : buckets_) {
    if (!k.seen) continue;
    if (k.tokens <= x && (!below || k.tokens > below->tokens)) below = &k;
    if (k.tokens > x && (!above || k.tokens < above->tokens)) above = &k;
  }
  if (!below && !above) return std::nullopt;
  if (!below) return above->seconds;
  if (!above) return below->seconds;
  const double f = (x - below->tokens) / (above->tokens - below->tokens);
  return below->seconds + f * (above->seconds - below->seconds);
}

std::vector<int64_t> plan_drafts(const ForwardCostModel& cost, int64_t base_tokens, int64_t decodes,
                                 const std::vector<std::vector<float>>& accept, int64_t budget,
                                 bool adaptive) {
  // Every draft token as (chance, candidate, index), best first; a candidate's own tokens keep
  // their order (their chances do not increase), so any prefix of this list is a prefix of each.
  struct Tok {
    float p;
    size_t c;
    size_t j;
  };
  std::vector<Tok> all;
  for (size_t c = 0; c < accept.size(); ++c)
    for (size_t j = 0; j < accept[c].size(); ++j) all.push_back({accept[c][j], c, j});
  std::stable_sort(all.begin(), all.end(),
                   [](const Tok& a, const Tok& b) { return a.p != b.p ? a.p > b.p : a.j < b.j; });
  size_t take = std::min<size_t>(all.size(), static_cast<size_t>(std::max<int64_t>(budget, 0)));
  const std::optional<double> t0 = cost.estimate(base_tokens);
  if (adaptive && t0 && *t0 > 0) {
    // The prefix maximising expected emitted tokens per second.
    const double rate0 = static_cast<double>(decodes) / *t0;
    double best = rate0, expected = static_cast<double>(decodes);
    size_t best_d = 0;
    for (size_t d = 1; d <= take; ++d) {
      expected += all[d - 1].p;
      const double t = *cost.estimate(base_tokens + static_cast<int64_t>(d));
      const double rate = t > 0 ? expected / t : 0;
      if (rate > best) {
        best = rate;
        best_d = d;
      }
    }
    take = best > rate0 * (1 + kSpecMargin) ? best_d : 0;
  }
  std::vector<int64_t> out(accept.size(), 0);
  for (size_t d = 0; d < take; ++d) out[all[d].c] = std::max<int64_t>(out[all[d].c], all[d].j + 1);
  return out;
}

bool drafting_pays(const ForwardCostModel& cost, int64_t base_tokens, int64_t decodes,
                   const std::vector<std::vector<float>>& accept, const std::vector<int64_t>& take,
                   double draft_seconds) {
  const std::optional<double> t0 = cost.estimate(base_tokens);
  if (!t0 || *t0 <= 0) return true;  // nothing to weigh it against yet
  double expected = static_cast<double>(decodes);
  int64_t drafts = 0;
  for (size_t c = 0; c < take.size() && c < accept.size(); ++c)
    for (int64_t j = 0; j < take[c] && j < static_cast<int64_t>(accept[c].size()); ++j) {
      expected += accept[c][static_cast<size_t>(j)];
      ++drafts;
    }
  if (drafts == 0) return draft_seconds < kDraftShare * *t0;
  const double t = *cost.estimate(base_tokens + drafts) + draft_seconds;
  return expected / t > static_cast<double>(decodes) / *t0;
}

}  // namespace miles::rollout
