// DraftTrainer (draft_trainer.h): the step's vocabulary and scale, each micro-batch's rows handed
// to DraftHead::accumulate_grad, AdamW after the tree sum.
#include "trainer/draft_trainer.h"

#include <algorithm>

#include "trainer/trainer_internal.h"

namespace miles::trainer_detail {

Result<std::unique_ptr<DraftTrainer>> DraftTrainer::create(const ModelConfig& policy,
                                                           const TensorMap& policy_weights,
                                                           const DraftTrainConfig& config,
                                                           const AdamWConfig& policy_optimizer) {
  MILES_RETURN_IF_ERROR(config.validate());
  std::unique_ptr<DraftTrainer> t(new DraftTrainer());
  t->config_ = config;
  t->counts_.assign(static_cast<size_t>(policy.vocab_size), 0);
  const int64_t n = std::min(config.vocab_size, policy.vocab_size);
  MILES_ASSIGN_OR_RETURN(t->head_, DraftHead::create(policy, policy_weights, top_ids(t->counts_, n),
                                                     config.feature_layers));
  t->params_ = t->head_->params();
  AdamWConfig oc = policy_optimizer;
  oc.weight_decay = 0;
  oc.clip_grad_norm = 0;
  t->opt_ = std::make_unique<AdamW>(t->params_.layout_ptr(), oc);
  return t;
}

Status DraftTrainer::begin_step(std::span<const TrainSample> batch) {
  double mask = 0;
  for (const TrainSample& s : batch) {
    for (int32_t id : s.tokens) ++counts_[static_cast<size_t>(id)];
    for (float m : s.loss_mask) mask += m;
  }
  scale_ = mask > 0 ? 1.0 / mask : 0.0;
  std::vector<int32_t> vocab = top_ids(counts_, static_cast<int64_t>(head_->vocab().size()));
  if (vocab != head_->vocab()) MILES_RETURN_IF_ERROR(head_->set_vocab(std::move(vocab)));
  return Status::Ok();
}

namespace {

// Every rank's vocabulary slice of each row (rank r: ids [r·v, (r + 1)·v)) into whole rows.
Result<std::vector<float>> whole_rows(std::span<const float> local, int64_t rows,
                                      const TensorParallel& tp) {
  const int n = tp.comm->size();
  const size_t v = rows > 0 ? local.size() / static_cast<size_t>(rows) : 0;
  std::vector<float> gathered(local.size() * static_cast<size_t>(n));
  MILES_RETURN_IF_ERROR(tp.comm->allgather(local.data(), local.size_bytes(), gathered.data()));
  std::vector<float> out(gathered.size());
  for (int r = 0; r < n; ++r)
    for (int64_t t = 0; t < rows; ++t)
      std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>((r * rows + t) * v), v,
                  out.begin() + static_cast<std::ptrdiff_t>((t * n + r) * v));
  return out;
}

}  // namespace

Status DraftTrainer::micro_batch(const Packed& p, std::span<const TrainSample> batch,
                                 std::span<const float> features, std::span<const float> logits,
                                 const TensorParallel* tp, FlatTensors& grads,
                                 std::map<std::string, double>& sums, ThreadPool* pool) {
  // The policy's logits are the loss rows' (p.rows, the forward's logit_rows); the head reads a
  // row's logits only where its weight is non-zero, which are loss rows: it finds them through
  // logit_row (the others have none).
  const int64_t n = static_cast<int64_t>(p.rows.size()), t = static_cast<int64_t>(p.tokens.size());
  grads.zero();
  if (n == 0) return Status::Ok();  // no loss row: nothing to fit (every weight would be 0)
  std::vector<float> whole;
  if (tp) {
    MILES_ASSIGN_OR_RETURN(whole, whole_rows(logits, n, *tp));
    logits = whole;
  }
  std::vector<int64_t> logit_row(static_cast<size_t>(t), -1);
  for (int64_t i = 0; i < n; ++i) logit_row[p.rows[i]] = i;
  // The weight of logits row r is the loss mask of the token it predicts.
  std::vector<float> weight(p.tokens.size(), 0.0f);
  for (size_t s = 0; s < p.samples.size(); ++s) {
    const std::vector<float>& mask = batch[p.samples[s]].loss_mask;
    for (int64_t i = p.offsets[s]; i < p.offsets[s + 1]; ++i)
      weight[p.rows[i]] = mask[i - p.offsets[s]];
  }
  const DraftTrainRows rows{p.tokens, p.seqs, features, logits, weight, logit_row};
  MILES_ASSIGN_OR_RETURN(DraftTrainSums d,
                         head_->accumulate_grad(rows, scale_, grads, pool, config_.passes));
  const auto add = [&](const DraftTrainSums& s, const std::string& suffix) {
    sums["draft_loss" + suffix] += s.loss;
    sums["draft_rows" + suffix] += s.rows;
    sums["draft_agree" + suffix] += s.agree;
    sums["draft_accept" + suffix] += s.accept;
    sums["draft_in_vocab" + suffix] += s.in_vocab;
  };
  add(d, "");
  for (size_t p = 0; p < d.ahead.size(); ++p) add(d.ahead[p], "_" + std::to_string(p + 2));
  return Status::Ok();
}

