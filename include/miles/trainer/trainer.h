// Trainer: one optimizer step of the shared model over a batch of samples, for SFT and RL alike.
//
// Why: the learner consumes exactly the token ids the rollout produced (TITO), replays their routed
// experts (R3), and must compute the same logprobs as the engine. A step splits the batch into
// micro-batches of a fixed number of samples, runs forward + backward per micro-batch, sums the
// micro-batch gradients by the halving tree over micro-batch index (so a data-parallel split into a
// power-of-two number of equal blocks reproduces the single-process sum bit for bit), clips, and
// applies AdamW. The loss is a function of the response tokens' logprobs and entropies
// (TokenObjective), so SFT, GRPO, PPO or GSPO only differ in that function.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "miles/device_model.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/trainer/optimizer.h"
#include "miles/status.h"

namespace miles {

class ThreadPool;
class Communicator;

// One training sample (docs/contracts.md §2): prompt + response token ids exactly as generated.
struct TrainSample {
  std::vector<int32_t> tokens;          // (T)
  int64_t response_length = 0;          // R: tokens [T − R, T) are scored; 1 <= R <= T − 1
  std::vector<float> loss_mask;         // (R) 1 on policy tokens, 0 on prompt / tool / env tokens
  std::vector<int32_t> routed_experts;  // (T − 1, moe_layers, top_k) rollout routing, or empty
};

// What an objective sees of one micro-batch: its samples' response tokens, concatenated.
struct TokenView {
  std::span<const int64_t> samples;  // (S) indices into the step's batch
  std::span<const int64_t> offsets;  // (S + 1) sample s owns tokens [offsets[s], offsets[s + 1])
  std::span<const float> logp;       // log p(token) under the current weights
  std::span<const float> entropy;    // entropy of the predicting distribution (when asked)
};

struct TokenLoss {
  double loss = 0;                     // this micro-batch's share of the step's loss
  std::vector<float> dlogp;            // (tokens) d loss / d logp
  std::vector<float> dentropy;         // (tokens) d loss / d entropy, or empty
  std::map<std::string, double> sums;  // metric sums, added over micro-batches and ranks
};

using TokenObjective = std::function<Result<TokenLoss>(const TokenView&)>;

// The speculative draft head co-trained with the policy (draft_head.h, docs/speculative.md): every
// step it is fitted to the policy's distribution on the step's samples (soft cross-entropy to the
// policy's detached logits of the forward the step already runs, each response token's loss mask
// as its weight) and updated by its own AdamW (the policy's betas and eps, no weight decay, no
// clipping). Its sums go into StepResult::sums as draft_loss / draft_rows / draft_agree /
// draft_accept / draft_in_vocab (each Σ weight × value).
struct DraftTrainConfig {
  bool enabled = false;
  double lr = 1e-4;
  // The draft vocabulary: the ids most frequent in every sample trained on so far (ties: smaller
  // id), fixed for a step.
  int64_t vocab_size = 4096;
  // The policy layers whose outputs the head reads (DraftHead::feature_layers_for: empty, the last
  // layer; several, EAGLE-3's features). Under a pipeline each stage sends the outputs of its own
  // feature layers straight to the last stage, outside the 1F1B schedule (PipelineRun).
  std::vector<int64_t> feature_layers;
  // Training passes (DraftHead::accumulate_grad: > 1, EAGLE-3's training-time test); pass p's sums
  // go into StepResult::sums as draft_loss_<p> / draft_rows_<p> / … .
  int64_t passes = 1;
  Status validate() const;
};

// The draft head's training state, as a checkpoint holds it: its trained tensors
// (DraftHead::layout_for), their AdamW moments and step count, and the running id counts that
// choose its vocabulary (policy vocab entries). The frozen parts are the policy's.
struct DraftTrainState {
  FlatTensors params, exp_avg, exp_avg_sq;
  int64_t steps = 0;
  std::vector<uint64_t> counts;
};

struct TrainerConfig {
  AdamWConfig optimizer;
  LrSchedule lr;
  int64_t micro_batch_size = 1;  // samples per micro-batch
  bool need_entropy = false;     // compute entropies (entropy bonus / metrics)
  bool replay_experts = true;    // R3: use the samples' routed_experts when present
  // Where forward and backward run: cpu (the CPU Model) or a device (device_model.h: cuda, or
  // emulated), with the CPU's bits either way. The loss head, gradient sums, clipping and AdamW
  // stay on the host. A device trainer is one process per rank (data parallelism only).
  Device device = Device::kCpu;
  DraftTrainConfig draft;  // CPU trainers (any dp / pp / tp layout) and device trainers
  Status validate() const;
};

struct StepResult {
  int64_t step = 0;  // optimizer steps done after this one
  double loss = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t tokens = 0;  // response tokens in the batch
  std::map<std::string, double> sums;
};

// The experts the trainer's forward used, per sample and MoE layer, for R3 agreement checks.
struct ScoredSample {
  std::vector<float> logp;       // (R)
  std::vector<float> entropy;    // (R) when asked
  std::vector<int32_t> experts;  // (T − 1, moe_layers, top_k) for MoE models
};

// The process groups of a parallel trainer rank (comm.h); null members mean size 1.
struct TrainerComms {
  Communicator* dp = nullptr;  // same stage, other data shards: gradients summed in tree order
  Communicator* pp = nullptr;  // same data shard, other stages: activations and gradients flow
};

// This rank's pipeline stage: a contiguous range of layers (stage 0 also owns the embedding, the
// last stage the final norm and LM head, both the embedding when it is tied to the head).
struct PipelineStage {
  int stage = 0;
  int num_stages = 1;
  int64_t layer_begin = 0, layer_end = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
};

// Layers [begin, end) of pipeline stage `stage` of `num_stages`: as even as possible, earlier
// stages taking the remainder.
std::pair<int64_t, int64_t> stage_layers(int64_t num_layers, int stage, int num_stages);

namespace trainer_detail {
struct Packed;
class DraftTrainer;
}  // namespace trainer_detail
class DraftHead;

class Trainer {
 public:
  // Starts from `weights` (HF names; copied into float32 master weights).
  static Result<std::unique_ptr<Trainer>> create(const ModelConfig& config,
                                                 const TensorMap& weights, const TrainerConfig& tc,
                                                 ThreadPool* pool);
  ~Trainer();

