// Packing samples for the model, the halving-tree sum over micro-batches, the loss head, reused
// micro-batch buffers and the SFT objective (trainer_internal.h, trainer.h).
#include <algorithm>

#include "miles/grad_sink.h"
#include "miles/logprob.h"
#include "miles/thread_pool.h"
#include "trainer/draft_trainer.h"
#include "trainer/trainer_internal.h"

namespace miles {

namespace trainer_detail {

Packed pack(std::span<const TrainSample> batch, int64_t first, int64_t count, bool replay) {
  Packed p;
  p.offsets.push_back(0);
  for (int64_t s = first; s < first + count; ++s) {
    const TrainSample& x = batch[s];
    const int64_t t = x.tokens.size(), r = x.response_length, base = p.tokens.size();
    p.seqs.push_back({static_cast<int32_t>(s - first), 0, t - 1});
    p.tokens.insert(p.tokens.end(), x.tokens.begin(), x.tokens.end() - 1);
    if (replay) p.forced.insert(p.forced.end(), x.routed_experts.begin(), x.routed_experts.end());
    for (int64_t j = t - r; j < t; ++j) {
      p.rows.push_back(base + j - 1);
      p.targets.push_back(x.tokens[j]);
    }
    p.samples.push_back(s);
    p.offsets.push_back(p.rows.size());
  }
  return p;
}

namespace {

// merges[i - lo]: how many merges follow leaf i at once in the post-order walk of the halving tree
// over [lo, hi) (split at lo + ceil((hi - lo) / 2)).
void tree_merges(int64_t lo, int64_t hi, std::vector<int>& merges) {
  if (hi - lo == 1) {
    merges.push_back(0);
    return;
  }
  const int64_t mid = lo + (hi - lo + 1) / 2;  // kernels.h's split
  tree_merges(lo, mid, merges);
  tree_merges(mid, hi, merges);
  ++merges.back();  // this subtree's merge follows its last leaf
}

// lefts.back() = lefts[m-1] + (… + (lefts[0] + r)): the scalars always, the buffers unless the
// leaf's backward folded them already.
void merge_leaf(std::span<Trainer::MicroResult* const> lefts, Trainer::MicroResult& r,
                ThreadPool* pool) {
  if (!r.folded) {
    std::vector<FlatTensors*> grads;
    std::vector<std::span<float>> tied;
    fold_targets(lefts, grads, tied);
    std::vector<std::span<float>> g;
    for (FlatTensors* f : grads) g.push_back(f->all());
    GradSink::fold_buffer(std::as_const(r.grads).all(), g, pool);
    if (!r.tied_head.empty()) GradSink::fold_buffer(r.tied_head, tied, pool);
  }
  if (!r.draft.all().empty()) {  // the draft's gradients are never folded by a backward
    std::vector<std::span<float>> d;
    for (Trainer::MicroResult* l : lefts) d.push_back(l->draft.all());
    GradSink::fold_buffer(std::as_const(r.draft).all(), d, pool);
  }
  double loss = r.loss;
  int64_t tokens = r.tokens;
  std::map<std::string, double> sums = std::move(r.sums);
  for (Trainer::MicroResult* l : lefts) {
    loss = l->loss + loss;
    tokens = l->tokens + tokens;
    std::map<std::string, double> merged = l->sums;
    for (const auto& [k, v] : sums) merged[k] += v;
    sums = std::move(merged);
  }
  Trainer::MicroResult& dest = *lefts.back();
  dest.loss = loss;
  dest.tokens = tokens;
  dest.sums = std::move(sums);
}

}  // namespace

void fold_targets(std::span<Trainer::MicroResult* const> lefts, std::vector<FlatTensors*>& grads,
                  std::vector<std::span<float>>& tied) {
  grads.clear();
  tied.clear();
  for (Trainer::MicroResult* l : lefts) {
    grads.push_back(&l->grads);
    if (!l->tied_head.empty()) tied.push_back(l->tied_head);
  }
}

Result<Trainer::MicroResult> tree_sum(int64_t lo, int64_t hi, const Leaf& leaf, ThreadPool* pool,
                                      const Recycle& recycle) {
  std::vector<int> merges;
  tree_merges(lo, hi, merges);
  std::vector<Trainer::MicroResult> stack;  // pending partial sums, oldest first
  stack.reserve(merges.size());             // no reallocation: leaves hold pointers into it
  for (int64_t i = lo; i < hi; ++i) {
    const int m = merges[i - lo];
    std::vector<Trainer::MicroResult*> lefts;
    for (int j = 0; j < m; ++j) lefts.push_back(&stack[stack.size() - 1 - j]);
    MILES_ASSIGN_OR_RETURN(Trainer::MicroResult r, leaf(i, lefts));
    if (m == 0) {
      r.folded = false;
      stack.push_back(std::move(r));
      continue;
    }
    merge_leaf(lefts, r, pool);
    r.folded = false;
    if (recycle) recycle(std::move(r));
    for (int j = 0; j + 1 < m; ++j) {  // merged into the outermost left: their buffers are free
      if (recycle) recycle(std::move(stack.back()));
      stack.pop_back();
    }
  }
  MILES_CHECK(stack.size() == 1, "the micro-batch tree left more than one sum");
  return std::move(stack.back());
}

namespace {

// Runs fn(first row, count) over the maximal runs of consecutive logits rows, runs split into
// pieces of kHeadRows across the pool. The row kernels are row-independent, so any split gives the
// same bits.
constexpr int64_t kHeadRows = 8;
void for_row_runs(const Packed& p, ThreadPool* pool,
                  const std::function<void(int64_t, int64_t)>& fn) {
  std::vector<std::pair<int64_t, int64_t>> pieces;  // (index into rows, count)
  const int64_t n = p.rows.size();
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && j - i < kHeadRows && p.rows[j] == p.rows[j - 1] + 1) ++j;
    pieces.emplace_back(i, j - i);
    i = j;
  }
  parallel_for(pool, pieces.size(), [&](int64_t k) { fn(pieces[k].first, pieces[k].second); });
}

}  // namespace

