// The model-free suffix drafter (include/miles/rollout/drafter.h): the query's last ids are looked
// up in the sample's own tokens, its siblings' and the responses kept for its prompt; the
// continuations found vote.
//
// Why a scan and not a suffix tree: the sources change every step (siblings grow by a token) and
// are short next to a forward's cost (a GRPO group of 8 × 1000 ids is 8000 compares, microseconds;
// a forward is milliseconds), so a linear scan per query costs less than keeping trees current.
#include <algorithm>
#include <list>
#include <map>
#include <unordered_map>

#include "miles/rollout/drafter.h"

namespace miles {

uint64_t prompt_key(std::span<const int32_t> prompt) {
  uint64_t h = 1469598103934665603ull;
  for (const int32_t id : prompt) {
    uint32_t v = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b, v >>= 8) {
      h ^= v & 0xFFu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

namespace {

// A sequence seen as its prompt followed by its output (kept responses store only the output).
struct Source {
  std::span<const int32_t> head, tail;
  int64_t size() const { return static_cast<int64_t>(head.size() + tail.size()); }
  int32_t at(int64_t i) const {
    const int64_t h = static_cast<int64_t>(head.size());
    return i < h ? head[i] : tail[i - h];
  }
};

struct Match {
  const Source* source;
  int64_t next;    // index of the first continuation id
  int64_t length;  // ids matched, ending at next - 1
};

class SuffixDrafter final : public Drafter {
 public:
  explicit SuffixDrafter(const SuffixDrafterOptions& o) : o_(o) {}

  Draft propose(const DraftQuery& q) override {
    Draft d;
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (q.max_tokens <= 0 || n < o_.min_match) return d;
    std::vector<Source> sources;
    sources.push_back({q.tokens, {}});
    for (const auto& s : q.siblings) sources.push_back({s, {}});
    const std::span<const int32_t> prompt = q.tokens.first(static_cast<size_t>(q.prompt_len));
    if (auto it = history_.find(q.prompt_key);
        it != history_.end() && std::ranges::equal(it->second.prompt, prompt))
      for (const auto& out : it->second.outputs) sources.push_back({prompt, out});
    const std::vector<Match> found = matches(q, sources);
    vote(found, q.max_tokens, d);
    return d;
  }

  void observe(std::span<const int32_t> prompt, std::span<const int32_t> output) override {
    if (output.empty() || o_.history_prompts <= 0 || o_.history_per_prompt <= 0) return;
    const uint64_t key = prompt_key(prompt);
    auto it = history_.find(key);
    if (it != history_.end() && !std::ranges::equal(it->second.prompt, prompt)) {
      forget(it);  // a hash collision: the newer prompt wins
      it = history_.end();
    }
    if (it == history_.end()) {
      it = history_.emplace(key, Kept{{prompt.begin(), prompt.end()}, {}, {}}).first;
      lru_.push_front(key);
      kept_tokens_ += static_cast<int64_t>(prompt.size());
    } else {
      lru_.erase(it->second.lru);
      lru_.push_front(key);
    }
    Kept& k = it->second;
    k.lru = lru_.begin();
    k.outputs.emplace_back(output.begin(), output.end());
    kept_tokens_ += static_cast<int64_t>(output.size());
    while (static_cast<int64_t>(k.outputs.size()) > o_.history_per_prompt) {
      kept_tokens_ -= static_cast<int64_t>(k.outputs.front().size());
      k.outputs.erase(k.outputs.begin());
    }
    while (!lru_.empty() && (static_cast<int64_t>(history_.size()) > o_.history_prompts ||
                             kept_tokens_ > o_.history_max_tokens))
      forget(history_.find(lru_.back()));
  }

 private:
  struct Kept {
    std::vector<int32_t> prompt;
    std::vector<std::vector<int32_t>> outputs;
    std::list<uint64_t>::iterator lru;
  };

  void forget(std::unordered_map<uint64_t, Kept>::iterator it) {
    kept_tokens_ -= static_cast<int64_t>(it->second.prompt.size());
    for (const auto& o : it->second.outputs) kept_tokens_ -= static_cast<int64_t>(o.size());
    lru_.erase(it->second.lru);
    history_.erase(it);
  }

  // Every place where the query's last ids recur with at least one id after them. The query's own
  // tokens are searched whole (a prompt or an answer repeating itself); the others only from the
  // end of the prompt on (their prompt is the query's, already searched).
  std::vector<Match> matches(const DraftQuery& q, const std::vector<Source>& sources) const {
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    const int32_t last = q.tokens[static_cast<size_t>(n - 1)];
    std::vector<Match> found;
    for (size_t si = 0; si < sources.size(); ++si) {
      const Source& s = sources[si];
      const int64_t end = si == 0 ? n - 1 : s.size() - 1;
      const int64_t from = si == 0 ? 0 : std::max<int64_t>(0, q.prompt_len - 1);
      for (int64_t i = from; i < end; ++i) {
        if (s.at(i) != last) continue;
        int64_t m = 1;
        while (m < o_.max_match && i - m >= 0 && n - 1 - m >= 0 &&
               s.at(i - m) == q.tokens[static_cast<size_t>(n - 1 - m)])
          ++m;
        if (m >= o_.min_match) found.push_back({&s, i + 1, m});
      }
    }
    return found;
  }

  // The continuation most of the longest matches agree on, id by id: each match votes with its
  // length; the confidence of an id is its share of the votes times n / (n + 1) for n matches
  // voting (a lone vote is a guess, many agreeing ones are not).
  void vote(std::vector<Match> found, int64_t max_tokens, Draft& d) const {
    int64_t longest = 0;
    for (const Match& m : found) longest = std::max(longest, m.length);
    std::erase_if(found, [&](const Match& m) { return m.length < longest - 1; });
    float running = 1.0f;
    for (int64_t depth = 0; depth < max_tokens && !found.empty(); ++depth) {
      std::map<int32_t, double> votes;
      double total = 0, voters = 0;
      for (const Match& m : found) {
        if (m.next + depth >= m.source->size()) continue;
        votes[m.source->at(m.next + depth)] += static_cast<double>(m.length);
        total += static_cast<double>(m.length);
        ++voters;
      }
      if (votes.empty()) break;
      auto best = votes.begin();
      for (auto it = votes.begin(); it != votes.end(); ++it)
        if (it->second > best->second) best = it;
      const float confidence = static_cast<float>(best->second / total * voters / (voters + 1));
      running *= confidence;
      if (running < o_.min_confidence) break;
      d.tokens.push_back(best->first);
      d.confidence.push_back(confidence);
      const int32_t id = best->first;
      std::erase_if(found, [&](const Match& m) {
        return m.next + depth >= m.source->size() || m.source->at(m.next + depth) != id;
      });
    }
  }

  SuffixDrafterOptions o_;
  std::unordered_map<uint64_t, Kept> history_;
  std::list<uint64_t> lru_;  // most recently observed prompt first
  int64_t kept_tokens_ = 0;
};

}  // namespace

std::unique_ptr<Drafter> make_suffix_drafter(const SuffixDrafterOptions& options) {
  return std::make_unique<SuffixDrafter>(options);
}

}  // namespace miles
