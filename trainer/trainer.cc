// Trainer::step: micro-batches → forward + backward each → tree-ordered gradient sum →
// (data-parallel tree sum) → clip → AdamW → rebuilt model. See trainer.h for the contract.
#include "miles/trainer.h"

#include <algorithm>

#include "miles/comm.h"
#include "miles/logprob.h"
#include "miles/thread_pool.h"

namespace miles {

struct Trainer::MicroResult {
  FlatTensors grads;
  double loss = 0;
  int64_t tokens = 0;
  std::map<std::string, double> sums;
};

namespace {

// A micro-batch packed for the model: each sample's tokens [0, T − 1) as one sequence.
struct Packed {
  std::vector<int32_t> tokens;
  std::vector<SeqSpan> seqs;
  std::vector<int32_t> forced;   // (Σ (T − 1), moe_layers, top_k) or empty
  std::vector<int64_t> rows;     // logits rows of the response tokens, in order
  std::vector<int32_t> targets;  // the response tokens
  std::vector<int64_t> samples;  // batch indices
  std::vector<int64_t> offsets;  // (S + 1) into rows
};

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

// Halving-tree midpoint, as kernels.h's reductions.
int64_t tree_mid(int64_t lo, int64_t hi) { return lo + (hi - lo + 1) / 2; }

void add_sums(std::map<std::string, double>& into, const std::map<std::string, double>& from) {
  for (const auto& [k, v] : from) into[k] += v;
}

}  // namespace

Status TrainerConfig::validate() const {
  MILES_RETURN_IF_ERROR(optimizer.validate());
  MILES_RETURN_IF_ERROR(lr.validate());
  if (micro_batch_size < 1) return Status::Error("trainer.micro_batch_size must be >= 1");
  return Status::Ok();
}

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const ModelConfig& config,
                                                 const TensorMap& weights, const TrainerConfig& tc,
                                                 ThreadPool* pool) {
  MILES_RETURN_IF_ERROR(tc.validate());
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->tc_ = tc;
  t->pool_ = pool;
  t->layout_ = ParamLayout::for_model(config, &weights);
  MILES_ASSIGN_OR_RETURN(t->params_, FlatTensors::from_tensor_map(t->layout_, weights));
  t->opt_ = std::make_unique<AdamW>(t->layout_, tc.optimizer);
  MILES_RETURN_IF_ERROR(t->reload_model());
  return t;
}

Status Trainer::reload_model() {
  const TensorMap view = params_.as_tensor_map();
  MILES_ASSIGN_OR_RETURN(model_, Model::from_weights(config_, view));
  return Status::Ok();
}

Status Trainer::check_batch(std::span<const TrainSample> batch) const {
  if (batch.empty()) return Status::Error("the training batch is empty");
  const int64_t per_token = config_.num_moe_layers() * config_.moe.top_k;
  for (size_t i = 0; i < batch.size(); ++i) {
    const TrainSample& s = batch[i];
    const int64_t t = s.tokens.size();
    const std::string at = "sample " + std::to_string(i) + ": ";
    if (t < 2) return Status::Error(at + "needs at least 2 tokens, has " + std::to_string(t));
    if (s.response_length < 1 || s.response_length > t - 1)
      return Status::Error(at + "response_length " + std::to_string(s.response_length) +
                           " is outside [1, " + std::to_string(t - 1) + "]");
    if (static_cast<int64_t>(s.loss_mask.size()) != s.response_length)
      return Status::Error(at + "loss_mask has " + std::to_string(s.loss_mask.size()) +
                           " values, expected response_length " +
                           std::to_string(s.response_length));
    for (int32_t id : s.tokens)
      if (id < 0 || id >= config_.vocab_size)
        return Status::Error(at + "token id " + std::to_string(id) + " is outside the vocabulary");
    if (!s.routed_experts.empty() &&
        static_cast<int64_t>(s.routed_experts.size()) != (t - 1) * per_token)
      return Status::Error(at + "routed_experts has " + std::to_string(s.routed_experts.size()) +
                           " ids, expected (tokens − 1) × moe_layers × top_k = " +
                           std::to_string((t - 1) * per_token));
    if (tc_.replay_experts && per_token > 0 &&
        s.routed_experts.empty() != batch[0].routed_experts.empty())
      return Status::Error(at + "some samples carry routed_experts and others do not");
  }
  if (static_cast<int64_t>(batch.size()) % tc_.micro_batch_size != 0)
    return Status::Error("batch of " + std::to_string(batch.size()) +
                         " samples is not a multiple of trainer.micro_batch_size " +
                         std::to_string(tc_.micro_batch_size));
  return Status::Ok();
}

