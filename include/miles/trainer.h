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

#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/optimizer.h"
#include "miles/status.h"

namespace miles {

class ThreadPool;
class Communicator;

// One training sample (contracts.md §2): prompt + response token ids exactly as generated.
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

struct TrainerConfig {
  AdamWConfig optimizer;
  LrSchedule lr;
  int64_t micro_batch_size = 1;  // samples per micro-batch
  bool need_entropy = false;     // compute entropies (entropy bonus / metrics)
  bool replay_experts = true;    // R3: use the samples' routed_experts when present
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

class Trainer {
 public:
  // Starts from `weights` (HF names; copied into float32 master weights).
  static Result<std::unique_ptr<Trainer>> create(const ModelConfig& config,
                                                 const TensorMap& weights, const TrainerConfig& tc,
                                                 ThreadPool* pool);
  ~Trainer();

  // One optimizer step over `batch` (its size a multiple of micro_batch_size). `dp` (optional) is
  // the data-parallel group: this rank computes its contiguous block of micro-batches and the
  // gradients are summed across the group in tree order.
  Result<StepResult> step(std::span<const TrainSample> batch, const TokenObjective& objective,
                          Communicator* dp = nullptr);
  // Log-probs (and entropies, experts) of each sample's response under the current weights, no
  // gradient. replay: use the samples' routed experts.
  Result<std::vector<ScoredSample>> score(std::span<const TrainSample> batch, bool replay);

  const ModelConfig& model_config() const { return config_; }
  const TrainerConfig& config() const { return tc_; }
  const FlatTensors& params() const { return params_; }
  FlatTensors& mutable_params() { return params_; }
  AdamW& optimizer() { return *opt_; }
  const AdamW& optimizer() const { return *opt_; }
  int64_t steps_done() const { return opt_->steps(); }
  // The current weights as a Model (rebuilt after every step).
  const Model& model() const { return *model_; }
  // Replaces the weights (checkpoint resume) and rebuilds the model.
  Status reload_model();

 private:
  Trainer() = default;
  Status check_batch(std::span<const TrainSample> batch) const;
  struct MicroResult;
  Result<MicroResult> micro_step(std::span<const TrainSample> batch, int64_t first, int64_t count,
                                 const TokenObjective& objective);
  Result<MicroResult> accumulate(std::span<const TrainSample> batch, int64_t lo, int64_t hi,
                                 const TokenObjective& objective);

  ModelConfig config_;
  TrainerConfig tc_;
  ThreadPool* pool_ = nullptr;
  std::shared_ptr<const ParamLayout> layout_;
  FlatTensors params_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<Model> model_;
};

// SFT: token-mean negative log-likelihood over the step's loss-masked tokens, `total_tokens` of
// them in the whole step (all micro-batches and data-parallel ranks).
TokenObjective sft_objective(std::span<const TrainSample> batch, double total_tokens);

}  // namespace miles
