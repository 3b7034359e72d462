// The sparse MoE block: a router (Qwen3-MoE's softmax top-k with optional renormalisation, or
// GLM-4 MoE's grouped sigmoid top-k with its score-correction bias and scaling; or replayed ids),
// SwiGLU experts, outputs combined in ascending expert id (the order HF's index_add_ loop uses),
// plus GLM-4 MoE's shared expert.
#pragma once

#include <cstdint>
#include <span>

#include "miles/model.h"
#include "miles/model_config.h"
#include "miles/status.h"
#include "model/model_weights.h"

namespace miles {
class ThreadPool;
struct MoeTape;

// x: [T, hidden] normalised input; out: [T, hidden] block output (not yet added to the residual).
// tape: training activations or null.
// forced: [T, top_k] replayed ids for this layer or empty; ids_out / weights_out: [T, top_k] or null.
// tp: under tensor parallelism each expert's output is this rank's partial (its slice of the expert's
// intermediate); the partials of every (token, expert) are summed over the group (tree order) before
// the gated sum, so `out` is complete and equals the single-process bits where the split is on chunk
// boundaries (tensor_parallel::bitwise_split). Null or size 1: one process.
Status moe_block(const ModelConfig& config, const LayerWeights& layer, const float* x, int64_t t,
                 std::span<const int32_t> forced, int64_t forced_stride, float* out,
                 int32_t* ids_out, float* weights_out, int64_t out_stride, MoeTape* tape,
                 const TensorParallel* tp, ThreadPool* pool);

}  // namespace miles
