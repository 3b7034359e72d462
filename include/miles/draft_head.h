// DraftHead: the co-trained EAGLE-style draft of speculative rollouts (docs/speculative.md).
//
// Why: a model-free drafter only repeats text it has seen; at temperature 1 a verify step accepts
// a draft token with the policy's probability of it, so the draft that pays is the one that knows
// the policy's distribution. This head is small (one decoder layer and a slice of the LM head) and
// reads what the policy's forward already computed, so the trainer can fit it to the policy every
// step and the engine can run it k times per verify for a few percent of a policy forward.
//
// Row j of a sequence x_0 .. x_{T-1} reads f_j, the policy's last hidden state at position j
// (before its final norm), and the embedding of x_{j+1}:
//   u_j = fc · [embed(x_{j+1}); norm(f_j)]                 (fc: [hidden, 2·hidden], trained;
//                                                            norm: the policy's final RMSNorm)
//   g_j = layer(u_0 .. u_j)                                 (one decoder layer of the policy's
//                                                            family at position j, trained)
//   logits_j = lm_head[vocab] · final_norm(g_j)            (the policy's norm and head rows)
// logits_j is the draft of x_{j+2} over the draft vocabulary (ids `vocab`, the policy's most
// frequent); g_j stands in for f_{j+1} when the engine drafts further ahead. The policy's
// embedding, final norm and head are frozen copies (set_policy); the trained tensors are
// "draft.fc.weight" and "draft.layers.0.*" (the policy family's layer names), published with the
// policy's weights.
//
// Features of several layers (EAGLE-3): with feature layers l_1 < … < l_k (k > 1; the default is
// the last layer alone, as above), f_j is the outputs of those layers at position j, each
// normalised as the policy's next step reads it (layer l + 1's input norm; the last layer's: the
// final norm), and a trained projection "draft.feature_fc.weight" ([hidden, k·hidden], started
// as [0 … 0 | I]: the last listed layer alone) makes the one feature fc reads:
//   u_j = fc · [embed(x_{j+1}); P · [norm_1(f¹_j); …; norm_k(fᵏ_j)]]
// Drafting further ahead, g stands in for that feature through the final norm, as above.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/flat_params.h"
#include "miles/kernels.h"
#include "miles/model.h"
#include "miles/model_config.h"
#include "miles/status.h"

namespace miles {

class ThreadPool;

// One packed batch of whole sequences for training, as the policy's training forward saw it.
struct DraftTrainRows {
  std::span<const int32_t> tokens;  // (T) the policy batch's ids
  std::span<const SeqSpan> seqs;    // whole sequences (start_pos 0); one-token ones add nothing
  // (T, feature layers, hidden) the outputs of the head's feature layers (the last layer's: the
  // policy's hidden states before its final norm)
  std::span<const float> features;
  std::span<const float> logits;    // (T, policy vocab) the policy's logits (detached)
  // (T) weight of the prediction of token i + 1 made at row i − 1 of the draft (i.e. the loss on
  // the draft of token i + 1 reads the policy's row i); the first row of each sequence is unused.
  std::span<const float> weight;
  // Optional (T): the row of `logits` that holds token row i's, −1 where it has none (its weight
  // must then be 0). Empty: `logits` holds every token row. A trainer that computed logits only
  // for its loss rows passes those rows and this map instead of spreading them out.
  std::span<const int64_t> logit_row = {};
};

// Sums over the rows trained on (each times its weight), for metrics.
struct DraftTrainSums {
  double loss = 0;    // soft cross-entropy to the policy's distribution over the draft vocabulary
  double rows = 0;    // weights
  double agree = 0;   // draft argmax == policy argmax (a greedy verify's acceptance)
  double accept = 0;  // the policy's probability of the draft argmax (acceptance at temperature 1)
  double in_vocab = 0;  // the policy's probability mass inside the draft vocabulary
  // With several training passes (accumulate_grad's `passes`): the sums of passes 2, 3, … over
  // their rows (a draft that many tokens ahead, given the ones before it right).
  std::vector<DraftTrainSums> ahead;
};

// One inference step of several sequences' draft rows (their draft KV in `kv`).
struct DraftStep {
  std::vector<float> logits;  // (sequences, draft vocab) of each sequence's last row
  std::vector<float> hidden;  // (sequences, hidden) g of each sequence's last row
};

class DraftHead {
 public:
  ~DraftHead();
  // The trained tensors' layout for a policy and feature layers (empty: the last layer):
  // "draft.fc.weight", "draft.feature_fc.weight" (several feature layers), "draft.layers.0.*".
  static Result<std::shared_ptr<const ParamLayout>> layout_for(
      const ModelConfig& policy, std::span<const int64_t> feature_layers = {});
  // Feature layers as a head takes them: empty → {the last layer}; else ascending, distinct, inside
  // the policy's layers, at most kMaxFeatureLayers (an error names the offender).
  static constexpr int64_t kMaxFeatureLayers = 8;
  static Result<std::vector<int64_t>> feature_layers_for(const ModelConfig& policy,
                                                         std::span<const int64_t> layers);
  // A fresh head: its layer copied from the policy's layer 0, fc = [I | 0] (the embedding passes
  // through) and P = [0 … 0 | I], a one-layer language model to start from. vocab: distinct ids of
  // the policy's vocabulary (at least 2).
  static Result<std::unique_ptr<DraftHead>> create(const ModelConfig& policy,
                                                   const TensorMap& policy_weights,
                                                   std::vector<int32_t> vocab,
                                                   std::span<const int64_t> feature_layers = {});
  // A head with trained tensors `draft` (layout_for's names and shapes); its feature layers are
  // `draft`'s int32 vector "draft.feature_layers" when it has one (as_tensor_map writes it), else
  // the last layer.
  static Result<std::unique_ptr<DraftHead>> from_weights(const ModelConfig& policy,
                                                         const TensorMap& policy_weights,
                                                         const TensorMap& draft,
                                                         std::vector<int32_t> vocab);