Result<HeadResult> loss_head(const Packed& p, std::vector<float>&& logits, int64_t v,
                             bool need_entropy, const TokenObjective& objective,
                             const TensorParallel* tp, ThreadPool* pool) {
  const int64_t n = p.rows.size();
  const int64_t rows = static_cast<int64_t>(logits.size()) / v;
  if (rows != n && rows != static_cast<int64_t>(p.tokens.size()))
    return Status::Error("loss head: " + std::to_string(rows) + " logits rows for " +
                         std::to_string(n) + " response rows of " +
                         std::to_string(p.tokens.size()) + " tokens");
  // Where response row i's logits are: row i of the response rows' logits, else its token's row
  // (the same when every row is a response row).
  const bool compact = rows == n;
  auto at = [&](int64_t i) { return compact ? i : p.rows[i]; };
  std::vector<float> sel;  // the response rows' logits, gathered for the vocabulary-parallel path
  if (tp && !compact) {
    sel.resize(static_cast<size_t>(n * v));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(logits.data() + p.rows[i] * v, v, sel.data() + i * v);
  }
  const float* response_logits = tp && !compact ? sel.data() : logits.data();
  std::vector<float> logp(n), entropy(need_entropy ? n : 0);
  // Each row's log-softmax normaliser, kept from the forward for the backward.
  std::vector<kernels::LogSoftmaxStats> stats(tp ? 0 : n);
  if (tp) {
    MILES_RETURN_IF_ERROR(token_logprobs_vocab_parallel(response_logits, n, v, tp->vocab_begin,
                                                        p.targets.data(), *tp->comm, logp.data(),
                                                        need_entropy ? entropy.data() : nullptr));
  } else {
    for_row_runs(p, pool, [&](int64_t i, int64_t count) {
      token_logprobs(logits.data() + at(i) * v, count, v, p.targets.data() + i, logp.data() + i,
                     need_entropy ? entropy.data() + i : nullptr, stats.data() + i);
    });
  }
  HeadResult h;
  MILES_ASSIGN_OR_RETURN(h.loss, objective(TokenView{p.samples, p.offsets, logp, entropy}));
  if (static_cast<int64_t>(h.loss.dlogp.size()) != n ||
      (!h.loss.dentropy.empty() && static_cast<int64_t>(h.loss.dentropy.size()) != n))
    return Status::Error("objective returned gradients for the wrong number of tokens");
  if (!h.loss.dentropy.empty() && !need_entropy)
    return Status::Error("objective uses entropy but trainer.need_entropy is off");
  const float* dent = h.loss.dentropy.empty() ? nullptr : h.loss.dentropy.data();
  h.dlogits = std::move(logits);
  float* d = h.dlogits.data();
  if (tp) {
    std::vector<float> dsel(static_cast<size_t>(n * v));
    MILES_RETURN_IF_ERROR(token_logprobs_backward_vocab_parallel(
        compact ? d : sel.data(), n, v, tp->vocab_begin, p.targets.data(), *tp->comm,
        h.loss.dlogp.data(), dent, dsel.data()));
    for (int64_t i = 0; i < n; ++i) std::copy_n(dsel.data() + i * v, v, d + at(i) * v);
  } else {  // in place: each response row's kernel reads its logits whole, then writes d logits
    for_row_runs(p, pool, [&](int64_t i, int64_t count) {
      token_logprobs_backward(d + at(i) * v, count, v, p.targets.data() + i,
                              h.loss.dlogp.data() + i, dent ? dent + i : nullptr, d + at(i) * v,
                              stats.data() + i);
    });
  }
  if (compact) return h;
  // Rows that are not response rows (prompts, the rows between samples) get zeros.
  std::vector<bool> response(static_cast<size_t>(rows), false);
  for (const int64_t r : p.rows) response[r] = true;
  parallel_ranges(pool, rows, v, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      if (!response[r]) std::fill(d + r * v, d + (r + 1) * v, 0.0f);
  });
  return h;
}

}  // namespace trainer_detail

