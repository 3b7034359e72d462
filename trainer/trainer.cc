// Trainer::step: micro-batches (one process, or a pipeline schedule) → tree-ordered gradient sum →
// data-parallel tree sum → stage exchange (tied embedding, losses, grad norm) → clip → AdamW →
// rebuilt model. See trainer.h for the contract.
#include "miles/trainer/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "miles/comm.h"
#include "miles/grad_sink.h"
#include "miles/logprob.h"
#include "miles/tensor_parallel.h"
#include "miles/thread_pool.h"
#include "trainer/draft_trainer.h"
#include "trainer/trainer_internal.h"

namespace miles {

using trainer_detail::pack;
using trainer_detail::Packed;

Status TrainerConfig::validate() const {
  MILES_RETURN_IF_ERROR(optimizer.validate());
  MILES_RETURN_IF_ERROR(lr.validate());
  if (micro_batch_size < 1) return Status::Error("trainer.micro_batch_size must be >= 1");
  MILES_RETURN_IF_ERROR(draft.validate());
  return Status::Ok();
}

Status DraftTrainConfig::validate() const {
  if (!enabled) return Status::Ok();
  if (!(std::isfinite(lr) && lr > 0)) return Status::Error("draft head: lr must be positive");
  if (vocab_size < 2) return Status::Error("draft head: vocab_size must be >= 2");
  if (passes < 1 || passes > DraftHead::kMaxPasses)
    return Status::Error("draft head: " + std::to_string(passes) + " training passes; 1 to " +
                         std::to_string(DraftHead::kMaxPasses));
  if (static_cast<int64_t>(feature_layers.size()) > DraftHead::kMaxFeatureLayers)
    return Status::Error("draft head: at most " + std::to_string(DraftHead::kMaxFeatureLayers) +
                         " feature layers");
  return Status::Ok();
}

const DraftHead* Trainer::draft() const { return draft_ ? &draft_->head() : nullptr; }

Result<DraftTrainState> Trainer::draft_state() const {
  if (!draft_) return Status::Error("this trainer has no draft head (TrainerConfig::draft)");
  return draft_->state();
}

Status Trainer::restore_draft(const DraftTrainState& state) {
  if (!draft_) return Status::Error("this trainer has no draft head (TrainerConfig::draft)");
  return draft_->restore(state, params_.as_tensor_map());
}

Trainer::Trainer() = default;
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const ModelConfig& config,
                                                 const TensorMap& weights, const TrainerConfig& tc,
                                                 ThreadPool* pool) {
  MILES_RETURN_IF_ERROR(tc.validate());
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->local_config_ = config;
  t->tc_ = tc;
  t->pool_ = pool;
  t->layout_ = ParamLayout::for_model(config, &weights);
  t->full_layout_ = t->layout_;
  MILES_ASSIGN_OR_RETURN(t->params_, FlatTensors::from_tensor_map(t->layout_, weights));
  t->opt_ = std::make_unique<AdamW>(t->layout_, tc.optimizer);
  MILES_RETURN_IF_ERROR(t->set_pipeline_stage(0, 1));
  MILES_RETURN_IF_ERROR(t->reload_model());
  if (tc.draft.enabled) {
    MILES_ASSIGN_OR_RETURN(
        t->draft_, trainer_detail::DraftTrainer::create(config, weights, tc.draft, tc.optimizer));
  }
  return t;
}

