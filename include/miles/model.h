// Model: the one implementation of Llama, Qwen3 and Qwen3-MoE that rollout and trainer share.
//
// Why: true on-policy RL needs the engine and the learner to compute the same bits. Both call this
// forward over a packed batch of variable-length sequences; every kernel underneath is
// batch-invariant (kernels.h), so a sequence's logits do not depend on what else is in the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/kv_cache.h"
#include "miles/model_config.h"
#include "miles/status.h"

namespace miles {

class ThreadPool;
class FlatTensors;
class Communicator;

// Tensor parallelism of a Model built from one rank's shard (a local config with heads, KV heads,
// intermediate sizes and vocabulary divided by the group size): attention heads and MLP columns are
// split, the embedding and LM head are vocabulary-parallel. The forward all-reduces (tree order)
// the row-parallel outputs (o_proj, down_proj, MoE) and the embedding; logits stay local
// ([rows, vocab / size], vocabulary rows [vocab_begin, vocab_begin + vocab / size)).
struct TensorParallel {
  Communicator* comm = nullptr;
  int64_t vocab_begin = 0;
  int64_t full_vocab = 0;  // token ids are checked against it
};
struct ModelWeights;
struct BackwardWeights;

// The activations a training forward keeps (ForwardOptions::tape) for Model::backward. Opaque.
class ForwardTape {
 public:
  ForwardTape();
  ~ForwardTape();
  ForwardTape(const ForwardTape&) = delete;
  ForwardTape& operator=(const ForwardTape&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// One sequence's slice of a packed batch: tokens [offset, offset + n_tokens) of the batch sit at
// positions start_pos .. start_pos + n_tokens - 1 of KV slot kv_slot (earlier positions are already
// in the cache).
struct SeqSpan {
  int32_t kv_slot = 0;
  int64_t start_pos = 0;
  int64_t n_tokens = 0;
};

struct ForwardOptions {
  // true: logits for every token; false: only for the last token of each sequence, or with
  // last_rows (one count per sequence, 1 <= count <= n_tokens) its last last_rows[s] tokens (a
  // speculative verify chunk's rows), in batch order.
  bool all_logits = true;
  std::span<const int64_t> last_rows;
  // Logits for these token rows only (ascending batch indices), in this order; when non-empty it
  // replaces all_logits / last_rows. A training forward (tape) may ask for them: a policy loss
  // reads only the response rows, and the LM head over the prompt rows is most of its cost on long
  // prompts. Backward then takes d logits of these rows (the others get no gradient through the
  // head, as if theirs were zero). Each row's logits are the bits every other choice gives it; the
  // head's weight gradient sums only these rows (its chunks of kWeightGradChunk are of these rows).
  std::span<const int64_t> logit_rows;
  // Record the top-k expert ids (and their gate weights) of every token and MoE layer.
  bool return_experts = false;
  // Routing replay: use these expert ids ([T, num_moe_layers, top_k]) instead of the router's
  // top-k; gate weights still come from the router's probabilities at those ids.
  std::span<const int32_t> forced_experts;
  // Pipeline stages: run layers [layer_begin, layer_end) only (layer_end < 0: through the last
  // layer). layer_begin > 0: input_hidden ([T, hidden], the previous stage's output) replaces the
  // embedding of `tokens` (still given: they define the batch); layer_end < num_layers: the result
  // is ForwardOutput::hidden and there are no logits. At layer_begin 0 a non-empty input_hidden
  // replaces the embedding too (a draft head's fused inputs, draft_head.h).
  int64_t layer_begin = 0;
  int64_t layer_end = -1;
  std::span<const float> input_hidden;
  // Also return every token's last hidden state before the final norm in ForwardOutput::hidden
  // ([T, hidden]; what a draft head reads).
  bool return_hidden = false;
  // Also return the outputs of these layers (ascending, distinct, inside [layer_begin, layer_end):
  // layer l's output is the residual stream after it; the last layer's is return_hidden's) in
  // ForwardOutput::taps ([T, taps, hidden], every token's row of each layer in this order; the
  // co-trained draft head's multi-layer features).
  std::span<const int64_t> tap_layers;
  // Tensor parallelism (this model holds one rank's shard), or null.
  const TensorParallel* tp = nullptr;
  // Training: keep the activations backward needs here. Needs all_logits and sequences that start
  // at position 0 (whole sequences, no cached prefix).
  ForwardTape* tape = nullptr;
  // A draft head's training-time test (draft_head.h): the tapes of p − 1 earlier passes over the
  // same batch (tokens and sequences), oldest first, which the caller keeps alive until this
  // forward's backward has run. This forward is then pass p: in every layer row i of a sequence
  // attends pass 1's rows 0 .. i − p + 1, pass q's row i − p + q (1 < q < p) and itself (the keys
  // a draft p tokens ahead sees in the engine). Their keys' and values' gradients reach them
  // through BackwardIo::earlier_passes. Needs a tape; not for MLA layers; the KV store is not
  // written.
  std::span<const ForwardTape* const> earlier_passes;
  // Storage for the logits, taken over (moved into ForwardOutput::logits): a trainer hands back
  // the last micro-batch's buffer so that tens of MB of fresh pages are not faulted in every time.
  std::vector<float>* logits_storage = nullptr;
};

// ForwardOptions::last_rows against the batch: empty, or one count per sequence in
// [1, n_tokens]; the error names the sequence.
Status check_last_rows(std::span<const SeqSpan> seqs, std::span<const int64_t> last_rows);
// ForwardOptions::tap_layers against a forward of layers [begin, end): ascending, distinct, inside;
// the error names the layer.
Status check_tap_layers(std::span<const int64_t> taps, int64_t begin, int64_t end);

struct ForwardOutput {
  int64_t rows = 0;  // T, or the number of sequences
  int64_t vocab = 0;
  std::vector<float> logits;          // [rows, vocab]
  std::vector<int32_t> experts;       // [T, num_moe_layers, top_k] when asked
  std::vector<float> expert_weights;  // [T, num_moe_layers, top_k] when asked
  std::vector<float> hidden;          // [T, hidden] when the forward stops before the head,
                                      // or with return_hidden
  std::vector<float> taps;            // [T, tap_layers, hidden] with tap_layers
};

// Extra inputs and outputs of a pipeline stage's or a tied model's backward.
struct BackwardIo {
  // Forwards given input_hidden: receives d loss / d input_hidden ([T, hidden]); the embedding
  // gets no gradient from this forward.
  std::vector<float>* d_input = nullptr;
  // Tied embeddings: the LM head's share of the embedding gradient ([vocab, hidden]) goes here
  // instead of being added into grads (the trainer sums the two shares in a fixed order).
  std::span<float> tied_head_grad;
  // The forward's tensor parallelism: column-parallel input gradients are all-reduced.
  const TensorParallel* tp = nullptr;
  // The trainer's micro-batch sum fused into the backward (include/miles/grad_sink.h): with `fold`
  // (the pending partial sums, innermost first; grads' layout), every gradient g is stored as
  // fold.back() + (… + (fold[0] + g)) into fold.back(), `grads` serving as scratch; the tied
  // head's share likewise against `tied_fold` (needs tied_head_grad, which is then scratch).
  std::vector<FlatTensors*> fold;
  std::vector<std::span<float>> tied_fold;
  // d loss / d ForwardOutput::hidden ([T, hidden], a forward with return_hidden through the last
  // layer), added to the final norm's d input: a later use of the hidden states (a draft head's
  // next training-time-test pass reads them as its features).
  std::span<const float> d_hidden;
  // A training-time-test pass's backward (ForwardOptions::earlier_passes): the same tapes, oldest
  // first. Each layer's d key and d value of their rows that this pass attended are added into
  // those tapes, and each tape's own backward adds what it was sent to its keys' and values'
  // gradients, so the passes' backwards run last pass first. Empty: the earlier keys are constants.
  std::span<ForwardTape* const> earlier_passes;
};

// A checkpoint's config and weights: an HF directory (config.json + safetensors) or a llama2.c
// file.
struct ModelFiles {
  ModelConfig config;
  TensorMap weights;
};
Result<ModelFiles> load_model_files(const std::string& path);

class Model {
 public:
  ~Model();
  // Builds from named weights (HF naming), checking every tensor's presence and shape.
  static Result<std::unique_ptr<Model>> from_weights(const ModelConfig& config,
                                                     const TensorMap& weights);
  // PATH: an HF directory (config.json + safetensors) or a llama2.c checkpoint file.
  static Result<std::unique_ptr<Model>> load(const std::string& path);

  // Replaces every weight with the same-named, same-shaped tensor of `weights`, reusing this
  // model's buffers (and its transposed backward packs, if built): the trainer's per-step update
  // allocates nothing large. Not while another thread uses the model. On an error the model must
  // not be used.
  Status reload_weights(const TensorMap& weights, ThreadPool* pool = nullptr);

  const ModelConfig& config() const { return config_; }
  // A KV store sized for this model.
  std::unique_ptr<SimpleKvCache> make_kv_cache(int64_t block_tokens = 16) const;

  // Runs the packed batch `tokens` split into `seqs` (in order), writing their keys/values into
  // `kv`.
  Result<ForwardOutput> forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                KvStore& kv, const ForwardOptions& options, ThreadPool* pool) const;

  // Gradients of a scalar loss with respect to every parameter, from the tape of a forward and
  // d loss / d output: d logits ([T, vocab]), or d hidden ([T, hidden]) when the forward stopped
  // before the head. `grads` must have this model's layout (ParamLayout::for_model); every tensor
  // in it is overwritten (those of layers outside the tape's range with zeros).
  Status backward(const ForwardTape& tape, std::span<const float> d_output, FlatTensors& grads,
                  ThreadPool* pool, const BackwardIo& io = {}) const;

 private:
  Model() = default;
  Status check_batch(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                     const ForwardOptions& options) const;
  const BackwardWeights& backward_weights(ThreadPool* pool = nullptr) const;
  ModelConfig config_;
  std::unique_ptr<ModelWeights> w_;
  mutable std::once_flag backward_once_;
  mutable std::unique_ptr<BackwardWeights> bw_;  // transposed packs, built on first backward
};

}  // namespace miles
