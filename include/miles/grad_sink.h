// Where Model::backward puts each parameter's gradient, and the trainer's micro-batch sum fused
// into it.
//
// Why: the trainer sums micro-batch gradients by a halving tree (trainer_internal.h). Stored whole
// and added afterwards, that is one more pass over every gradient buffer per micro-batch (538 MB
// for SmolLM2). Here a micro-batch's weight gradients are folded into the pending partial sums as
// the GEMM stores them: with `fold` (the pending sums, innermost first) a gradient g becomes
//   fold.back() + (… + (fold[1] + (fold[0] + g)))
// element-wise in fold.back() — the additions the tree makes, in its order. Tensors built in
// pieces (norm weights, biases, the embedding's scatter) collect in `scratch` and are folded by
// finish(). Without `fold`, everything lands in `scratch` as a plain gradient.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "miles/flat_params.h"

namespace miles {

class ThreadPool;

class GradSink {
 public:
  GradSink(FlatTensors& scratch, std::span<FlatTensors* const> fold, ThreadPool* pool);

  // A gradient summed in pieces: its scratch values, zero-filled on first use.
  float* accumulate(const std::string& name);
  // A gradient the caller writes whole (into scratch).
  float* overwrite(const std::string& name);
  // dW = dyᵀ · x (kernels::gemm_weight_grad over m rows, K = k) for the tensors stacked in dW's
  // rows, in order: (name, rows) each. Stored in place (folded when folding).
  void weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m, int64_t k,
                   const std::vector<std::pair<std::string, int64_t>>& parts);
  // The embedding's scatter-add: row rows[i] of tensor `name` ([rows, d]) gains src row i, for
  // i ascending (rows[i] < 0: skipped), from zero. Folding, only the touched rows are summed
  // apart: the other rows take the fold of the lefts alone (the bits of adding their zeros, as no
  // partial sum here is ever -0), so no zero-filled [rows, d] scratch is made and read.
  void scatter_rows(const std::string& name, std::span<const int64_t> rows, const float* src,
                    int64_t d);
  // Tensors never written are zero (an expert no token chose); the scratch ones are folded.
  void finish();

  // The fold of any buffer laid out like these (the tied head's share): dest = lefts.back(), or
  // scratch when there is nothing to fold into.
  static void fold_buffer(std::span<const float> scratch, std::span<const std::span<float>> lefts,
                          ThreadPool* pool);

 private:
  enum class State : uint8_t { kUntouched, kScratch, kStored };
  size_t index_of(const std::string& name) const;

  FlatTensors& scratch_;
  std::span<FlatTensors* const> fold_;
  ThreadPool* pool_;
  std::vector<State> state_;  // per tensor, layout order
};

}  // namespace miles
