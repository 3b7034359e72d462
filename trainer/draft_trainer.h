// DraftTrainer: the trainer's side of the co-trained draft head (DraftTrainConfig in trainer.h).
// Each micro-batch's draft gradients ride in the micro-batch's result, so the halving tree over
// micro-batches and the data-parallel sum add them as they add the policy's: any layout that
// reproduces the policy's step reproduces the draft's.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "miles/comm.h"
#include "miles/draft_head.h"
#include "miles/trainer/optimizer.h"
#include "miles/trainer/trainer.h"

namespace miles::trainer_detail {

struct Packed;

class DraftTrainer {
 public:
  static Result<std::unique_ptr<DraftTrainer>> create(const ModelConfig& policy,
                                                      const TensorMap& policy_weights,
                                                      const DraftTrainConfig& config,
                                                      const AdamWConfig& policy_optimizer);
  // Before a step's micro-batches: counts the batch's ids into the running counts, takes the
  // step's vocabulary from them and the loss scale (1 / the batch's Σ loss mask).
  Status begin_step(std::span<const TrainSample> batch);
  // One micro-batch after the policy's forward (features: the outputs of the head's feature layers,
  // [T, layers, hidden]; logits: every loss row's): the draft's gradients into `grads`
  // (overwritten), its sums added into `sums`.
  // Under tensor parallelism (`tp`) the logits are this rank's vocabulary slice: the rows are
  // gathered whole, so every rank of the group trains the same head on the same numbers.
  Status micro_batch(const Packed& p, std::span<const TrainSample> batch,
                     std::span<const float> features, std::span<const float> logits,
                     const TensorParallel* tp, FlatTensors& grads,
                     std::map<std::string, double>& sums, ThreadPool* pool);
  // After the sum over micro-batches and ranks: AdamW on the draft, then the updated policy's
  // frozen parts.
  Status finish_step(const FlatTensors& grads, const TensorMap& policy, ThreadPool* pool);
  // Pipeline stages: every rank of `group` takes `root`'s head (its trained tensors; the
  // vocabulary is every stage's own, the same).
  Status share(Communicator& group, int root);
  // The whole training state (trained tensors, moments, step count) of `root` to every rank of
  // `group`: before a checkpoint under a pipeline, where only the last stage runs AdamW.
  Status share_state(Communicator& group, int root);
  DraftTrainState state() const;
  Status restore(const DraftTrainState& state, const TensorMap& policy);

  const std::shared_ptr<const ParamLayout>& layout() const { return params_.layout_ptr(); }
  const DraftHead& head() const { return *head_; }

 private:
  DraftTrainConfig config_;
  std::unique_ptr<DraftHead> head_;
  FlatTensors params_;
  std::unique_ptr<AdamW> opt_;
  std::vector<uint64_t> counts_;  // (policy vocab) ids in every sample trained on
  double scale_ = 0;
};

}  // namespace miles::trainer_detail
