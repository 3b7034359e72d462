// ModelWeights: every parameter of the shared model, converted once into the kernels' layouts.
//
// Matrices are PackedMatrix (float32 panels); norms and biases are float32 vectors. Fused matrices
// stack rows ([q; k; v], [gate; up]) so one GEMM computes them; fusing never changes any output's
// bits.
#pragma once

#include <vector>

#include "miles/checkpoint.h"
#include "miles/kernels.h"
#include "miles/model_config.h"
#include "model/layer_program.h"
#include "model/mla.h"

namespace miles {

struct BackwardWeights;

class ThreadPool;

struct ExpertWeights {
  kernels::PackedMatrix gate_up;  // (2 * moe_intermediate, hidden): [gate; up]
  kernels::PackedMatrix down;     // (hidden, moe_intermediate)
};

struct LayerWeights {
  std::vector<float> input_norm;      // (hidden)
  kernels::PackedMatrix qkv;          // (q_dim + 2 * kv_dim, hidden); MLA: [q_a | q; kv_a]
  std::vector<float> qkv_bias;        // (q_dim + 2 * kv_dim) when attention_bias, else empty
  std::vector<float> q_norm, k_norm;  // (head_dim) for Qwen3, else empty
  kernels::PackedMatrix o;            // (hidden, q_dim); MLA: (hidden, heads * v_head_dim)
  MlaWeights mla;                     // MLA's other tensors
  std::vector<float> o_bias;          // (hidden) when attention_bias
  std::vector<float> post_norm;       // (hidden)
  // Gemma 3's norms of the attention's and the MLP's outputs (hidden), else empty. Every norm
  // vector holds the factor the kernels multiply by: 1 + weight where ModelConfig::norm_adds_one.
  std::vector<float> attn_out_norm, mlp_out_norm;
  bool moe = false;
  kernels::PackedMatrix gate_up;  // dense: (2 * intermediate, hidden)
  kernels::PackedMatrix down;     // dense: (hidden, intermediate)
  std::vector<float> gate_up_bias;  // dense with mlp_bias: (2 * intermediate) [gate; up]
  std::vector<float> down_bias;     // dense with mlp_bias: (hidden)
  kernels::PackedMatrix router;   // moe: (num_experts, hidden)
  std::vector<float> router_bias;  // sigmoid routing: e_score_correction_bias (num_experts)
  std::vector<ExpertWeights> experts;
  // moe with n_shared_experts: the shared expert, (n_shared * moe_intermediate) wide.
  ExpertWeights shared;
  bool has_shared = false;
};

struct ModelWeights {
  std::vector<float> embed;  // (vocab, hidden), times ModelConfig::embed_scale()
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // (hidden)
  kernels::PackedMatrix lm_head;  // (vocab, hidden); the embedding when tied
  kernels::RopeTable rope;
  kernels::RopeTable rope_local;       // the sliding layers' (ModelConfig::uses_local_rope), if any
  std::vector<LayerProgram> programs;  // each layer's (layer_program.h)
};

Result<ModelWeights> load_model_weights(const ModelConfig& config, const TensorMap& weights,
                                        ThreadPool* pool = nullptr);
// The same into an existing ModelWeights of this config, reusing its buffers; with `transposed`,
// its packs (the backward's, backward_weights.h) are rebuilt from the same pass over each matrix.
// On an error the weights are partly replaced: the caller must not use them.
Status reload_model_weights(const ModelConfig& config, const TensorMap& weights, ModelWeights& m,
                            ThreadPool* pool = nullptr, BackwardWeights* transposed = nullptr);

}  // namespace miles