Result<Trainer::MicroResult> Trainer::micro_step(std::span<const TrainSample> batch, int64_t first,
                                                 int64_t count, const TokenObjective& objective) {
  const bool replay =
      tc_.replay_experts && config_.num_moe_layers() > 0 && !batch[first].routed_experts.empty();
  const Packed p = pack(batch, first, count, replay);
  auto kv = model_->make_kv_cache();
  ForwardTape tape;
  ForwardOptions opt;
  opt.tape = &tape;
  opt.forced_experts = p.forced;
  MILES_ASSIGN_OR_RETURN(ForwardOutput out, model_->forward(p.tokens, p.seqs, *kv, opt, pool_));
  const int64_t v = config_.vocab_size, n = p.rows.size();
  std::vector<float> sel(static_cast<size_t>(n * v));
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(out.logits.data() + p.rows[i] * v, v, sel.data() + i * v);
  std::vector<float> logp(n), entropy(tc_.need_entropy ? n : 0);
  token_logprobs(sel.data(), n, v, p.targets.data(), logp.data(),
                 tc_.need_entropy ? entropy.data() : nullptr);
  MILES_ASSIGN_OR_RETURN(TokenLoss loss, objective(TokenView{p.samples, p.offsets, logp, entropy}));
  if (static_cast<int64_t>(loss.dlogp.size()) != n ||
      (!loss.dentropy.empty() && static_cast<int64_t>(loss.dentropy.size()) != n))
    return Status::Error("objective returned gradients for the wrong number of tokens");
  if (!loss.dentropy.empty() && !tc_.need_entropy)
    return Status::Error("objective uses entropy but trainer.need_entropy is off");
  std::vector<float> dsel(static_cast<size_t>(n * v));
  token_logprobs_backward(sel.data(), n, v, p.targets.data(), loss.dlogp.data(),
                          loss.dentropy.empty() ? nullptr : loss.dentropy.data(), dsel.data());
  sel.clear();
  std::vector<float> dlogits(out.logits.size(), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(dsel.data() + i * v, v, dlogits.data() + p.rows[i] * v);
  MicroResult r{FlatTensors(layout_), loss.loss, n, loss.sums};
  MILES_RETURN_IF_ERROR(model_->backward(tape, dlogits, r.grads, pool_));
  return r;
}

Result<Trainer::MicroResult> Trainer::accumulate(std::span<const TrainSample> batch, int64_t lo,
                                                 int64_t hi, const TokenObjective& objective) {
  const int64_t mbs = tc_.micro_batch_size;
  if (hi - lo == 1) return micro_step(batch, lo * mbs, mbs, objective);
  const int64_t mid = tree_mid(lo, hi);
  MILES_ASSIGN_OR_RETURN(MicroResult a, accumulate(batch, lo, mid, objective));
  MILES_ASSIGN_OR_RETURN(MicroResult b, accumulate(batch, mid, hi, objective));
  std::span<float> ga = a.grads.all();
  std::span<const float> gb = std::as_const(b.grads).all();
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = ga[i] + gb[i];
  a.loss += b.loss;
  a.tokens += b.tokens;
  add_sums(a.sums, b.sums);
  return a;
}

Result<StepResult> Trainer::step(std::span<const TrainSample> batch,
                                 const TokenObjective& objective, Communicator* dp) {
  MILES_RETURN_IF_ERROR(check_batch(batch));
  const int64_t micro = batch.size() / tc_.micro_batch_size;
  int64_t lo = 0, hi = micro;
  if (dp && dp->size() > 1) {
    const int64_t n = dp->size();
    if (micro % n != 0)
      return Status::Error(std::to_string(micro) + " micro-batches do not split evenly over " +
                           std::to_string(n) + " data-parallel ranks");
    lo = dp->rank() * (micro / n);
    hi = lo + micro / n;
  }
  MILES_ASSIGN_OR_RETURN(MicroResult acc, accumulate(batch, lo, hi, objective));
  if (dp && dp->size() > 1) {
    MILES_RETURN_IF_ERROR(dp->all_reduce_sum_deterministic(acc.grads.all()));
    std::vector<double> scalars{acc.loss, static_cast<double>(acc.tokens)};
    for (const auto& [k, v] : acc.sums) scalars.push_back(v);
    MILES_RETURN_IF_ERROR(dp->all_reduce_sum_deterministic(std::span<double>(scalars)));
    acc.loss = scalars[0];
    acc.tokens = static_cast<int64_t>(scalars[1]);
    size_t i = 2;
    for (auto& [k, v] : acc.sums) v = scalars[i++];
  }
  StepResult r;
  r.grad_norm = clip_grad_norm(acc.grads, tc_.optimizer.clip_grad_norm);
  r.lr = tc_.lr.at(opt_->steps());
  opt_->step(params_, acc.grads, r.lr);
  MILES_RETURN_IF_ERROR(reload_model());
  r.step = opt_->steps();
  r.loss = acc.loss;
  r.tokens = acc.tokens;
  r.sums = std::move(acc.sums);
  return r;
}

Result<std::vector<ScoredSample>> Trainer::score(std::span<const TrainSample> batch, bool replay) {
  MILES_RETURN_IF_ERROR(check_batch(batch));
  std::vector<ScoredSample> out(batch.size());
  const int64_t v = config_.vocab_size, per_token = config_.num_moe_layers() * config_.moe.top_k;
  for (size_t s = 0; s < batch.size(); ++s) {
    const bool use = replay && per_token > 0 && !batch[s].routed_experts.empty();
    const Packed p = pack(batch, s, 1, use);
    auto kv = model_->make_kv_cache();
    ForwardOptions opt;
    opt.forced_experts = p.forced;
    opt.return_experts = per_token > 0;
    MILES_ASSIGN_OR_RETURN(ForwardOutput f, model_->forward(p.tokens, p.seqs, *kv, opt, pool_));
    const int64_t n = p.rows.size();
    std::vector<float> sel(static_cast<size_t>(n * v));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(f.logits.data() + p.rows[i] * v, v, sel.data() + i * v);
    out[s].logp.resize(n);
    if (tc_.need_entropy) out[s].entropy.resize(n);
    token_logprobs(sel.data(), n, v, p.targets.data(), out[s].logp.data(),
                   tc_.need_entropy ? out[s].entropy.data() : nullptr);
    out[s].experts = std::move(f.experts);
  }
  return out;
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