Status Trainer::reload_model() {
  const TensorMap view = params_.as_tensor_map();
  if (tc_.device != Device::kCpu) {  // same tensors, new values, into the device's buffers
    if (device_model_) return device_model_->reload_weights(view);
    MILES_ASSIGN_OR_RETURN(device_model_,
                           make_device_model(tc_.device, local_config_, view, {1, 16}, pool_));
    return Status::Ok();
  }
  if (model_ && model_layout_ == layout_) {  // same tensors, new values: reuse the buffers
    const Status s = model_->reload_weights(view, pool_);
    if (!s.ok()) spdlog::error("trainer: {}", s.message());
    MILES_CHECK(s.ok(), "reloading the trainer's own parameters into its model failed");
    return Status::Ok();
  }
  MILES_ASSIGN_OR_RETURN(model_, Model::from_weights(local_config_, view));
  model_layout_ = layout_;  // a new layout (tensor-parallel shards) builds a new model
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
                                                 int64_t count, const TokenObjective& objective,
                                                 std::span<MicroResult* const> lefts) {
  const bool replay =
      tc_.replay_experts && config_.num_moe_layers() > 0 && !batch[first].routed_experts.empty();
  const Packed p = pack(batch, first, count, replay);
  if (device_model_) return device_micro_step(p, batch, objective);  // the tree folds its result
  auto kv = model_->make_kv_cache();
  std::unique_ptr<ForwardTape> tape = take_tape();
  ForwardOptions opt;
  opt.tape = tape.get();
  opt.logits_storage = &spare_logits_;
  opt.forced_experts = p.forced;
  opt.tp = tp();
  if (draft_) opt.tap_layers = draft_->head().feature_layers();
  opt.logit_rows = p.rows;  // the LM head on the loss rows only
  MILES_ASSIGN_OR_RETURN(ForwardOutput out, model_->forward(p.tokens, p.seqs, *kv, opt, pool_));
  MicroResult r = empty_result();
  std::map<std::string, double> draft_sums;
  if (draft_)  // before the loss head writes d logits over the logits
    MILES_RETURN_IF_ERROR(
        draft_->micro_batch(p, batch, out.taps, out.logits, tp(), r.draft, draft_sums, pool_));
  MILES_ASSIGN_OR_RETURN(
      trainer_detail::HeadResult head,
      trainer_detail::loss_head(p, std::move(out.logits), local_config_.vocab_size,
                                tc_.need_entropy, objective, tp(), pool_));
  r.loss = head.loss.loss;
  r.tokens = p.rows.size();
  r.sums = std::move(head.loss.sums);
  for (const auto& [k, v] : draft_sums) r.sums[k] += v;
  BackwardIo io;
  io.tied_head_grad = r.tied_head;
  io.tp = tp();
  trainer_detail::fold_targets(lefts, io.fold, io.tied_fold);
  MILES_RETURN_IF_ERROR(model_->backward(*tape, head.dlogits, r.grads, pool_, io));
  recycle(std::move(tape));
  spare_logits_ = std::move(head.dlogits);
  r.folded = !lefts.empty();
  return r;
}

// micro_step on the device: forward (activations kept there), the loss head on the host with the
// logits copied back, then the backward from the d logits copied over.
Result<Trainer::MicroResult> Trainer::device_micro_step(const trainer_detail::Packed& p,
                                                        std::span<const TrainSample> batch,
                                                        const TokenObjective& objective) {
  std::vector<int64_t> taps;
  if (draft_) taps = draft_->head().feature_layers();
  MILES_ASSIGN_OR_RETURN(ForwardOutput out, device_model_->forward_train(p.tokens, p.seqs, true,
                                                                         p.forced, p.rows, taps));
  MicroResult r = empty_result();
  std::map<std::string, double> draft_sums;
  if (draft_)  // on the host, from the features and logits copied back, as on a CPU trainer
    MILES_RETURN_IF_ERROR(
        draft_->micro_batch(p, batch, out.taps, out.logits, nullptr, r.draft, draft_sums, pool_));
  MILES_ASSIGN_OR_RETURN(
      trainer_detail::HeadResult head,
      trainer_detail::loss_head(p, std::move(out.logits), local_config_.vocab_size,
                                tc_.need_entropy, objective, nullptr, pool_));
  r.loss = head.loss.loss;
  r.tokens = p.rows.size();
  r.sums = std::move(head.loss.sums);
  for (const auto& [k, v] : draft_sums) r.sums[k] += v;
  MILES_RETURN_IF_ERROR(device_model_->backward(head.dlogits, r.grads, r.tied_head));
  return r;
}

