// TransferPlan: which tensors travel in which bucket, from which trainer rank, when weights go from
// the trainer to the rollout engines — computed once, deterministically, from the two layouts.
//
// Why: every transport (broadcast, p2p, disk-delta) moves the same tensors after every optimizer
// step; planning once keeps the hot path to "copy bucket i" and makes the order identical on every
// process, so senders and receivers agree without talking. Rules (docs/contracts.md §3): buckets of
// about `bucket_bytes`; expert and non-expert tensors in separate buckets; tensors that an engine
// fuses (a layer's q/k/v, an MLP's gate/up) never straddle two buckets; each pipeline stage sends
// its own layers independently, from its (dp = 0, tp = 0) rank after gathering its tensor-parallel
// shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "miles/flat_params.h"
#include "miles/model_config.h"
#include "miles/parallel_layout.h"
#include "miles/status.h"

namespace miles {

struct PlannedTensor {
  std::string name;            // HF name (the engine's naming)
  std::vector<int64_t> shape;  // full (unsharded) shape
  int64_t offset = 0;          // byte offset inside its bucket
  int64_t bytes = 0;           // float32 bytes
};

struct Bucket {
  int stage = 0;        // pipeline stage that owns every tensor in it
  int sender = 0;       // world rank of that stage's (dp = 0, tp = 0) rank
  bool expert = false;  // MoE expert weights (separate buckets)
  int64_t bytes = 0;
  std::vector<PlannedTensor> tensors;
};

struct TransferPlanOptions {
  int64_t bucket_bytes = 512ll << 20;  // a fused group larger than this gets a bucket of its own
  Status validate() const;
};

struct TransferPlan {
  std::vector<Bucket> buckets;  // stage-major; within a stage, non-expert then expert, layout order
  int64_t total_bytes = 0;
  // Every tensor of the model exactly once, whatever the layouts (an invariant the tests check).
  std::vector<std::string> tensor_names() const;
};

// The plan for a model with parameters `params` (the full layout), trained with `trainer` layout.
Result<TransferPlan> make_transfer_plan(const ModelConfig& config, const ParamLayout& params,
                                        const ParallelLayout& trainer,
                                        const TransferPlanOptions& options = {});

// The buckets of pipeline stage `stage` only (in order), each to be sent by rank 0 of that stage's
// own broadcast group; total_bytes is theirs.
TransferPlan stage_plan(const TransferPlan& plan, int stage);
// The number of pipeline stages the plan's buckets come from (1 + the largest stage).
int plan_stages(const TransferPlan& plan);

// The fused group a tensor belongs to ("" when none): "model.layers.3.self_attn.qkv",
// "model.layers.3.mlp.gate_up", "model.layers.3.mlp.experts.5.gate_up".
std::string fused_group(const std::string& name);

}  // namespace miles
