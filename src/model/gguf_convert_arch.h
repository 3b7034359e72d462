// The architecture facts of a GGUF model that both config.json and the tensor conversion need.
//
// Why: llama.cpp spells hyper-parameters as `<arch>.<name>` keys and renames/permutes tensors per
// architecture (and fixes some in its own code, as Gemma 3's window pattern). Reading them once
// into this struct keeps config.json and the weights consistent (the head counts that un-permute
// q/k are the ones written to config.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "miles/gguf.h"
#include "miles/status.h"

namespace miles::gguf {

struct GgufArch {
  std::string gguf_arch;     // general.architecture: "llama", "phi3", "qwen2", "qwen3", "gemma3",
                             // "glm4moe", "deepseek2"
  std::string hf_class;      // "LlamaForCausalLM"
  std::string model_type;    // "llama"
  bool permuted_qk = false;  // llama.cpp permuted q/k rows to interleaved rotary pairs
  bool qk_norm = false;      // per-head q_norm / k_norm (qwen3, gemma3; glm4moe when present)
  bool qkv_bias = false;     // q / k / v projection biases (qwen2; glm4moe when present)
  bool fused = false;        // attn_qkv and ffn_up ([gate; up]) fused, as HF's Phi-3 (phi3)
  int64_t rotary_dim = 0;    // rope.dimension_count (phi3, glm4moe: partial rotary when < head_dim)
  int64_t sliding_window = 0;  // attention.sliding_window (phi3, gemma3; 0: none)
  // Gemma 3 (gemma3): norms stored as 1 + w, post-attention and post-FFN norms, GeGLU, a window on
  // the layers llama.cpp's fixed pattern makes sliding (every 6th layer full), their own RoPE base.
  bool gemma3 = false;
  std::vector<bool> sliding_layers;   // gemma3: per layer, true = sliding_attention
  double rope_local_theta = 0;        // gemma3: the sliding layers' base (llama.cpp: 10000)
  int64_t query_pre_attn_scalar = 0;  // gemma3: 1 / sqrt(this) scales the queries
  // GLM-4 MoE (glm4moe): sigmoid routing with a score-correction bias (exp_probs_b), routed
  // experts stacked in 3-D tensors (ffn_{gate,up,down}_exps), a shared expert (ffn_*_shexp),
  // leading dense layers, optional q/k/v biases and q/k norms (found from the tensors), and
  // NextN / multi-token-prediction blocks after the causal LM's layers, which are skipped.
  bool glm4moe = false;
  int64_t experts = 0;         // expert_count
  int64_t experts_used = 0;    // expert_used_count
  int64_t expert_ff = 0;       // expert_feed_forward_length (moe_intermediate_size)
  int64_t shared_experts = 0;  // expert_shared_count
  int64_t dense_lead = 0;      // leading_dense_block_count (first_k_dense_replace)
  int64_t expert_groups = 1;   // expert_group_count (n_group; 1: no group routing)
  int64_t groups_used = 1;     // expert_group_used_count (topk_group)
  double expert_scale = 1.0;   // expert_weights_scale (routed_scaling_factor)
  bool expert_norm = false;    // expert_weights_norm (norm_topk_prob)
  int64_t nextn_layers = 0;    // nextn_predict_layers: blocks [layers, layers + this) skipped
  // DeepSeek-V2 / V3 / R1, Kimi-K2 (deepseek2): multi-head latent attention, the routing fields
  // above (sigmoid only), leading dense layers, NextN blocks skipped. llama.cpp's converter writes
  // MLA as MQA over the latent (head_count_kv 1, key_length kv_lora_rank + rope, value_length
  // kv_lora_rank, the per-head sizes in key_length_mla / value_length_mla) and splits kv_b_proj
  // into attn_k_b (key rows, transposed) and attn_v_b; older files keep attn_kv_b and per-head
  // key/value lengths with head_count_kv = head_count.
  bool deepseek2 = false;
  int64_t q_lora_rank = 0;    // attention.q_lora_rank (0: a plain attn_q, as DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;   // attention.kv_lora_rank
  int64_t qk_nope = 0;        // per-head key length less the rotary part
  int64_t v_head_dim = 0;     // per-head value length
  bool mla_split = false;     // attn_k_b + attn_v_b (key_length_mla given) rather than attn_kv_b
  double mscale_all_dim = 0;  // yarn: rope.scaling.yarn_log_multiplier / 0.1 (llama.cpp's undoing)
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  int64_t vocab = 0;  // rows of token_embd.weight
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;  // the causal LM's layers (block_count less any NextN blocks)
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t context = 0;
  double rms_eps = 0;
  double rope_theta = 10000.0;
  std::string rope_scaling;  // "" (none), "linear" or "yarn"
  double rope_factor = 1.0;
  int64_t rope_original_context = 0;  // yarn
  bool tied = false;                  // no output.weight
  int64_t bos = -1, eos = -1, pad = -1;

  // Grouped sigmoid routing with a score-correction bias, a shared expert and leading dense layers.
  bool grouped_moe() const { return glm4moe || deepseek2; }
};

Result<GgufArch> read_gguf_arch(const GgufFile& f);

// The float32 number nearest to `v` written with the fewest decimal digits (metadata floats are
// f32: 1e-5 is stored as 9.99999974738e-06, which config.json should spell 1e-05).
double shortest_f32(double v);

}  // namespace miles::gguf
