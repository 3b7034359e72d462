// ModelConfig -> HF config.json, the inverse of parse_model_config.
//
// Why: a trainer checkpoint must be a Hugging Face model directory, also for models that did not
// come with a config.json (llama2.c files). We write the transformers v4 spellings (`rope_theta` +
// `rope_scaling`, `num_experts`, `torch_dtype`), which v4 reads natively and v5 converts on load
// (rope_scaling -> rope_parameters, num_experts -> num_local_experts); v5's `dtype` is written too.
// A field that config.json does not pin down by default is written whenever it differs from the
// parser's default, so parse_model_config(model_config_to_hf_json(c)) gives back every field of c.
#include "miles/model_config.h"
#include "nlohmann/json.hpp"

namespace miles {
namespace {

using ordered_json = nlohmann::ordered_json;

const char* model_type_of(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
    case Arch::kQwen3Moe:
      return "qwen3_moe";
    case Arch::kMistral:
      return "mistral";
    case Arch::kPhi3:
      return "phi3";
    case Arch::kGemma3:
      return "gemma3_text";
    case Arch::kGlm4Moe:
      return "glm4_moe";
    case Arch::kDeepseekV3:
      return "deepseek_v3";
  }
  return "llama";
}

const char* default_arch_name(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "LlamaForCausalLM";
    case Arch::kQwen2:
      return "Qwen2ForCausalLM";
    case Arch::kQwen3:
      return "Qwen3ForCausalLM";
    case Arch::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
    case Arch::kMistral:
      return "MistralForCausalLM";
    case Arch::kPhi3:
      return "Phi3ForCausalLM";
    case Arch::kGemma3:
      return "Gemma3ForCausalLM";
    case Arch::kGlm4Moe:
      return "Glm4MoeForCausalLM";
    case Arch::kDeepseekV3:
      return "DeepseekV3ForCausalLM";
  }
  return "LlamaForCausalLM";
}

const char* rope_type_name(RopeConfig::Type t) {
  using T = RopeConfig::Type;
  switch (t) {
    case T::kDefault:
      return "default";
    case T::kLinear:
      return "linear";
    case T::kDynamic:
      return "dynamic";
    case T::kLlama3:
      return "llama3";
    case T::kYarn:
      return "yarn";
  }
  return "default";
}