  // Makes this trainer stage `stage` of `num_stages` (layers split as evenly as possible, earlier
  // stages taking the remainder). It then computes and updates only the tensors it owns.
  Status set_pipeline_stage(int stage, int num_stages);
  const PipelineStage& stage() const { return stage_; }
  // Whether this stage computes and updates the tensor (layout order).
  bool owns(size_t tensor_index) const { return owned_[tensor_index]; }

  // One optimizer step over `batch` (its size a multiple of micro_batch_size). With comms.dp this
  // rank computes its contiguous block of micro-batches and gradients are summed over the group in
  // tree order; with comms.pp the micro-batches flow through the stages in a 1F1B schedule. Every
  // layout gives the single-process loss, grad norm and weights bit for bit when the data-parallel
  // size is a power of two dividing the micro-batch count (the tree's subtrees line up).
  Result<StepResult> step(std::span<const TrainSample> batch, const TokenObjective& objective,
                          const TrainerComms& comms = {});
  // Log-probs (and entropies, experts) of each sample's response under the current weights, no
  // gradient. replay: use the samples' routed experts. Single-stage trainers only.
  Result<std::vector<ScoredSample>> score(std::span<const TrainSample> batch, bool replay);
  // Tensor parallelism: keeps only this rank's shard of every tensor (tensor_parallel.h: heads, MLP
  // columns and vocabulary rows split over `tp`); weights and optimizer state are sliced from the
  // full ones, so call it after create() and any checkpoint load. The group must outlive the
  // trainer.
  Status shard_for_tensor_parallel(Communicator& tp);
  // The full trainer state assembled from the shards of every rank of `tp` (for checkpoints and
  // exports). Call on every rank of the group.
  Result<std::unique_ptr<Trainer>> gather_tensor_parallel(Communicator& tp) const;

  // Pipeline stages hold current values only for the tensors they own; this broadcasts every
  // tensor (weights and optimizer moments) from its owner so that every stage has all of them
  // (before a checkpoint or an export). Call on every stage.
  Status gather_pipeline_state(Communicator& pp);