  // New frozen parts (the policy's embedding, final norm, head rows) from the policy's weights.
  Status set_policy(const TensorMap& policy_weights);
  // A new draft vocabulary (same size): the head rows are re-sliced.
  Status set_vocab(std::vector<int32_t> vocab);
  // New trained tensors (the trainer's after a step, or a synced version).
  Status set_params(const FlatTensors& params);
  Status set_params(const TensorMap& draft);

  const ModelConfig& policy_config() const { return policy_; }
  const std::vector<int32_t>& vocab() const { return vocab_; }
  // The policy layers whose outputs the head reads (ForwardOptions::tap_layers), and the width of
  // one position's features (layers × hidden).
  const std::vector<int64_t>& feature_layers() const { return layers_; }
  int64_t feature_width() const {
    return static_cast<int64_t>(layers_.size()) * policy_.hidden_size;
  }
  const FlatTensors& params() const { return params_; }
  // The trained tensors, the draft vocabulary ("draft.vocab", int32) and the feature layers
  // ("draft.feature_layers", int32) as views of this head.
  TensorMap as_tensor_map() const;

  // Training: adds scale × d(Σ weight × soft cross-entropy)/d params to `grads` (layout_for's
  // layout) and returns the batch's sums. Deterministic: the same rows give the same bits.
  //
  // passes > 1: EAGLE-3's training-time test. Pass p (p ≥ 2) runs the rows again with row j
  // reading g_{j−1} of pass p − 1 (the head's own output, through the final norm, as when it drafts
  // further ahead) instead of the policy's feature; row j attends pass 1's rows 0 .. j − p + 1,
  // pass q's row j − p + q and itself, which is what the engine's draft KV holds for a draft p
  // tokens ahead (ForwardOptions::earlier_passes). Each pass's loss has the same targets and
  // weights (a sequence's first p − 1 rows none) and the same scale; they add. As in EAGLE-3's
  // reference training, the gradient of a pass's loss also flows into the earlier passes through
  // the g it reads and the keys and values it attends (backwards last pass first).
  static constexpr int64_t kMaxPasses = 8;
  Result<DraftTrainSums> accumulate_grad(const DraftTrainRows& rows, double scale,
                                         FlatTensors& grads, ThreadPool* pool,
                                         int64_t passes = 1) const;