// `rope_scaling` (null for plain RoPE with every optional field at its default).
ordered_json rope_scaling_json(const RopeConfig& r) {
  using T = RopeConfig::Type;
  const RopeConfig d;  // the parser's defaults
  ordered_json s = ordered_json::object();
  s["rope_type"] = rope_type_name(r.type);
  // Required by the parser (and by transformers) for their types; otherwise only when not default.
  if (r.type != T::kDefault || r.factor != d.factor) s["factor"] = r.factor;
  const bool llama3 = r.type == T::kLlama3;
  if (llama3 || r.low_freq_factor != d.low_freq_factor) s["low_freq_factor"] = r.low_freq_factor;
  if (llama3 || r.high_freq_factor != d.high_freq_factor)
    s["high_freq_factor"] = r.high_freq_factor;
  if (llama3 || r.original_max_position_embeddings != d.original_max_position_embeddings)
    s["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.beta_fast != d.beta_fast) s["beta_fast"] = r.beta_fast;
  if (r.beta_slow != d.beta_slow) s["beta_slow"] = r.beta_slow;
  if (r.attention_factor != d.attention_factor) s["attention_factor"] = r.attention_factor;
  if (r.mscale != d.mscale) s["mscale"] = r.mscale;
  if (r.mscale_all_dim != d.mscale_all_dim) s["mscale_all_dim"] = r.mscale_all_dim;
  if (r.truncate != d.truncate) s["truncate"] = r.truncate;
  if (r.type == T::kDefault && s.size() == 1) return nullptr;
  return s;
}

// Gemma 3's keys: its window per layer, its two RoPEs (rope_theta + rope_scaling for the full
// layers and rope_local_base_freq for the sliding ones, which transformers 4 and 5 both read;
// rope_parameters keyed by layer type when the sliding layers' RoPE is not a default one).
void gemma3_json(const ModelConfig& c, ordered_json& j) {
  j["hidden_activation"] = "gelu_pytorch_tanh";
  // Gemma3TextConfig is strict: an int (its declared type) when the value is whole.
  const double q = c.query_pre_attn_scalar;
  if (q == static_cast<double>(static_cast<int64_t>(q))) {
    j["query_pre_attn_scalar"] = static_cast<int64_t>(q);
  } else {
    j["query_pre_attn_scalar"] = q;
  }
  j["sliding_window"] = c.sliding_window;
  ordered_json types = ordered_json::array();
  for (bool s : c.sliding_layers) types.push_back(s ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["final_logit_softcapping"] = nullptr;
  j["attn_logit_softcapping"] = nullptr;
  if (c.rope_local.type == RopeConfig::Type::kDefault) {
    j["rope_theta"] = c.rope.theta;
    j["rope_local_base_freq"] = c.rope_local.theta;
    j["rope_scaling"] = rope_scaling_json(c.rope);
    return;
  }
  ordered_json p = ordered_json::object();
  for (const auto& [type, rope] :
       {std::pair{"full_attention", &c.rope}, std::pair{"sliding_attention", &c.rope_local}}) {
    ordered_json r = rope_scaling_json(*rope);
    if (r.is_null()) r = {{"rope_type", "default"}};
    r["rope_theta"] = rope->theta;
    p[type] = r;
  }
  j["rope_parameters"] = p;
}

}  // namespace

std::string model_config_to_hf_json(const ModelConfig& c) {
  ordered_json j = ordered_json::object();
  j["architectures"] = {c.arch_name.empty() ? default_arch_name(c.arch) : c.arch_name};
  j["model_type"] = model_type_of(c.arch);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  // MLA's attention geometry is derived (parse_mla): config.json keeps DeepseekV3Config's own.
  j["num_key_value_heads"] = c.is_mla() ? c.mla.num_key_value_heads : c.num_kv_heads;
  j["head_dim"] = c.is_mla() ? c.mla.qk_rope_head_dim : c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (c.arch != Arch::kGemma3) j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // Qwen2's biases are fixed by its class; Mistral's and Phi-3's classes have none.
  const bool biases = c.arch != Arch::kQwen2 && c.arch != Arch::kMistral && c.arch != Arch::kPhi3 &&
                      c.arch != Arch::kGemma3;
  if (biases) j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  if (biases && c.arch != Arch::kGlm4Moe && c.arch != Arch::kDeepseekV3) j["mlp_bias"] = c.mlp_bias;
  // None as null, not left out: a family's default would come back in its place.
  const auto id_or_null = [](int64_t id) { return id >= 0 ? ordered_json(id) : ordered_json(); };
  j["bos_token_id"] = id_or_null(c.bos_token_id);
  j["pad_token_id"] = id_or_null(c.pad_token_id);
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  } else {
    j["eos_token_id"] = ordered_json();
  }
  if (c.arch == Arch::kGemma3) {
    gemma3_json(c, j);
  } else {
    j["rope_theta"] = c.rope.theta;
    if (c.rope.partial_rotary_factor != RopeConfig{}.partial_rotary_factor ||
        c.arch == Arch::kGlm4Moe)  // its default is 0.5 (DeepSeek-V3 rotates qk_rope_head_dim)
      j["partial_rotary_factor"] = c.rope.partial_rotary_factor;
    j["rope_scaling"] = rope_scaling_json(c.rope);
  }
  if (c.arch == Arch::kMistral || c.arch == Arch::kPhi3) {
    j["sliding_window"] = c.sliding_window > 0 ? ordered_json(c.sliding_window) : ordered_json();
  } else if (c.arch != Arch::kLlama && c.arch != Arch::kGemma3 && c.arch != Arch::kGlm4Moe &&
             c.arch != Arch::kDeepseekV3) {
    j["use_sliding_window"] = false;
  }
  if (c.arch == Arch::kQwen3Moe) {
    j["num_experts"] = c.moe.num_experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["moe_intermediate_size"] = c.moe.moe_intermediate_size;
    j["norm_topk_prob"] = c.moe.norm_topk_prob;
    j["decoder_sparse_step"] = c.moe.decoder_sparse_step;
    j["mlp_only_layers"] = c.moe.mlp_only_layers;
  }
  if (c.arch == Arch::kGlm4Moe || c.arch == Arch::kDeepseekV3) {
    const MoeConfig& m = c.moe;
    j["n_routed_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.top_k;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["n_shared_experts"] = m.n_shared_experts;
    j["routed_scaling_factor"] = m.routed_scaling_factor;
    j["n_group"] = m.n_group;
    j["topk_group"] = m.topk_group;
    j["first_k_dense_replace"] = m.first_k_dense_replace;
    if (c.arch == Arch::kGlm4Moe) j["use_qk_norm"] = c.use_qk_norm;
  }
  if (c.is_mla()) {
    const MlaConfig& a = c.mla;
    j["q_lora_rank"] = a.q_lora_rank > 0 ? ordered_json(a.q_lora_rank) : ordered_json();
    j["kv_lora_rank"] = a.kv_lora_rank;
    j["qk_nope_head_dim"] = a.qk_nope_head_dim;
    j["qk_rope_head_dim"] = a.qk_rope_head_dim;
    j["v_head_dim"] = a.v_head_dim;
    j["rope_interleave"] = a.rope_interleave;
  }
  j["torch_dtype"] = "float32";
  j["dtype"] = "float32";
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace miles
