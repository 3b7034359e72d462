// ModelConfig: the architecture hyper-parameters of the one shared model, read from an HF config.json.
//
// Why: rollout and trainer build the same model from the same config; every field a supported
// architecture needs is typed here and validated once, with errors naming config.json and the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "miles/status.h"

namespace miles {

enum class Arch {
  kLlama,
  kQwen3,
  kQwen3Moe,
  kQwen2,
  kMistral,
  kPhi3,
  kGemma3,
  kGlm4Moe,
  kDeepseekV3
};

// The gated MLP's activation: silu(gate) · up (SwiGLU) or gelu_tanh(gate) · up (GeGLU, Gemma's
// gelu_pytorch_tanh).
enum class Activation { kSilu, kGeluTanh };

// Rotary position embedding: HF `rope_theta` + `rope_scaling` (or `rope_parameters`) + partial rotary.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kDynamic, kLlama3, kYarn };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // rotary_dim = head_dim * factor (even)
  double factor = 1.0;                 // linear / dynamic / llama3 / yarn
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;  // 0: derived (0.1 * ln(factor) + 1)
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;
  int64_t max_position_embeddings = 0;  // dynamic NTK needs it
};

// The router's scores: Qwen3-MoE's softmax over the experts, or GLM-4 MoE's / DeepSeek-V3's
// sigmoid per expert, chosen with a score-correction bias (e_score_correction_bias, not trained)
// among the experts of the top groups.
enum class RouterScore { kSoftmax, kSigmoid };

struct MoeConfig {
  int64_t num_experts = 0;  // 0: dense model
  int64_t top_k = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  RouterScore score = RouterScore::kSoftmax;
  // Sigmoid routing (GLM-4 MoE): experts form n_group groups of num_experts / n_group; a group's
  // score is the sum of its two best biased scores, the topk_group best groups are kept and the
  // others' biased scores masked to 0; top_k experts are chosen by the biased scores and weighted
  // by their sigmoid scores (renormalised with + 1e-20 when norm_topk_prob), times
  // routed_scaling_factor.
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  // A shared expert MLP every token runs (intermediate n_shared_experts * moe_intermediate_size),
  // added to the routed experts' sum; 0: none.
  int64_t n_shared_experts = 0;
  // GLM-4 MoE: layers below it are dense MLPs (intermediate_size), the rest MoE.
  int64_t first_k_dense_replace = 0;
};

// DeepSeek-V3's multi-head latent attention (MLA). The model runs it absorbed: each head's query
// q_nope · W_kb (W_kb: the head's key rows of kv_b_proj) attends, with its rotated q_pe, over one
// latent key head [k_pe, c] and value head [0, c] (c: the normed compressed kv), and each head's
// latent output times W_vbᵀ is its value output. So the attention runs with num_kv_heads 1 and
// head_dim qk_rope_head_dim + kv_lora_rank, and the KV cache holds the compressed latent.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: a plain q_proj (config.json's null)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;      // q_pe / k_pe rotate interleaved pairs (DeepSeek's layout)
  int64_t num_key_value_heads = 0;  // as config.json says (the attention's kv head is the latent)
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // as in config.json "architectures"[0]
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  RopeConfig rope;
  MoeConfig moe;
  // Sliding-window attention (Mistral's and Phi-3's `sliding_window`, on every layer): a query at p
  // sees keys p − sliding_window + 1 .. p (transformers' rule: key j when j > p − window). 0: full
  // causal attention.
  int64_t sliding_window = 0;
  // Gemma 3's `layer_types`: which layers are "sliding_attention" (the others full attention).
  // Empty: sliding_window (when set) applies to every layer.
  std::vector<bool> sliding_layers;
  // Gemma 3's sliding layers rotate with their own table (rope_local_base_freq, default RoPE).
  RopeConfig rope_local;
  Activation activation = Activation::kSilu;
  // Gemma 3's query_pre_attn_scalar: attention scores are scaled by its −½ power (0: head_dim's).
  double query_pre_attn_scalar = 0;
  // GLM-4 MoE's use_qk_norm: per-head q/k RMSNorms (has_qk_norm).
  bool use_qk_norm = false;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // `pad_token_id`: transformers builds every family's embedding with it as padding_idx, so its row
  // gets no gradient from the tokens that look it up (the forward reads it as any row). -1: none;
  // config.json's negative padding_idx (torch counts it from the end) is stored as the row it
  // names.
  int64_t pad_token_id = -1;
  MlaConfig mla;  // DeepSeek-V3
  // Not from config.json: > 1 when this config is one rank's shard of a tensor-parallel split
  // (tensor_parallel::local_config). Row-parallel products then keep the full K's GEMM chunks.
  int64_t tensor_parallel = 1;

  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // The attention window of a layer's queries (0: full causal attention).
  int64_t attention_window(int64_t layer) const {
    return sliding_layers.empty() || sliding_layers[layer] ? sliding_window : 0;
  }
  // Whether a layer rotates with rope_local instead of rope (Gemma 3's sliding layers).
  bool uses_local_rope(int64_t layer) const {
    return arch == Arch::kGemma3 && !sliding_layers.empty() && sliding_layers[layer];
  }
  // The scale of attention scores: 1/sqrt(head_dim), or query_pre_attn_scalar^−½ (as a float).
  float attention_scale() const;
  // Per-head RMSNorms of q and k before RoPE (Qwen3, Qwen3-MoE, Gemma 3).
  bool has_qk_norm() const {
    return arch == Arch::kQwen3 || arch == Arch::kQwen3Moe || arch == Arch::kGemma3 ||
           (arch == Arch::kGlm4Moe && use_qk_norm);
  }
  // Gemma's RMSNorm multiplies by (1 + weight): every norm of a Gemma 3 model (input,
  // post-attention, pre- and post-feedforward, q/k and final) stores weight and runs with 1 +
  // weight.
  bool norm_adds_one() const { return arch == Arch::kGemma3; }
  // Gemma 3's norms of each block's output before the residual add (post_attention_layernorm,
  // post_feedforward_layernorm; its pre_feedforward_layernorm is the MLP's input norm).
  bool has_block_output_norms() const { return arch == Arch::kGemma3; }
  // The factor the embedding's rows are multiplied by (Gemma 3: sqrt(hidden_size) as a float).
  float embed_scale() const;
  bool is_moe_layer(int64_t layer) const;
  int64_t num_moe_layers() const;
  int64_t rotary_dim() const;
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Cross-field checks (divisibility, positivity); the message names `source`.
  Status validate(const std::string& source) const;
  // validate()'s checks of GLM-4 MoE's grouped sigmoid routing.
  Status validate_grouped_routing(const std::string& source) const;
};

// Parses the text of an HF config.json; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Result<ModelConfig> load_model_config(const std::string& path);
// An HF config.json (LlamaForCausalLM / Qwen3ForCausalLM / Qwen3MoeForCausalLM, transformers v4
// spellings that v5 also reads, torch_dtype float32) from which parse_model_config gives back every
// field of `config`.
std::string model_config_to_hf_json(const ModelConfig& config);

}  // namespace miles
