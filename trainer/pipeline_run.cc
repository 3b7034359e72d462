// PipelineRun: one stage's 1F1B schedule over its micro-batches (trainer_internal.h).
#include <algorithm>

#include "miles/comm.h"
#include "trainer/draft_trainer.h"
#include "trainer/trainer_internal.h"

namespace miles {

using trainer_detail::fold_targets;
using trainer_detail::Packed;

// What a micro-batch keeps between its forward and its backward on this stage.
struct PipelineRun::InFlight {
  Packed packed;
  std::unique_ptr<ForwardTape> tape;  // from the trainer's spares, handed back after the backward
  std::vector<float> dlogits;         // last stage
  TokenLoss loss;                     // last stage
  FlatTensors draft;  // last stage: the draft head's gradients (TrainerConfig::draft)
  std::map<std::string, double> draft_sums;
};

namespace {
uint32_t forward_tag(int64_t mb) { return static_cast<uint32_t>(2 * mb); }
uint32_t backward_tag(int64_t mb) { return static_cast<uint32_t>(2 * mb + 1); }
// The tap channel's: a stage's feature-layer outputs of micro-batch mb, to the last stage.
uint32_t tap_tag(int64_t mb) { return 0x80000000u | static_cast<uint32_t>(mb); }
}  // namespace

PipelineRun::PipelineRun(Trainer& trainer, std::span<const TrainSample> batch,
                         const TokenObjective& objective, int64_t lo, int64_t hi, Communicator& pp)
    : t_(trainer), batch_(batch), objective_(objective), pp_(pp) {
  const int64_t m = hi - lo;
  const int64_t warmup = std::min<int64_t>(t_.stage_.num_stages - t_.stage_.stage - 1, m);
  for (int64_t i = 0; i < warmup; ++i) actions_.push_back({'F', lo + i});
  for (int64_t j = 0; j < m - warmup; ++j) {
    actions_.push_back({'F', lo + warmup + j});
    actions_.push_back({'B', lo + j});
  }
  for (int64_t j = m - warmup; j < m; ++j) actions_.push_back({'B', lo + j});
  plan_taps();
}

// The draft head's feature layers by the stage holding them (stages hold ascending layer ranges,
// so the stages' taps in stage order are the head's order).
void PipelineRun::plan_taps() {
  if (!t_.draft_) return;
  const PipelineStage& st = t_.stage_;
  const std::vector<int64_t>& layers = t_.draft_->head().feature_layers();
  for (const int64_t l : layers)
    if (l >= st.layer_begin && l < st.layer_end) taps_.push_back(l);
  if (!st.last()) return;
  for (int s = 0; s < st.num_stages - 1; ++s) {
    const auto [b, e] = stage_layers(t_.config_.num_layers, s, st.num_stages);
    const int64_t n = std::ranges::count_if(layers, [&](int64_t l) { return l >= b && l < e; });
    if (n > 0) tap_sources_.push_back({s, n});
  }
}

// The last stage's features of micro-batch mb, [T, layers, hidden]: each earlier stage's tapped
// rows as they come over the tap channel, then this stage's own.
Result<std::vector<float>> PipelineRun::gather_taps(int64_t mb, int64_t t, std::vector<float> own) {
  if (tap_sources_.empty()) return own;
  const int64_t d = t_.config_.hidden_size;
  const int64_t k = static_cast<int64_t>(t_.draft_->head().feature_layers().size());
  std::vector<float> all(static_cast<size_t>(t * k * d));
  int64_t at = 0;  // feature layers placed so far
  std::vector<float> part;
  const auto place = [&](const std::vector<float>& rows, int64_t n) {
    for (int64_t i = 0; i < t; ++i)
      std::copy_n(rows.data() + i * n * d, n * d, all.data() + (i * k + at) * d);
    at += n;
  };
  for (const auto& [src, n] : tap_sources_) {
    part.resize(static_cast<size_t>(t * n * d));
    MILES_RETURN_IF_ERROR(pp_.recv(part.data(), part.size() * sizeof(float), src, tap_tag(mb)));
    place(part, n);
  }
  place(own, static_cast<int64_t>(taps_.size()));
  MILES_CHECK(at == k, "pipeline taps do not cover the draft head's feature layers");
  return all;
}

PipelineRun::~PipelineRun() { (void)finish(); }

Status PipelineRun::forward(int64_t mb) {
  const PipelineStage& st = t_.stage_;
  const int64_t mbs = t_.tc_.micro_batch_size, d = t_.config_.hidden_size;
  auto f = std::make_unique<InFlight>();
  const bool replay = t_.tc_.replay_experts && t_.config_.num_moe_layers() > 0 &&
                      !batch_[mb * mbs].routed_experts.empty();
  f->packed = trainer_detail::pack(batch_, mb * mbs, mbs, replay);
  const int64_t t = f->packed.tokens.size();
  std::vector<float> input;
  ForwardOptions opt;
  f->tape = t_.take_tape();
  opt.tape = f->tape.get();
  if (st.last()) opt.logits_storage = &t_.spare_logits_;
  opt.forced_experts = f->packed.forced;
  opt.layer_begin = st.layer_begin;
  opt.layer_end = st.layer_end;
  opt.tp = t_.tp();
  // The draft head trains on the last stage; every stage taps its own feature layers.
  opt.tap_layers = taps_;
  if (st.last()) opt.logit_rows = f->packed.rows;  // the LM head on the loss rows only
  if (!st.first()) {
    input.resize(static_cast<size_t>(t * d));
    MILES_RETURN_IF_ERROR(
        pp_.recv(input.data(), input.size() * sizeof(float), st.stage - 1, forward_tag(mb)));
    opt.input_hidden = input;
  }
  auto kv = t_.model_->make_kv_cache();
  MILES_ASSIGN_OR_RETURN(ForwardOutput out,
                         t_.model_->forward(f->packed.tokens, f->packed.seqs, *kv, opt, t_.pool_));
  if (st.last()) {
    if (t_.draft_) {  // before the loss head writes d logits over the logits
      f->draft = FlatTensors(t_.draft_->layout());
      MILES_ASSIGN_OR_RETURN(const std::vector<float> features,
                             gather_taps(mb, t, std::move(out.taps)));
      MILES_RETURN_IF_ERROR(t_.draft_->micro_batch(f->packed, batch_, features, out.logits, t_.tp(),
                                                   f->draft, f->draft_sums, t_.pool_));
    }
    MILES_ASSIGN_OR_RETURN(
        trainer_detail::HeadResult head,
        trainer_detail::loss_head(f->packed, std::move(out.logits), t_.local_config_.vocab_size,
                                  t_.tc_.need_entropy, objective_, t_.tp(), t_.pool_));
    f->dlogits = std::move(head.dlogits);
    f->loss = std::move(head.loss);
  } else {
    send_buffers_.push_back(std::move(out.hidden));
    const std::vector<float>& h = send_buffers_.back();
    MILES_ASSIGN_OR_RETURN(
        auto pending, pp_.isend(h.data(), h.size() * sizeof(float), st.stage + 1, forward_tag(mb)));
    sends_.push_back(std::move(pending));
    if (!taps_.empty()) {  // the tap channel: straight to the last stage, after the activation
      send_buffers_.push_back(std::move(out.taps));
      const std::vector<float>& x = send_buffers_.back();
      MILES_ASSIGN_OR_RETURN(
          auto tap, pp_.isend(x.data(), x.size() * sizeof(float), st.num_stages - 1, tap_tag(mb)));
      sends_.push_back(std::move(tap));
    }
  }
  live_[mb] = std::move(f);
  return Status::Ok();
}

Result<Trainer::MicroResult> PipelineRun::backward(int64_t mb,
                                                   std::span<Trainer::MicroResult* const> lefts) {
  const PipelineStage& st = t_.stage_;
  auto it = live_.find(mb);
  MILES_CHECK(it != live_.end(), "pipeline backward before its forward");
  std::unique_ptr<InFlight> f = std::move(it->second);
  live_.erase(it);
  const int64_t t = f->packed.tokens.size(), d = t_.config_.hidden_size;
  std::vector<float> d_out;
  if (st.last()) {
    d_out = std::move(f->dlogits);
  } else {
    d_out.resize(static_cast<size_t>(t * d));
    MILES_RETURN_IF_ERROR(
        pp_.recv(d_out.data(), d_out.size() * sizeof(float), st.stage + 1, backward_tag(mb)));
  }
  Trainer::MicroResult r = t_.empty_result();
  std::vector<float> d_in;
  BackwardIo io;
  if (!st.first()) io.d_input = &d_in;
  io.tp = t_.tp();
  // Every stage hands its tied share over (zeros off the last stage) so that the backward folds
  // it with the rest.
  io.tied_head_grad = r.tied_head;
  fold_targets(lefts, io.fold, io.tied_fold);
  if (st.last()) {
    r.loss = f->loss.loss;
    r.tokens = f->packed.rows.size();
    r.sums = std::move(f->loss.sums);
    for (const auto& [k, v] : f->draft_sums) r.sums[k] += v;
    if (t_.draft_) std::swap(r.draft, f->draft);
  } else if (t_.draft_) {
    r.draft.zero();  // the head trains on the last stage
  }
  MILES_RETURN_IF_ERROR(t_.model_->backward(*f->tape, d_out, r.grads, t_.pool_, io));
  t_.recycle(std::move(f->tape));
  if (st.last()) t_.spare_logits_ = std::move(d_out);
  r.folded = !lefts.empty();
  if (!st.first()) {
    send_buffers_.push_back(std::move(d_in));
    const std::vector<float>& g = send_buffers_.back();
    MILES_ASSIGN_OR_RETURN(auto pending, pp_.isend(g.data(), g.size() * sizeof(float), st.stage - 1,
                                                   backward_tag(mb)));
    sends_.push_back(std::move(pending));
  }
  return r;
}

Result<Trainer::MicroResult> PipelineRun::next(std::span<Trainer::MicroResult* const> lefts) {
  while (cursor_ < actions_.size()) {
    const auto [kind, mb] = actions_[cursor_++];
    if (kind == 'F') {
      MILES_RETURN_IF_ERROR(forward(mb));
    } else {
      return backward(mb, lefts);
    }
  }
  return Status::Error("pipeline schedule: no backward left");
}

Status PipelineRun::finish() {
  Status first;
  for (auto& s : sends_) {
    Status st = s->wait();
    if (first.ok() && !st.ok()) first = st;
  }
  sends_.clear();
  send_buffers_.clear();
  return first;
}

}  // namespace miles