Trainer::MicroResult Trainer::empty_result() {
  // Buffers of consumed micro-batches are reused (no fresh allocation, no page faults): the
  // backward zero-fills the gradients itself, and the last stage's head overwrites the tied share.
  MicroResult r;
  if (!spare_grads_.empty() && spare_grads_.back().layout_ptr() == layout_) {
    r.grads = std::move(spare_grads_.back());
    spare_grads_.pop_back();
  } else {
    spare_grads_.clear();
    r.grads = FlatTensors(layout_);
  }
  if (config_.tie_word_embeddings) {
    const size_t n = static_cast<size_t>(local_config_.vocab_size * config_.hidden_size);
    if (!spare_tied_.empty() && spare_tied_.back().size() == n) {
      r.tied_head = std::move(spare_tied_.back());
      spare_tied_.pop_back();
      if (!stage_.last()) std::fill(r.tied_head.begin(), r.tied_head.end(), 0.0f);
    } else {
      spare_tied_.clear();
      r.tied_head.assign(n, 0.0f);
    }
  }
  if (draft_) {
    if (!spare_draft_.empty()) {
      r.draft = std::move(spare_draft_.back());
      spare_draft_.pop_back();
    } else {
      r.draft = FlatTensors(draft_->layout());
    }
  }
  return r;
}

std::unique_ptr<ForwardTape> Trainer::take_tape() {
  if (spare_tapes_.empty()) return std::make_unique<ForwardTape>();
  std::unique_ptr<ForwardTape> t = std::move(spare_tapes_.back());
  spare_tapes_.pop_back();
  return t;
}

void Trainer::recycle(std::unique_ptr<ForwardTape> tape) {
  if (tape) spare_tapes_.push_back(std::move(tape));
}

void Trainer::recycle(MicroResult&& r) {
  if (!r.draft.all().empty()) spare_draft_.push_back(std::move(r.draft));
  if (r.grads.all().empty()) return;
  spare_grads_.push_back(std::move(r.grads));
  if (!r.tied_head.empty()) spare_tied_.push_back(std::move(r.tied_head));
}

TokenObjective sft_objective(std::span<const TrainSample> batch, double total_tokens) {
  return [batch, total_tokens](const TokenView& v) -> Result<TokenLoss> {
    TokenLoss l;
    l.dlogp.assign(v.logp.size(), 0.0f);
    const float g = static_cast<float>(-1.0 / total_tokens);
    double nll = 0, count = 0;
    for (size_t s = 0; s < v.samples.size(); ++s) {
      const std::vector<float>& mask = batch[v.samples[s]].loss_mask;
      for (int64_t i = v.offsets[s]; i < v.offsets[s + 1]; ++i) {
        const float m = mask[i - v.offsets[s]];
        if (m == 0.0f) continue;
        nll -= static_cast<double>(v.logp[i]) * m;
        count += m;
        l.dlogp[i] = g * m;
      }
    }
    l.loss = nll / total_tokens;
    l.sums["nll_sum"] = nll;
    l.sums["loss_tokens"] = count;
    return l;
  };
}

}  // namespace miles