Status DraftTrainer::finish_step(const FlatTensors& grads, const TensorMap& policy,
                                 ThreadPool* pool) {
  opt_->step(params_, grads, config_.lr, nullptr, pool);
  MILES_RETURN_IF_ERROR(head_->set_params(params_));
  return head_->set_policy(policy);
}

Status DraftTrainer::share(Communicator& group, int root) {
  MILES_RETURN_IF_ERROR(
      group.broadcast(params_.all().data(), params_.all().size() * sizeof(float), root));
  return head_->set_params(params_);
}

Status DraftTrainer::share_state(Communicator& group, int root) {
  for (FlatTensors* f : {&params_, &opt_->exp_avg(), &opt_->exp_avg_sq()})
    MILES_RETURN_IF_ERROR(group.broadcast(f->all().data(), f->all().size() * sizeof(float), root));
  int64_t steps = opt_->steps();
  MILES_RETURN_IF_ERROR(group.broadcast(&steps, sizeof steps, root));
  opt_->set_steps(steps);
  return head_->set_params(params_);
}

DraftTrainState DraftTrainer::state() const {
  return {params_, opt_->exp_avg(), opt_->exp_avg_sq(), opt_->steps(), counts_};
}

Status DraftTrainer::restore(const DraftTrainState& s, const TensorMap& policy) {
  const auto same = [&](const FlatTensors& f) {
    return f.layout_ptr() && f.layout().specs().size() == params_.layout().specs().size() &&
           f.all().size() == params_.all().size() &&
           std::ranges::equal(f.layout().specs(), params_.layout().specs(),
                              [](const ParamSpec& a, const ParamSpec& b) {
                                return a.name == b.name && a.shape == b.shape;
                              });
  };
  if (!same(s.params) || !same(s.exp_avg) || !same(s.exp_avg_sq))
    return Status::Error("draft head state: its tensors are not this head's layout");
  if (s.counts.size() != counts_.size())
    return Status::Error("draft head state: " + std::to_string(s.counts.size()) +
                         " id counts for a policy vocabulary of " + std::to_string(counts_.size()));
  if (s.steps < 0) return Status::Error("draft head state: negative step count");
  counts_ = s.counts;
  std::ranges::copy(s.params.all(), params_.all().begin());
  std::ranges::copy(s.exp_avg.all(), opt_->exp_avg().all().begin());
  std::ranges::copy(s.exp_avg_sq.all(), opt_->exp_avg_sq().all().begin());
  opt_->set_steps(s.steps);
  std::vector<int32_t> vocab = top_ids(counts_, static_cast<int64_t>(head_->vocab().size()));
  if (vocab != head_->vocab()) MILES_RETURN_IF_ERROR(head_->set_vocab(std::move(vocab)));
  MILES_RETURN_IF_ERROR(head_->set_params(params_));
  return head_->set_policy(policy);
}

}  // namespace miles::trainer_detail
