// The co-trained draft head as a drafter (make_head_drafter, include/miles/rollout/drafter.h).
//
// Per sample: draft rows in the head's own KV for positions base .. base + rows − 1 (row j read the
// target's f_j and the id at j + 1), and the target's hidden states of the next positions, not yet
// turned into rows. propose_all() first turns them into rows (one forward over every sample's
// pending rows), which drafts each sample's next token, then drafts further one row per sample
// per forward from the head's own output g (which stands in for the target's f). The rows past
// the fixed positions are written at draft positions the next catch-up overwrites.
//
// A prompt's target states are kept (by its ids, until the head changes): a sample whose prefill
// the prefix cache shortened gets the states of the cached positions from an earlier sample of the
// same prompt, so its head reads the whole context, as it was trained. Same ids, same weights:
// the same states, bit for bit.
#include <algorithm>
#include <array>
#include <cmath>
#include <list>
#include <map>
#include <unordered_map>

#include "miles/draft_head.h"
#include "miles/rollout/drafter.h"

namespace miles {

std::vector<Draft> Drafter::propose_all(std::span<const DraftQuery> queries) {
  std::vector<Draft> out;
  out.reserve(queries.size());
  for (const DraftQuery& q : queries) out.push_back(propose(q));
  return out;
}

namespace {

struct SampleState {
  int32_t slot = 0;         // in the head's KV
  int64_t base = 0;         // target position of draft row 0
  int64_t rows = 0;         // draft rows in the KV from fixed positions
  std::vector<float> pend;  // target states of positions base + rows .., [n, feature width]
  // The first draft of the sample's last sampled query every way (kWays), scored against the token
  // that lands at position check_at (−1: nothing to score).
  int64_t check_at = -1;
  std::array<int32_t, 3> first_ids{-1, -1, -1};
};

// The ways a sampled query's draft is taken from the head's row: its argmax (0), or its coupled
// draw with the query's temperature times 1 or 0.5 (a sharpened head: a rough head's coupled draws
// match more often sharpened, a head close to the policy's unsharpened).
constexpr std::array<double, 3> kWays{0.0, 1.0, 0.5};

// Prompts' target states (positions 0 .. ids.size() − 1), least recently used first out.
class PromptStates {
 public:
  static constexpr size_t kMaxBytes = size_t{64} << 20;

  void put(std::span<const int32_t> ids, std::span<const float> states) {
    if (find(ids)) return;
    const size_t bytes = states.size_bytes() + ids.size_bytes();
    if (bytes > kMaxBytes) return;
    while (bytes_ + bytes > kMaxBytes) drop_oldest();
    lru_.push_front({{ids.begin(), ids.end()}, {states.begin(), states.end()}});
    index_.emplace(hash(ids), lru_.begin());
    bytes_ += bytes;
  }
  // The states of exactly `ids`, or null.
  const std::vector<float>* find(std::span<const int32_t> ids) {
    auto [b, e] = index_.equal_range(hash(ids));
    for (auto it = b; it != e; ++it)
      if (std::ranges::equal(it->second->ids, ids)) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return &it->second->states;
      }
    return nullptr;
  }
  void clear() {
    lru_.clear();
    index_.clear();
    bytes_ = 0;
  }

 private:
  struct Entry {
    std::vector<int32_t> ids;
    std::vector<float> states;
  };
  static uint64_t hash(std::span<const int32_t> ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t id : ids) h = (h ^ static_cast<uint32_t>(id)) * 0x100000001b3ull;
    return h;
  }
  void drop_oldest() {
    const Entry& e = lru_.back();
    auto [b, en] = index_.equal_range(hash(e.ids));
    for (auto it = b; it != en; ++it)
      if (&*it->second == &e) {
        index_.erase(it);
        break;
      }
    bytes_ -= e.states.size() * sizeof(float) + e.ids.size() * sizeof(int32_t);
    lru_.pop_back();
  }

  std::list<Entry> lru_;
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

class HeadDrafterImpl final : public HeadDrafter {
 public:
  HeadDrafterImpl(std::shared_ptr<const DraftHead> head, ThreadPool* pool,
                  const HeadDrafterOptions& o)
      : pool_(pool), opt_(o) {
    set_head(std::move(head));
  }