  // Inference: a KV store for draft rows (one slot per sequence being drafted).
  std::unique_ptr<SimpleKvCache> make_kv_cache() const;
  // Rows for each sequence (features (n, feature_width()) and next ids (n), packed in seqs' order)
  // at positions seqs[s].start_pos ..; returns each sequence's last row's logits and g. With
  // `own`, the features are the head's own g ((n, hidden): drafting further ahead).
  Result<DraftStep> forward(std::span<const float> features, std::span<const int32_t> next_ids,
                            std::span<const SeqSpan> seqs, KvStore& kv, ThreadPool* pool,
                            bool own = false) const;

 private:
  DraftHead() = default;
  // A draft row's numbers of its target every pass shares (rows with a loss weight): the policy
  // row's log-softmax stats over its vocabulary, its argmax and its mass in the draft vocabulary.
  struct PolicyTarget {
    kernels::LogSoftmaxStats full;
    int64_t best = 0;
    double in_vocab = 0;
  };
  // The draft rows of a training batch, as every pass reads them.
  struct PassRows {
    std::span<const SeqSpan> seqs;    // draft sequences (a policy sequence's T − 1 rows)
    std::span<const int64_t> src;     // each row's policy row (its target is src + 1)
    std::span<const int64_t> at_pos;  // each row's position in its sequence
    std::span<const int32_t> next;    // each row's next id
    std::function<const float*(int64_t)> policy_row;  // a policy row's logits (or null)
    std::span<const float> weight;                    // DraftTrainRows::weight
    double scale;
    std::span<const PolicyTarget> target;  // per draft row
  };
  // One pass's forward over the rows, kept for its backward.
  struct Pass {
    std::unique_ptr<ForwardTape> tape;
    // Its feature rows (pass 1: the policy's; pass p ≥ 2: pass p − 1's g shifted one row, zero on
    // a sequence's first row) and fuse's x and z of them.
    std::vector<float> feat, x, z;
    std::vector<float> g;         // its layer outputs (n, hidden), the next pass's features
    std::vector<int64_t> live;    // the rows with a loss weight, ascending
    std::vector<float> d_logits;  // (live, draft vocabulary) d loss / d logits
  };
  // Pass `pass`'s forward (passes[pass − 1], its features set; the earlier passes' before it) and
  // its loss: its sums, d logits, and (not the last pass) g.
  Result<DraftTrainSums> forward_pass(const PassRows& rows, int64_t pass, std::vector<Pass>& passes,
                                      bool last, ThreadPool* pool) const;
  // Its backward, after every later pass's: d g (from the next pass; empty for the last) in, the
  // previous pass's d g out (pass ≥ 2); the earlier passes' tapes receive their keys' gradients.
  Status backward_pass(const PassRows& rows, int64_t pass, std::vector<Pass>& passes,
                       std::vector<float>& dg, FlatTensors& grads, ThreadPool* pool) const;
  Status rebuild();  // the draft Model from params_ and the frozen parts
  // u = fc · [embed(next); feature] for n rows; x receives the [n, 2·hidden] inputs and z the
  // normalised feature layers [n, k·hidden] (several feature layers, not `own`).
  void fuse(std::span<const float> features, std::span<const int32_t> next_ids, int64_t n, bool own,
            std::vector<float>& x, std::vector<float>& z, std::vector<float>& u,
            ThreadPool* pool) const;

  ModelConfig policy_;
  ModelConfig config_;  // the draft Model's: one layer, the draft vocabulary, untied
  std::vector<int32_t> vocab_;
  std::vector<int64_t> layers_;     // feature layers (feature_layers_for)
  std::vector<int32_t> layer_ids_;  // the same, as_tensor_map's int32 view
  FlatTensors params_;
  std::vector<float> embed_;       // (policy vocab, hidden), times the policy's embed scale
  std::vector<float> final_norm_;  // (hidden) as the policy's file holds it
  // (feature layers, hidden) each feature layer's norm as the kernels multiply by it (the next
  // layer's input norm, the last layer's the final norm); own_norm_ the final norm's (g's).
  std::vector<float> tap_norms_, own_norm_;
  // fc and P packed for the kernels (rebuild(): once per parameter change, not per forward).
  kernels::PackedMatrix fc_packed_, feat_packed_;
  std::vector<float> head_;        // (policy vocab, hidden) the policy's LM head (or embedding)
  std::unique_ptr<Model> model_;
};

// The draft vocabulary: the `size` ids with the highest counts (ties: the smaller id), ascending.
std::vector<int32_t> top_ids(std::span<const uint64_t> counts, int64_t size);

}  // namespace miles
