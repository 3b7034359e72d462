// Packing samples for the model, the halving-tree sum over micro-batches, the loss head, and the
// SFT objective (trainer_internal.h, trainer.h).
#include <algorithm>

#include "miles/logprob.h"
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

Result<Trainer::MicroResult> tree_sum(int64_t lo, int64_t hi, const Leaf& leaf) {
  if (hi - lo == 1) return leaf(lo);
  const int64_t mid = lo + (hi - lo + 1) / 2;  // kernels.h's split
  MILES_ASSIGN_OR_RETURN(Trainer::MicroResult a, tree_sum(lo, mid, leaf));
  MILES_ASSIGN_OR_RETURN(Trainer::MicroResult b, tree_sum(mid, hi, leaf));
  std::span<float> ga = a.grads.all();
  std::span<const float> gb = std::as_const(b.grads).all();
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = ga[i] + gb[i];
  for (size_t i = 0; i < a.tied_head.size(); ++i) a.tied_head[i] = a.tied_head[i] + b.tied_head[i];
  a.loss += b.loss;
  a.tokens += b.tokens;
  for (const auto& [k, v] : b.sums) a.sums[k] += v;
  return a;
}

Result<HeadResult> loss_head(const Packed& p, const std::vector<float>& logits, int64_t v,
                             bool need_entropy, const TokenObjective& objective,
                             const TensorParallel* tp) {
  const int64_t n = p.rows.size();
  std::vector<float> sel(static_cast<size_t>(n * v));
  for (int64_t i = 0; i < n; ++i) std::copy_n(logits.data() + p.rows[i] * v, v, sel.data() + i * v);
  std::vector<float> logp(n), entropy(need_entropy ? n : 0);
  if (tp) {
    MILES_RETURN_IF_ERROR(token_logprobs_vocab_parallel(sel.data(), n, v, tp->vocab_begin,
                                                        p.targets.data(), *tp->comm, logp.data(),
                                                        need_entropy ? entropy.data() : nullptr));
  } else {
    token_logprobs(sel.data(), n, v, p.targets.data(), logp.data(),
                   need_entropy ? entropy.data() : nullptr);
  }
  HeadResult h;
  MILES_ASSIGN_OR_RETURN(h.loss, objective(TokenView{p.samples, p.offsets, logp, entropy}));
  if (static_cast<int64_t>(h.loss.dlogp.size()) != n ||
      (!h.loss.dentropy.empty() && static_cast<int64_t>(h.loss.dentropy.size()) != n))
    return Status::Error("objective returned gradients for the wrong number of tokens");
  if (!h.loss.dentropy.empty() && !need_entropy)
    return Status::Error("objective uses entropy but trainer.need_entropy is off");
  std::vector<float> dsel(static_cast<size_t>(n * v));
  const float* dent = h.loss.dentropy.empty() ? nullptr : h.loss.dentropy.data();
  if (tp) {
    MILES_RETURN_IF_ERROR(
        token_logprobs_backward_vocab_parallel(sel.data(), n, v, tp->vocab_begin, p.targets.data(),
                                               *tp->comm, h.loss.dlogp.data(), dent, dsel.data()));
  } else {
    token_logprobs_backward(sel.data(), n, v, p.targets.data(), h.loss.dlogp.data(), dent,
                            dsel.data());
  }
  h.dlogits.assign(logits.size(), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(dsel.data() + i * v, v, h.dlogits.data() + p.rows[i] * v);
  return h;
}

}  // namespace trainer_detail

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