  const ModelConfig& model_config() const { return config_; }
  const TrainerConfig& config() const { return tc_; }
  const FlatTensors& params() const { return params_; }
  FlatTensors& mutable_params() { return params_; }
  AdamW& optimizer() { return *opt_; }
  const AdamW& optimizer() const { return *opt_; }
  int64_t steps_done() const { return opt_->steps(); }
  // The current weights as a Model (rebuilt after every step); a CPU trainer's only.
  const Model& model() const {
    MILES_CHECK(model_ != nullptr, "a device trainer's model lives on its device");
    return *model_;
  }
  // Replaces the weights (checkpoint resume) and rebuilds the model.
  Status reload_model();
  // The co-trained draft head (TrainerConfig::draft), its frozen parts the current policy's; null
  // when not enabled.
  const DraftHead* draft() const;
  // A copy of the draft head's training state (an error without one). Under a pipeline every stage
  // holds the last stage's after gather_pipeline_state.
  Result<DraftTrainState> draft_state() const;
  // Takes a saved state (checkpoint resume, after the policy's weights): the layout and the
  // vocabulary size must match this trainer's head.
  Status restore_draft(const DraftTrainState& state);

  struct MicroResult;  // one micro-batch's (or a subtree's) gradients, loss and metric sums

 private:
  friend class PipelineRun;
  Trainer();
  Status check_batch(std::span<const TrainSample> batch) const;
  // lefts: the pending partial sums this micro-batch is folded into (trainer_internal.h tree_sum).
  Result<MicroResult> micro_step(std::span<const TrainSample> batch, int64_t first, int64_t count,
                                 const TokenObjective& objective,
                                 std::span<MicroResult* const> lefts);
  Result<MicroResult> device_micro_step(const trainer_detail::Packed& p,
                                        std::span<const TrainSample> batch,
                                        const TokenObjective& objective);
  MicroResult empty_result();     // gradient buffers, reused from spare_* when possible
  void recycle(MicroResult&& r);  // keeps r's buffers for a later micro-batch
  // A forward tape whose activation buffers are reused (no fresh pages per micro-batch).
  std::unique_ptr<ForwardTape> take_tape();
  void recycle(std::unique_ptr<ForwardTape> tape);
  Status reduce_across_stages(MicroResult& acc, Communicator* pp);
  Status finish_draft_step(MicroResult& acc, Communicator* pp);
  double owned_grad_norm(const MicroResult& acc, Communicator* pp);

  const TensorParallel* tp() const { return tp_.comm ? &tp_ : nullptr; }

  ModelConfig config_;        // the whole model
  ModelConfig local_config_;  // this rank's shard (== config_ without tensor parallelism)
  TensorParallel tp_;
  std::shared_ptr<const ParamLayout> full_layout_;
  TrainerConfig tc_;
  ThreadPool* pool_ = nullptr;
  std::shared_ptr<const ParamLayout> layout_;
  FlatTensors params_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<Model> model_;                     // cpu
  std::unique_ptr<DeviceModel> device_model_;        // any other TrainerConfig::device
  std::shared_ptr<const ParamLayout> model_layout_;  // layout_ when model_ was built
  PipelineStage stage_;
  std::vector<bool> owned_;                     // (tensors) this stage computes and updates them
  std::unique_ptr<trainer_detail::DraftTrainer> draft_;  // TrainerConfig::draft
  std::vector<FlatTensors> spare_grads_;        // consumed micro-batch gradient buffers
  std::vector<FlatTensors> spare_draft_;        // and their draft gradients
  std::vector<std::vector<float>> spare_tied_;  // and their tied-head shares
  std::vector<std::unique_ptr<ForwardTape>> spare_tapes_;  // tapes of finished backwards
  std::vector<float> spare_logits_;  // a finished backward's d logits: the next forward's logits
};

// SFT: token-mean negative log-likelihood over the step's loss-masked tokens, `total_tokens` of
// them in the whole step (all micro-batches and data-parallel ranks).
TokenObjective sft_objective(std::span<const TrainSample> batch, double total_tokens);

}  // namespace miles