  void set_head(std::shared_ptr<const DraftHead> head) override {
    head_ = std::move(head);
    states_.clear();  // rows of the old head: every sample starts again from its next states
    prompts_.clear();  // a new head comes with new weights: new target states
    kv_ = head_ ? head_->make_kv_cache() : nullptr;
    by_id_.clear();
    if (head_) {
      const std::vector<int32_t>& ids = head_->vocab();
      by_id_.resize(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) by_id_[i] = static_cast<int32_t>(i);
      std::ranges::sort(by_id_, [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
    }
  }

  bool wants_hidden() const override { return head_ != nullptr; }
  std::vector<int64_t> hidden_layers() const override {
    return head_ ? head_->feature_layers() : std::vector<int64_t>{};
  }
  HeadDrafterStats stats() const override { return stats_; }

  void hidden(uint64_t sample, int64_t first, std::span<const float> rows) override {
    if (!head_) return;
    const int64_t d = head_->feature_width();
    auto [it, fresh] = states_.try_emplace(sample);
    SampleState& st = it->second;
    if (fresh) {
      st.slot = next_slot_++;
      st.base = first;
    }
    const int64_t fixed = st.base + st.rows;
    const int64_t known = fixed + static_cast<int64_t>(st.pend.size()) / d;
    if (first < st.base || first > known) {  // before the rows, or a gap: start again here
      st.base = first;
      st.rows = 0;
      st.pend.clear();
    } else if (first < fixed) {  // rows from `first` on are replaced
      st.rows = first - st.base;
      st.pend.clear();
    } else {
      st.pend.resize(static_cast<size_t>((first - fixed) * d));
    }
    st.pend.insert(st.pend.end(), rows.begin(), rows.end());
  }

  // The sibling gets the leader's unconsumed states (after a prefill: the whole prompt's); rows
  // already in the leader's KV are not copied, so the sibling's rows start after them.
  void fork(uint64_t from, uint64_t to) override {
    if (!head_) return;
    auto it = states_.find(from);
    if (it == states_.end() || from == to) return;
    forget(to);
    SampleState st;
    st.slot = next_slot_++;
    st.base = it->second.base + it->second.rows;
    st.pend = it->second.pend;
    states_.emplace(to, std::move(st));
  }

  void forget(uint64_t sample) override {
    auto it = states_.find(sample);
    if (it == states_.end()) return;
    if (kv_) kv_->release(it->second.slot);
    states_.erase(it);
  }

  Draft propose(const DraftQuery& q) override { return propose_all({&q, 1})[0]; }

  std::vector<Draft> propose_all(std::span<const DraftQuery> queries) override {
    std::vector<Draft> out(queries.size());
    if (!head_) return out;
    std::vector<Active> active = catch_up(queries, out);
    for (int64_t depth = 1; !active.empty(); ++depth) active = extend(queries, out, active, depth);
    return out;
  }

 private:
  struct Active {
    size_t query;
    SampleState* st;
    std::vector<float> g;  // the head's output at the last row
    double product = 1;
  };

  // Turns each sample's pending target states into rows (the newest fixed position's row drafts
  // the sample's next token). A sample without the states of every fixed position but its newest
  // drafts nothing this time.
  std::vector<Active> catch_up(std::span<const DraftQuery> queries, std::vector<Draft>& out) {
    const int64_t d = head_->feature_width();
    std::vector<float> feats;
    std::vector<int32_t> next;
    std::vector<SeqSpan> seqs;
    std::vector<Active> active;
    for (size_t i = 0; i < queries.size(); ++i) {
      const DraftQuery& q = queries[i];
      auto it = states_.find(q.sample);
      if (q.max_tokens <= 0 || it == states_.end()) continue;
      SampleState& st = it->second;
      score(q, st);
      const int64_t newest = static_cast<int64_t>(q.tokens.size()) - 1;  // not yet in the KV
      share_prompt(q, st);
      const int64_t fixed = st.base + st.rows;
      const int64_t n = static_cast<int64_t>(st.pend.size()) / d;
      if (n == 0 || fixed + n != newest) continue;  // the states do not reach the newest position
      feats.insert(feats.end(), st.pend.begin(), st.pend.end());
      for (int64_t j = fixed; j < newest; ++j) next.push_back(q.tokens[static_cast<size_t>(j + 1)]);
      seqs.push_back({st.slot, st.rows, n});
      st.rows += n;
      st.pend.clear();
      active.push_back({i, &st, {}, 1});
    }
    if (active.empty()) return active;
    return take(queries, out, active, feats, next, seqs, false);
  }

  // Before a sample's first rows: from position 0 its prompt's states are kept for later samples;
  // from a later position (the prefix cache held the rest) they are taken from an earlier one.
  void share_prompt(const DraftQuery& q, SampleState& st) {
    const int64_t d = head_->feature_width();
    const int64_t end = q.prompt_len;
    if (st.rows != 0 || end <= 0 || end >= static_cast<int64_t>(q.tokens.size()) ||
        st.base >= end || static_cast<int64_t>(st.pend.size()) / d < end - st.base)
      return;
    const std::span<const int32_t> ids(q.tokens.data(), static_cast<size_t>(end));
    if (st.base == 0) {
      prompts_.put(ids, std::span<const float>(st.pend.data(), static_cast<size_t>(end * d)));
    } else if (const std::vector<float>* known = prompts_.find(ids)) {
      st.pend.insert(st.pend.begin(), known->begin(), known->begin() + st.base * d);
      st.base = 0;
    }
  }

  // One more draft row for each sample still drafting: the head's own g and its last draft.
  std::vector<Active> extend(std::span<const DraftQuery> queries, std::vector<Draft>& out,
                             std::vector<Active>& active, int64_t depth) {
    std::vector<float> feats;
    std::vector<int32_t> next;
    std::vector<SeqSpan> seqs;
    for (Active& a : active) {
      feats.insert(feats.end(), a.g.begin(), a.g.end());
      next.push_back(out[a.query].tokens.back());
      seqs.push_back({a.st->slot, a.st->rows + depth - 1, 1});
    }
    return take(queries, out, active, feats, next, seqs, true);
  }

  // Runs the rows (features: the target's, or with `own` the head's g) and appends each sample's
  // draft (choose()); keeps those that draft on.
  std::vector<Active> take(std::span<const DraftQuery> queries, std::vector<Draft>& out,
                           std::vector<Active>& active, const std::vector<float>& feats,
                           const std::vector<int32_t>& next, const std::vector<SeqSpan>& seqs,
                           bool own) {
    const int64_t d = head_->policy_config().hidden_size;
    const int64_t dv = static_cast<int64_t>(head_->vocab().size());
    auto step = head_->forward(feats, next, seqs, *kv_, pool_, own);
    std::vector<Active> more;
    if (!step.ok()) return more;  // a draft only decides speed: none this time
    for (size_t a = 0; a < active.size(); ++a) {
      Active& ac = active[a];
      Draft& dr = out[ac.query];
      const DraftQuery& q = queries[ac.query];
      const std::span<const float> row(step->logits.data() + a * dv, static_cast<size_t>(dv));
      const auto [index, p] = choose(row, q, *ac.st, static_cast<int64_t>(dr.tokens.size()));
      if (index < 0) continue;  // a row the sampler cannot take: no draft from here
      ac.product *= p;
      dr.tokens.push_back(head_->vocab()[static_cast<size_t>(index)]);
      dr.confidence.push_back(p);
      if (ac.product < opt_.min_confidence ||
          static_cast<int64_t>(dr.tokens.size()) >= q.max_tokens)
        continue;
      ac.g.assign(step->hidden.begin() + a * d, step->hidden.begin() + (a + 1) * d);
      more.push_back(std::move(ac));
    }
    return more;
  }

  // Draft j of a query from the head's logits row (over its vocabulary): the index and the head's
  // probability of it (-1: none). Greedy: the argmax. Sampled: the way (kWays) whose first drafts
  // have matched the landed tokens most often lately; at j = 0 every way is drafted, to be scored
  // when the token lands (score()).
  std::pair<int64_t, float> choose(std::span<const float> row, const DraftQuery& q, SampleState& st,
                                   int64_t j) {
    const int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
    if (q.sampling.greedy()) return {best, tempered_probability(row, 1.0, best)};
    const size_t way = static_cast<size_t>(std::max_element(hits_.begin(), hits_.end()) -
                                           hits_.begin());  // ties: the argmax
    std::pair<int64_t, float> pick{-1, 0.0f};
    for (size_t w = 0; w < kWays.size(); ++w) {
      if (j > 0 && w != way) continue;
      const std::pair<int64_t, float> drawn =
          w == 0 ? std::pair{best, tempered_probability(row, q.sampling.temperature, best)}
                 : coupled(row, q, j, kWays[w]);
      if (j == 0) st.first_ids[w] = drawn.first < 0 ? -1 : head_->vocab()[drawn.first];
      if (w == way) pick = drawn;
    }
    if (j == 0) st.check_at = static_cast<int64_t>(q.tokens.size());
    return pick;
  }

  // The coupled draw (coupled drafting, DraftQuery::step): the sampler's own draw with the
  // query's params (its temperature times `sharpen`) and the uniform number the target will draw
  // position j with, over the head's logits in the order of their ids — the draw the sampler would
  // make over the policy's vocabulary with −inf outside the head's ids (those have no mass and
  // pass no filter; up to the rounding of its sums), since it walks ids in their order and breaks
  // ties by id. Where the head's distribution is close to the policy's, the two draws land on the
  // same token far more often than the policy's probability of the head's argmax.
  std::pair<int64_t, float> coupled(std::span<const float> row, const DraftQuery& q, int64_t j,
                                    double sharpen) {
    if (!std::ranges::all_of(row, [](float z) { return std::isfinite(z); })) return {-1, 0.0f};
    SamplingParams sp = q.sampling;
    sp.temperature = static_cast<float>(sp.temperature * sharpen);
    if (sp.greedy()) return {-1, 0.0f};
    ordered_.resize(by_id_.size());
    for (size_t k = 0; k < by_id_.size(); ++k) ordered_[k] = row[static_cast<size_t>(by_id_[k])];
    const SampleResult r = sample_token(ordered_, sp, static_cast<uint64_t>(q.step + j));
    return {by_id_[static_cast<size_t>(r.token)], std::exp(r.logprob)};
  }

  // The head's probability of `index` at temperature t (no filters).
  static float tempered_probability(std::span<const float> row, double t, int64_t index) {
    double sum = 0;
    for (const float z : row) sum += std::exp((static_cast<double>(z) - row[index]) / t);
    return static_cast<float>(1.0 / sum);
  }

  // The sample's last first drafts against the token that landed at their position.
  void score(const DraftQuery& q, SampleState& st) {
    if (st.check_at < 0 || st.check_at >= static_cast<int64_t>(q.tokens.size())) return;
    const int32_t landed = q.tokens[static_cast<size_t>(st.check_at)];
    ++stats_.scored;
    for (size_t w = 0; w < kWays.size(); ++w) {
      const bool hit = landed == st.first_ids[w];
      hits_[w] = hits_[w] * kHitDecay + (hit ? 1 : 0);
      stats_.hits[w] += hit ? 1 : 0;
    }
    st.check_at = -1;
  }

  // Weight of a scored first draft after another one is scored (the scores follow about the last
  // few hundred: the head changes with every weight version).
  static constexpr double kHitDecay = 1.0 - 1.0 / 256;
  std::array<double, kWays.size()> hits_{};  // decayed matches of each way's first drafts
  HeadDrafterStats stats_;

  std::shared_ptr<const DraftHead> head_;
  ThreadPool* pool_;
  HeadDrafterOptions opt_;
  std::unique_ptr<SimpleKvCache> kv_;
  std::vector<int32_t> by_id_;  // indices into the head's vocabulary, their ids ascending
  std::vector<float> ordered_;  // coupled()'s row in that order
  std::unordered_map<uint64_t, SampleState> states_;
  PromptStates prompts_;
  int32_t next_slot_ = 0;
};

}  // namespace

std::unique_ptr<HeadDrafter> make_head_drafter(std::shared_ptr<const DraftHead> head,
                                               ThreadPool* pool, const HeadDrafterOptions& o) {
  return std::make_unique<HeadDrafterImpl>(std::move(head), pool, o);
}

}  // namespace miles