// After the data-parallel sum: the last stage's loss and metrics to every stage, the tied
// embedding's two shares (stage 0's scatter, the last stage's head) to both owners.
Status Trainer::reduce_across_stages(MicroResult& acc, Communicator* pp) {
  const bool tied = config_.tie_word_embeddings;
  if (pp && pp->size() > 1) {
    const int last = pp->size() - 1;
    std::string blob;
    // Scalars: loss, tokens, then the metric sums as (name, value) pairs, from the last stage.
    std::vector<double> scalars;
    std::vector<std::string> names;
    uint64_t count = 0;
    if (stage_.last()) {
      scalars = {acc.loss, static_cast<double>(acc.tokens)};
      for (const auto& [k, v] : acc.sums) {
        names.push_back(k);
        scalars.push_back(v);
      }
      for (const std::string& n : names) blob += n + '\n';
      count = scalars.size();
    }
    uint64_t sizes[2] = {count, blob.size()};
    MILES_RETURN_IF_ERROR(pp->broadcast(sizes, sizeof(sizes), last));
    scalars.resize(sizes[0]);
    blob.resize(sizes[1]);
    MILES_RETURN_IF_ERROR(pp->broadcast(scalars.data(), scalars.size() * sizeof(double), last));
    if (!blob.empty()) MILES_RETURN_IF_ERROR(pp->broadcast(blob.data(), blob.size(), last));
    if (!stage_.last()) {
      acc.loss = scalars[0];
      acc.tokens = static_cast<int64_t>(scalars[1]);
      acc.sums.clear();
      size_t pos = 0;
      for (size_t i = 2; i < scalars.size(); ++i) {
        const size_t nl = blob.find('\n', pos);
        acc.sums[blob.substr(pos, nl - pos)] = scalars[i];
        pos = nl + 1;
      }
    }
    if (tied) {  // stage 0 has the scatter share, the last stage the head share
      std::span<float> embed = acc.grads.get("model.embed_tokens.weight");
      const size_t bytes = embed.size() * sizeof(float);
      if (stage_.first()) {
        MILES_RETURN_IF_ERROR(pp->send(embed.data(), bytes, last, 0x7fff0001u));
        MILES_RETURN_IF_ERROR(pp->recv(acc.tied_head.data(), bytes, last, 0x7fff0002u));
      } else if (stage_.last()) {
        std::vector<float> scatter(embed.size());
        MILES_RETURN_IF_ERROR(pp->recv(scatter.data(), bytes, 0, 0x7fff0001u));
        MILES_RETURN_IF_ERROR(pp->send(acc.tied_head.data(), bytes, 0, 0x7fff0002u));
        std::copy(scatter.begin(), scatter.end(), embed.begin());
      }
    }
  }
  if (tied && (stage_.first() || stage_.last())) {  // embedding = scatter share + head share
    const std::span<float> embed[] = {acc.grads.get("model.embed_tokens.weight")};
    GradSink::fold_buffer(acc.tied_head, embed, pool_);  // embed = embed + head, element-wise
  }
  return Status::Ok();
}

// √(Σ per-tensor Σg²), each tensor's sum taken from its owning stage, summed in layout order: the
// single-process global_grad_norm whatever the stage split.
double Trainer::owned_grad_norm(const MicroResult& acc, Communicator* pp) {
  const std::vector<ParamSpec>& specs = layout_->specs();
  std::vector<double> sq(specs.size(), 0.0);
  // Work items are slices (squared_norm's), summed per tensor in ascending order afterwards.
  std::vector<std::pair<size_t, int64_t>> slices;  // (tensor, first element)
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool report = owned_[i] && !(specs[i].name == "model.embed_tokens.weight" &&
                                       !stage_.first());  // a tied embedding counts once
    if (report)
      for (int64_t b = 0; b < specs[i].numel; b += kNormSlice) slices.emplace_back(i, b);
  }
  std::vector<double> part(slices.size());
  parallel_for(pool_, slices.size(), [&](int64_t j) {
    const auto [i, b] = slices[j];
    part[j] = squared_norm_slice(acc.grads.all().data() + specs[i].offset + b,
                                 std::min(kNormSlice, specs[i].numel - b));
  });
  for (size_t j = 0; j < slices.size(); ++j) sq[slices[j].first] = sq[slices[j].first] + part[j];
  if (tp_.comm && tp_.comm->size() > 1) {  // shards add up; a replicated tensor counts once
    if (tp_.comm->rank() != 0)
      for (size_t i = 0; i < specs.size(); ++i)
        if (tensor_parallel::split_of(specs[i].name) == tensor_parallel::Split::kReplicated)
          sq[i] = 0;
    if (!tp_.comm->all_reduce_sum_deterministic(std::span<double>(sq)).ok()) return -1;
  }
  if (pp && pp->size() > 1) {
    std::vector<double> all(sq.size() * pp->size());
    if (!pp->allgather(sq.data(), sq.size() * sizeof(double), all.data()).ok()) return -1;
    for (size_t i = 0; i < sq.size(); ++i) {
      sq[i] = 0;
      for (int r = 0; r < pp->size(); ++r) sq[i] += all[r * sq.size() + i];  // one owner ≠ 0
    }
  }
  double total = 0;
  for (double v : sq) total += v;
  return std::sqrt(total);
}

