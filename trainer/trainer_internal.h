// Pieces shared by Trainer::step and the pipeline schedule: a micro-batch's result, packing samples
// for the model, and the halving tree over micro-batch index.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "miles/comm.h"
#include "miles/trainer/trainer.h"

namespace miles {

struct Trainer::MicroResult {
  FlatTensors grads;
  std::vector<float> tied_head;  // (vocab, hidden) the tied LM head's share of the embedding grad
  double loss = 0;
  int64_t tokens = 0;
  std::map<std::string, double> sums;
  FlatTensors draft;  // the co-trained draft head's gradients (TrainerConfig::draft), or empty
  // A leaf whose backward stored its gradients (and tied share) folded into the pending partial
  // sums it was given (tree_sum below): these buffers are scratch, the scalars still this leaf's.
  bool folded = false;
};

namespace trainer_detail {

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

Packed pack(std::span<const TrainSample> batch, int64_t first, int64_t count, bool replay);

// Σ leaf(i) for i in [lo, hi) by the halving tree (kernels.h's shape), leaves evaluated in
// ascending order and merged as soon as they are computed (post-order): a + b adds gradients, tied
// shares, losses and metric sums, a the left operand. leaf(i, lefts) is given the pending left
// operands of the merges that follow it (innermost first) and may fold its gradients into
// lefts.back() itself as its backward stores them (MicroResult::folded, include/miles/grad_sink.h: the same
// additions in the same order); otherwise the tree adds them, element-wise across the pool.
// Consumed buffers go to `recycle` (when set) so that they serve a later micro-batch.
using Leaf =
    std::function<Result<Trainer::MicroResult>(int64_t, std::span<Trainer::MicroResult* const>)>;
using Recycle = std::function<void(Trainer::MicroResult&&)>;
Result<Trainer::MicroResult> tree_sum(int64_t lo, int64_t hi, const Leaf& leaf, ThreadPool* pool,
                                      const Recycle& recycle);
// The fold a leaf's backward takes: every left's gradient buffer and tied share, innermost first.
void fold_targets(std::span<Trainer::MicroResult* const> lefts, std::vector<FlatTensors*>& grads,
                  std::vector<std::span<float>>& tied);

// The last stage's loss head: response-row logits → logp / entropy → objective → d logits of the
// logits' rows. The logits hold either the response rows only ([rows.size(), vocab], in order:
// the forward's logit_rows = p.rows, what a trainer asks for) or every token's ([T, vocab]; then
// d logits is zero off the response rows). Rows run in parallel on the pool. The logits are
// consumed: d logits is written over them (each row read whole before it is written), so a step
// allocates no second logits buffer.
struct HeadResult {
  TokenLoss loss;
  std::vector<float> dlogits;
};
// With tensor parallelism the logits are this rank's vocabulary columns (vocab = local size).
Result<HeadResult> loss_head(const Packed& p, std::vector<float>&& logits, int64_t vocab,
                             bool need_entropy, const TokenObjective& objective,
                             const TensorParallel* tp, ThreadPool* pool);

}  // namespace trainer_detail

// The 1F1B schedule of one pipeline stage over micro-batches [lo, hi) (picotron's three phases:
// warm-up forwards, steady one-forward-one-backward, cool-down backwards). next() runs the schedule
// until the next micro-batch's backward is done and returns its gradients, so micro-batches reach
// the tree in ascending order as in a single process. Activations go forward and gradients back
// with non-blocking sends and blocking receives (tags 2i and 2i + 1), which cannot deadlock.
// The draft head's tap channel runs beside the schedule: a stage holding some of the head's
// feature layers sends their outputs of micro-batch i straight to the last stage (tag 2³¹ + i,
// non-blocking, after the activation), which receives them in its forward of i, before the head
// trains: no stage between them carries or waits for them.
class PipelineRun {
 public:
  PipelineRun(Trainer& trainer, std::span<const TrainSample> batch, const TokenObjective& objective,
              int64_t lo, int64_t hi, Communicator& pp);
  ~PipelineRun();
  // lefts: as tree_sum's leaves get them (the backward folds into them).
  Result<Trainer::MicroResult> next(std::span<Trainer::MicroResult* const> lefts);
  Status finish();  // waits for the sends still in flight

 private:
  struct InFlight;
  Status forward(int64_t mb);
  void plan_taps();
  Result<std::vector<float>> gather_taps(int64_t mb, int64_t t, std::vector<float> own);
  Result<Trainer::MicroResult> backward(int64_t mb, std::span<Trainer::MicroResult* const> lefts);

  Trainer& t_;
  std::span<const TrainSample> batch_;
  const TokenObjective& objective_;
  Communicator& pp_;
  std::vector<std::pair<char, int64_t>> actions_;  // ('F' | 'B', micro-batch)
  size_t cursor_ = 0;
  std::map<int64_t, std::unique_ptr<InFlight>> live_;
  std::vector<std::unique_ptr<PendingSend>> sends_;
  std::vector<std::vector<float>> send_buffers_;
  std::vector<int64_t> taps_;  // the draft head's feature layers this stage holds
  std::vector<std::pair<int, int64_t>> tap_sources_;  // last stage: (earlier stage, its taps)
};

}  // namespace miles
