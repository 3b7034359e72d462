// Hugging Face checkpoint names against the model's parameter names.
//
// Why: the model names every projection on its own (self_attn.q_proj / k_proj / v_proj,
// mlp.gate_proj / up_proj), as Llama, Mistral and Qwen checkpoints store them, and everything
// downstream (parameters, gradients, tensor-parallel shards, weight-sync plans, the trainer's
// optimizer state) uses those names. Phi-3 checkpoints store them fused (self_attn.qkv_proj: the
// rows [q; k; v], mlp.gate_up_proj: the rows [gate; up]). A checkpoint is translated once on the
// way in (load_model_files, load_checkpoint) and once on the way out (save_checkpoint), so a Phi-3
// checkpoint miles writes is one transformers loads.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/model_config.h"
#include "miles/status.h"

namespace miles {

// The model's names for a checkpoint's tensors: fused tensors become row views of themselves (no
// copy); the rest pass through. Errors name a fused tensor whose shape is not the config's.
Result<TensorMap> from_hf_names(const ModelConfig& config, const TensorMap& checkpoint);

// The checkpoint's names for the model's named tensors, in their order: the parts of a fused
// tensor are copied together where its first part was.
std::vector<std::pair<std::string, Tensor>> to_hf_names(
    const ModelConfig& config, std::vector<std::pair<std::string, Tensor>> tensors);

}  // namespace miles