Result<StepResult> Trainer::step(std::span<const TrainSample> batch,
                                 const TokenObjective& objective, const TrainerComms& comms) {
  MILES_RETURN_IF_ERROR(check_batch(batch));
  Communicator* dp = comms.dp && comms.dp->size() > 1 ? comms.dp : nullptr;
  Communicator* pp = comms.pp && comms.pp->size() > 1 ? comms.pp : nullptr;
  if ((pp ? pp->size() : 1) != stage_.num_stages)
    return Status::Error("the pipeline group has " + std::to_string(pp ? pp->size() : 1) +
                         " ranks but this trainer is one of " + std::to_string(stage_.num_stages) +
                         " stages");
  const int64_t micro = batch.size() / tc_.micro_batch_size;
  int64_t lo = 0, hi = micro;
  if (dp) {
    const int64_t n = dp->size();
    if (micro % n != 0)
      return Status::Error(std::to_string(micro) + " micro-batches do not split evenly over " +
                           std::to_string(n) + " data-parallel ranks");
    lo = dp->rank() * (micro / n);
    hi = lo + micro / n;
  }
  const int64_t mbs = tc_.micro_batch_size;
  if (draft_) MILES_RETURN_IF_ERROR(draft_->begin_step(batch));
  Result<MicroResult> summed = Status::Error("unset");
  const trainer_detail::Recycle recycle_fn = [this](MicroResult&& r) { recycle(std::move(r)); };
  if (pp) {
    PipelineRun run(*this, batch, objective, lo, hi, *pp);
    summed = trainer_detail::tree_sum(
        lo, hi, [&](int64_t, std::span<MicroResult* const> lefts) { return run.next(lefts); },
        pool_, recycle_fn);
    MILES_RETURN_IF_ERROR(run.finish());
  } else {
    summed = trainer_detail::tree_sum(
        lo, hi,
        [&](int64_t mb, std::span<MicroResult* const> lefts) {
          return micro_step(batch, mb * mbs, mbs, objective, lefts);
        },
        pool_, recycle_fn);
  }
  if (!summed.ok()) return summed.status();
  MicroResult acc = std::move(summed).value();
  if (dp) {
    MILES_RETURN_IF_ERROR(dp->all_reduce_sum_deterministic(acc.grads.all()));
    if (!acc.tied_head.empty())
      MILES_RETURN_IF_ERROR(dp->all_reduce_sum_deterministic(std::span<float>(acc.tied_head)));
    if (!acc.draft.all().empty())
      MILES_RETURN_IF_ERROR(dp->all_reduce_sum_deterministic(acc.draft.all()));
    std::vector<double> scalars{acc.loss, static_cast<double>(acc.tokens)};
    for (const auto& [k, v] : acc.sums) scalars.push_back(v);
    MILES_RETURN_IF_ERROR(dp->all_reduce_sum_deterministic(std::span<double>(scalars)));
    acc.loss = scalars[0];
    acc.tokens = static_cast<int64_t>(scalars[1]);
    size_t i = 2;
    for (auto& [k, v] : acc.sums) v = scalars[i++];
  }
  MILES_RETURN_IF_ERROR(reduce_across_stages(acc, pp));
  StepResult r;
  r.grad_norm = owned_grad_norm(acc, pp);
  if (r.grad_norm < 0) return Status::Error("pipeline group: gathering the gradient norm failed");
  // Clipping: AdamW reads every gradient times clip_grad_norm's factor.
  r.lr = tc_.lr.at(opt_->steps());
  opt_->step(params_, acc.grads, r.lr, &owned_, pool_,
             clip_scale(r.grad_norm, tc_.optimizer.clip_grad_norm));
  MILES_RETURN_IF_ERROR(reload_model());
  if (draft_) MILES_RETURN_IF_ERROR(finish_draft_step(acc, pp));
  r.step = opt_->steps();
  r.loss = acc.loss;
  r.tokens = acc.tokens;
  r.sums = std::move(acc.sums);
  recycle(std::move(acc));
  return r;
}

// The draft head's update after the policy's: on one stage, AdamW on the summed gradients and the
// updated policy's frozen parts. Under a pipeline the last stage trained it (every stage's
// gradients but the last's are zeros): it gets the current embedding from stage 0 (an untied
// model's last stage does not update it) and the input norms read by its feature layers from the
// stages that hold them, updates, and hands the head to every stage (stage 0 publishes it).
Status Trainer::finish_draft_step(MicroResult& acc, Communicator* pp) {
  TensorMap policy = params_.as_tensor_map();
  const std::vector<int64_t> rows{config_.vocab_size, config_.hidden_size};
  // The vocabulary rows whole: a tensor-parallel rank holds its slice of each.
  const auto whole = [&](const char* name, std::vector<float>& into) -> Status {
    const std::span<const float> mine = std::as_const(params_).get(name);
    if (!tp()) {
      into.assign(mine.begin(), mine.end());
      return Status::Ok();
    }
    std::vector<float> gathered(mine.size() * static_cast<size_t>(tp_.comm->size()));
    MILES_RETURN_IF_ERROR(tp_.comm->allgather(mine.data(), mine.size_bytes(), gathered.data()));
    into.resize(gathered.size());
    tensor_parallel::assemble(name, rows, gathered, tp_.comm->size(), into);
    return Status::Ok();
  };
  std::vector<float> embed, head;
  if (tp() || (pp && !config_.tie_word_embeddings))
    MILES_RETURN_IF_ERROR(whole("model.embed_tokens.weight", embed));
  if (tp() && !config_.tie_word_embeddings) MILES_RETURN_IF_ERROR(whole("lm_head.weight", head));
  if (pp && !config_.tie_word_embeddings)
    MILES_RETURN_IF_ERROR(pp->broadcast(embed.data(), embed.size() * sizeof(float), 0));
  if (!embed.empty())
    policy.insert("model.embed_tokens.weight",
                  Tensor::view(DType::kF32, rows, embed.data(), nullptr), "whole rows");
  if (!head.empty())
    policy.insert("lm_head.weight", Tensor::view(DType::kF32, rows, head.data(), nullptr),
                  "whole rows");
  // Feature layers below the last: the norm the policy applies next (layer l + 1's input norm)
  // from the stage that holds and updates it.
  std::vector<std::vector<float>> norms;
  if (pp) {
    for (const int64_t l : draft_->head().feature_layers()) {
      if (l + 1 >= config_.num_layers) continue;
      const std::string name = "model.layers." + std::to_string(l + 1) + ".input_layernorm.weight";
      int owner = 0;
      while (stage_layers(config_.num_layers, owner, pp->size()).second <= l + 1) ++owner;
      const std::span<const float> mine = std::as_const(params_).get(name);
      std::vector<float>& w = norms.emplace_back(mine.begin(), mine.end());
      MILES_RETURN_IF_ERROR(pp->broadcast(w.data(), w.size() * sizeof(float), owner));
      policy.insert(name, Tensor::view(DType::kF32, {config_.hidden_size}, w.data(), nullptr),
                    "the owning stage's");
    }
  }
  if (!pp || stage_.last()) MILES_RETURN_IF_ERROR(draft_->finish_step(acc.draft, policy, pool_));
  if (!pp) return Status::Ok();
  return draft_->share(*pp, pp->size() - 1);
}

Result<std::vector<ScoredSample>> Trainer::score(std::span<const TrainSample> batch, bool replay) {
  MILES_RETURN_IF_ERROR(check_batch(batch));
  if (stage_.num_stages > 1 || tp())
    return Status::Error("score() needs a single-stage trainer without tensor parallelism");
  std::vector<ScoredSample> out(batch.size());
  const int64_t v = config_.vocab_size, per_token = config_.num_moe_layers() * config_.moe.top_k;
  for (size_t s = 0; s < batch.size(); ++s) {
    const bool use = replay && per_token > 0 && !batch[s].routed_experts.empty();
    const Packed p = pack(batch, s, 1, use);
    ForwardOutput f;
    if (device_model_) {
      MILES_ASSIGN_OR_RETURN(f, device_model_->forward_train(p.tokens, p.seqs, false, p.forced));
    } else {
      auto kv = model_->make_kv_cache();
      ForwardOptions opt;
      opt.forced_experts = p.forced;
      opt.return_experts = per_token > 0;
      MILES_ASSIGN_OR_RETURN(f, model_->forward(p.tokens, p.seqs, *kv, opt, pool_));
    }
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

}  // namespace miles
