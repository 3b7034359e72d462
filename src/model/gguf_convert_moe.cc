// glm4moe and deepseek2 GGUF metadata -> GgufArch -> config.json: grouped sigmoid routing (the
// expert_* keys become Glm4MoeConfig's / DeepseekV3Config's routing fields, NextN blocks are
// dropped from num_hidden_layers), DeepSeek's MLA sizes (written by llama.cpp for its
// MQA-over-the-latent form) and its yarn log multiplier as mscale_all_dim. What the routing or
// attention of the HF classes cannot express (gating other than sigmoid, DeepSeek-V2's softmax
// routing, M-RoPE, unknown keys) is refused with an error naming the file and the key.
#include <cmath>
#include <set>

#include "model/gguf_convert_arch.h"
#include "model/gguf_convert_arch_internal.h"
#include "nlohmann/json.hpp"

namespace miles::gguf::detail {
namespace {

// Every <arch>.* key of a routed-experts model that llama.cpp's glm4moe and deepseek2 converters
// (and TextModel) write and their loaders read, and `more`.
std::set<std::string> grouped_moe_keys(std::initializer_list<const char*> more) {
  std::set<std::string> keys = text_model_keys(more);
  keys.insert({
      "expert_count",
      "expert_used_count",
      "expert_shared_count",
      "expert_feed_forward_length",
      "leading_dense_block_count",
      "expert_gating_func",
      "expert_weights_scale",
      "expert_weights_norm",
      "expert_group_count",
      "expert_group_used_count",
      "nextn_predict_layers",
  });
  return keys;
}

// Every glm4moe.* key llama.cpp's converter (Glm4MoeModel and TextModel's set_gguf_parameters)
// writes, and those its loader reads; any other is refused, as its meaning for the HF class is
// unknown.
const std::set<std::string>& glm4moe_keys() {
  static const std::set<std::string> keys = grouped_moe_keys({
      "rope.dimension_sections",  // M-RoPE: refused unless all zero
      "expert_shared_feed_forward_length",
  });
  return keys;
}

// Every deepseek2.* key llama.cpp's converter (DeepseekV2Model and TextModel) writes and those its
// loader reads that DeepseekV3Config can express; any other (attention.temperature_scale,
// Mistral-Large's, among them) is refused.
const std::set<std::string>& deepseek2_keys() {
  static const std::set<std::string> keys = grouped_moe_keys({
      "attention.key_length_mla",
      "attention.value_length_mla",
      "attention.q_lora_rank",
      "attention.kv_lora_rank",
      "rope.scaling.finetuned",
      "rope.scaling.yarn_log_multiplier",
      "rope.scaling.yarn_beta_fast",
      "rope.scaling.yarn_beta_slow",
      "rope.scaling.yarn_ext_factor",
      "rope.scaling.yarn_attn_factor",
  });
  return keys;
}

// The routing fields of Glm4MoeConfig and DeepseekV3Config (every one written, as their defaults
// differ from llama.cpp's); no NextN layers (their tensors are not converted).
void grouped_moe_json(const GgufArch& a, nlohmann::ordered_json& j) {
  j["n_routed_experts"] = a.experts;
  j["num_experts_per_tok"] = a.experts_used;
  j["moe_intermediate_size"] = a.expert_ff;
  j["n_shared_experts"] = a.shared_experts;
  j["first_k_dense_replace"] = a.dense_lead;
  j["norm_topk_prob"] = a.expert_norm;
  j["routed_scaling_factor"] = shortest_f32(a.expert_scale);
  j["n_group"] = a.expert_groups;
  j["topk_group"] = a.groups_used;
  j["num_nextn_predict_layers"] = 0;
}

// GLM-4 MoE: Glm4MoeConfig's routing fields (every one written, as its defaults differ from
// llama.cpp's), partial rotary, q/k/v biases and q/k norms as found; no NextN layers (their
// tensors are not converted).
void glm4moe_json(const GgufArch& a, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = a.tied;
  j["attention_bias"] = a.qkv_bias;
  j["attention_dropout"] = 0.0;
  j["rope_theta"] = shortest_f32(a.rope_theta);
  j["partial_rotary_factor"] = static_cast<double>(a.rotary_dim) / static_cast<double>(a.head_dim);
  j["rope_scaling"] = rope_scaling_json(a);
  grouped_moe_json(a, j);
  j["use_qk_norm"] = a.qk_norm;
}

// DeepSeek-V3: DeepseekV3Config's MLA sizes, interleaved RoPE (llama.cpp's NORM rope), yarn with
// DeepSeek's mscale_all_dim and the rotation's magnitude 1 (read_deepseek2_yarn), the routing.
void deepseek2_json(const GgufArch& a, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = a.tied;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["q_lora_rank"] =
      a.q_lora_rank > 0 ? nlohmann::ordered_json(a.q_lora_rank) : nlohmann::ordered_json();
  j["kv_lora_rank"] = a.kv_lora_rank;
  j["qk_nope_head_dim"] = a.qk_nope;
  j["qk_rope_head_dim"] = a.rotary_dim;
  j["qk_head_dim"] = a.qk_nope + a.rotary_dim;
  j["v_head_dim"] = a.v_head_dim;
  j["rope_interleave"] = true;
  j["rope_theta"] = shortest_f32(a.rope_theta);
  if (a.rope_scaling.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", shortest_f32(a.rope_factor)},
                         {"original_max_position_embeddings", a.rope_original_context},
                         {"beta_fast", shortest_f32(a.yarn_beta_fast)},
                         {"beta_slow", shortest_f32(a.yarn_beta_slow)},
                         {"mscale", a.mscale_all_dim},
                         {"mscale_all_dim", a.mscale_all_dim},
                         {"attention_factor", 1.0}};
  }
  grouped_moe_json(a, j);
}

}  // namespace

// DeepSeek's MLA sizes (llama_model_deepseek2::load_arch_hparams / load_arch_tensors): with
// key_length_mla / value_length_mla (today's converter) the attention is MQA over the latent, so
// head_count_kv is 1, key_length kv_lora_rank + rope and value_length kv_lora_rank, and kv_b_proj
// comes as attn_k_b / attn_v_b; without them (older files) key_length / value_length are the
// per-head sizes, head_count_kv is head_count and kv_b_proj is attn_kv_b. rope.dimension_count
// is qk_rope_head_dim either way. config.json gets num_key_value_heads = num_attention_heads and
// head_dim = qk_rope_head_dim, as DeepseekV3Config writes them.
Status read_mla(const GgufFile& f, GgufArch* a) {
  const std::string p = "deepseek2.";
  MILES_ASSIGN_OR_RETURN(a->kv_lora_rank, f.get_int(p + "attention.kv_lora_rank"));
  MILES_ASSIGN_OR_RETURN(a->q_lora_rank, int_or(f, p + "attention.q_lora_rank", 0));
  MILES_ASSIGN_OR_RETURN(a->rotary_dim, f.get_int(p + "rope.dimension_count"));
  MILES_ASSIGN_OR_RETURN(const int64_t k_len, f.get_int(p + "attention.key_length"));
  MILES_ASSIGN_OR_RETURN(const int64_t v_len, f.get_int(p + "attention.value_length"));
  MILES_ASSIGN_OR_RETURN(const int64_t k_mla, int_or(f, p + "attention.key_length_mla", 0));
  MILES_ASSIGN_OR_RETURN(const int64_t v_mla, int_or(f, p + "attention.value_length_mla", 0));
  const std::pair<const char*, int64_t> sizes[] = {{"attention.kv_lora_rank", a->kv_lora_rank},
                                                   {"rope.dimension_count", a->rotary_dim},
                                                   {"attention.key_length", k_len},
                                                   {"attention.value_length", v_len}};
  for (const auto& [key, v] : sizes)
    if (v <= 0 || v > INT32_MAX)
      return key_error(f, p + key, "is " + std::to_string(v) + ", must be in [1, 2^31)");
  if (a->q_lora_rank < 0 || a->q_lora_rank > INT32_MAX)
    return key_error(f, p + "attention.q_lora_rank",
                     "is " + std::to_string(a->q_lora_rank) + ", must be in [1, 2^31)");
  if (a->rotary_dim % 2 != 0)
    return key_error(f, p + "rope.dimension_count",
                     "is " + std::to_string(a->rotary_dim) + "; qk_rope_head_dim must be even");
  if ((k_mla > 0) != (v_mla > 0))
    return key_error(f, p + (k_mla > 0 ? "attention.value_length_mla" : "attention.key_length_mla"),
                     "is missing while its key / value counterpart is given (llama.cpp needs both "
                     "for MLA)");
  a->mla_split = k_mla > 0;
  const int64_t k_head = a->mla_split ? k_mla : k_len;
  a->v_head_dim = a->mla_split ? v_mla : v_len;
  a->qk_nope = k_head - a->rotary_dim;
  if (a->qk_nope < 1 || a->v_head_dim < 1 || a->v_head_dim > INT32_MAX)
    return key_error(f, p + (a->mla_split ? "attention.key_length_mla" : "attention.key_length"),
                     "is " + std::to_string(k_head) + " with rope.dimension_count " +
                         std::to_string(a->rotary_dim) +
                         " (needs a per-head key longer than its rotary part)");
  if (a->mla_split) {
    if (a->kv_heads != 1)
      return key_error(f, p + "attention.head_count_kv",
                       "is " + std::to_string(a->kv_heads) +
                           "; llama.cpp's MLA form (key_length_mla given) is MQA over the latent "
                           "(1)");
    if (k_len != a->kv_lora_rank + a->rotary_dim || v_len != a->kv_lora_rank)
      return key_error(f, p + "attention.key_length",
                       "(" + std::to_string(k_len) + ") / value_length (" + std::to_string(v_len) +
                           ") must be kv_lora_rank + rope.dimension_count (" +
                           std::to_string(a->kv_lora_rank + a->rotary_dim) + ") / kv_lora_rank (" +
                           std::to_string(a->kv_lora_rank) + ") in llama.cpp's MLA form");
  } else if (a->kv_heads != a->heads) {
    return key_error(f, p + "attention.head_count_kv",
                     "is " + std::to_string(a->kv_heads) +
                         "; without key_length_mla (attn_kv_b) it must equal head_count (" +
                         std::to_string(a->heads) + ")");
  }
  a->kv_heads = a->heads;  // DeepseekV3Config: every head has its own expanded key / value
  a->head_dim = a->rotary_dim;
  return Status::Ok();
}

// DeepSeek's yarn as llama.cpp's deepseek2 graph computes it: the rotation scaled by
// rope.scaling.yarn_attn_factor (1: llama.cpp cancels ggml's own yarn magnitude), the attention
// scale by (1 + 0.1 * yarn_log_multiplier / 0.1 * ln(factor))^2, which is DeepseekV3Attention's
// mscale with mscale_all_dim = yarn_log_multiplier / 0.1 (its converter writes 0.1 *
// mscale_all_dim; the loader divides by 0.1). config.json then spells the rotation's magnitude as
// attention_factor 1. Linear scaling, another magnitude or extrapolation factor would compute
// something DeepseekV3Config cannot say.
Status read_deepseek2_yarn(const GgufFile& f, GgufArch* a) {
  const std::string p = "deepseek2.rope.scaling.";
  if (a->rope_scaling.empty()) return Status::Ok();  // freq_scale 1: the multiplier has no effect
  if (a->rope_scaling != "yarn")
    return key_error(f, p + "type",
                     "is '" + a->rope_scaling +
                         "'; llama.cpp's deepseek2 scales the attention of any scaled rope by "
                         "yarn's mscale, which DeepseekV3ForCausalLM does for yarn only");
  MILES_ASSIGN_OR_RETURN(const double log_mul, float_or(f, p + "yarn_log_multiplier", 0.0));
  a->mscale_all_dim = shortest_f32(static_cast<float>(log_mul) / 0.1f);
  if (!(std::isfinite(a->mscale_all_dim) && a->mscale_all_dim >= 0))
    return key_error(f, p + "yarn_log_multiplier", "must be a number >= 0");
  MILES_ASSIGN_OR_RETURN(a->yarn_beta_fast, float_or(f, p + "yarn_beta_fast", 32.0));
  MILES_ASSIGN_OR_RETURN(a->yarn_beta_slow, float_or(f, p + "yarn_beta_slow", 1.0));
  // llama.cpp's defaults: attn_factor 1, ext_factor -1 (yarn: 1).
  MILES_ASSIGN_OR_RETURN(const double attn, float_or(f, p + "yarn_attn_factor", 1.0));
  if (attn != 1.0)
    return key_error(f, p + "yarn_attn_factor",
                     "is " + num(attn) +
                         "; llama.cpp's deepseek2 scales the rotation and the attention by it, "
                         "which DeepseekV3Config cannot express (supported: 1)");
  MILES_ASSIGN_OR_RETURN(const double ext, float_or(f, p + "yarn_ext_factor", -1.0));
  if (ext != -1.0 && ext != 1.0)
    return key_error(f, p + "yarn_ext_factor",
                     "is " + num(ext) + "; only yarn's full extrapolation mix (1) is supported");
  return Status::Ok();
}

namespace {

Status in_range(const GgufFile& f, const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  return v >= lo && v <= hi ? Status::Ok()
                            : key_error(f, key,
                                        "is " + std::to_string(v) + ", must be in [" +
                                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// The experts' count, width and shared experts, and the leading dense layers (required by
// llama.cpp's glm4moe and deepseek2 loaders).
Status read_expert_sizes(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".";
  MILES_ASSIGN_OR_RETURN(a->experts, f.get_int(p + "expert_count"));
  MILES_RETURN_IF_ERROR(in_range(f, p + "expert_count", a->experts, 1, 1 << 20));
  MILES_ASSIGN_OR_RETURN(a->experts_used, f.get_int(p + "expert_used_count"));
  MILES_RETURN_IF_ERROR(in_range(f, p + "expert_used_count", a->experts_used, 1, a->experts));
  MILES_ASSIGN_OR_RETURN(a->expert_ff, f.get_int(p + "expert_feed_forward_length"));
  MILES_RETURN_IF_ERROR(in_range(f, p + "expert_feed_forward_length", a->expert_ff, 1, INT32_MAX));
  MILES_ASSIGN_OR_RETURN(a->shared_experts, f.get_int(p + "expert_shared_count"));
  MILES_RETURN_IF_ERROR(in_range(f, p + "expert_shared_count", a->shared_experts, 0, 1 << 10));
  // llama.cpp sizes the shared expert as expert_shared_count * expert_feed_forward_length.
  if (f.find(p + "expert_shared_feed_forward_length")) {
    MILES_ASSIGN_OR_RETURN(const int64_t v, f.get_int(p + "expert_shared_feed_forward_length"));
    if (v != a->shared_experts * a->expert_ff)
      return key_error(f, p + "expert_shared_feed_forward_length",
                       "is " + std::to_string(v) + " but " + a->gguf_arch + "'s shared expert is " +
                           "expert_shared_count * expert_feed_forward_length = " +
                           std::to_string(a->shared_experts * a->expert_ff));
  }
  MILES_ASSIGN_OR_RETURN(a->dense_lead, int_or(f, p + "leading_dense_block_count", 0));
  return in_range(f, p + "leading_dense_block_count", a->dense_lead, 0, a->layers);
}

// How the router weighs the experts it picks: the gating function (sigmoid only), the scale and
// the renormalisation.
Status read_routing(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".";
  // LLAMA_EXPERT_GATING_FUNC_TYPE: 0 none (glm4moe: sigmoid; deepseek2: softmax), 1 softmax, 2
  // sigmoid, 3 softmax over the chosen experts' logits.
  MILES_ASSIGN_OR_RETURN(const int64_t gating, int_or(f, p + "expert_gating_func", 0));
  if (a->deepseek2 && gating == 0)
    return key_error(f, p + "expert_gating_func",
                     std::string(f.find(p + "expert_gating_func") ? "is 0" : "is missing") +
                         ", which llama.cpp's deepseek2 reads as softmax routing (DeepSeek-V2 / "
                         "V2.5); only sigmoid (2) routing is supported, as DeepseekV3ForCausalLM "
                         "computes it");
  if (gating != 0 && gating != 2)
    return key_error(f, p + "expert_gating_func",
                     "is " + std::to_string(gating) +
                         (gating == 1   ? " (softmax)"
                          : gating == 3 ? " (softmax of the chosen experts)"
                                        : "") +
                         "; only sigmoid (2) routing is supported for " + a->gguf_arch + ", as " +
                         a->hf_class + " computes it");
  // Older llama.cpp requires the key (and scales by it); newer ones skip a missing or 0 scale.
  // glm4moe's converter always writes it, so a glm4moe file without it is refused rather than
  // guessed; deepseek2's writes it only where routed_scaling_factor is set (older loaders refuse
  // such a file, newer ones do not scale): 1.
  if (!f.find(p + "expert_weights_scale")) {
    if (!a->deepseek2)
      return key_error(f, p + "expert_weights_scale",
                       "is missing (llama.cpp versions disagree on its default; its converter "
                       "writes routed_scaling_factor here)");
    a->expert_scale = 1.0;
  } else {
    MILES_ASSIGN_OR_RETURN(a->expert_scale, f.get_float(p + "expert_weights_scale"));
  }
  if (!(std::isfinite(a->expert_scale) && a->expert_scale > 0))
    return key_error(f, p + "expert_weights_scale",
                     "is " + num(a->expert_scale) + ", must be a positive number");
  if (f.find(p + "expert_weights_norm")) {  // llama.cpp's default: false
    MILES_ASSIGN_OR_RETURN(a->expert_norm, f.get_bool(p + "expert_weights_norm"));
  }
  return Status::Ok();
}

// Group routing (expert_group_count > 1): only the expert_group_used_count groups with the best
// two-expert sums compete.
Status read_expert_groups(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".";
  MILES_ASSIGN_OR_RETURN(const int64_t groups, int_or(f, p + "expert_group_count", 0));
  MILES_ASSIGN_OR_RETURN(const int64_t used, int_or(f, p + "expert_group_used_count", 0));
  if (groups < 0) return key_error(f, p + "expert_group_count", "must be >= 0");
  if (groups > 1) {  // llama.cpp's group routing (and its load-time checks)
    if (a->experts % groups != 0 || a->experts / groups < 2)
      return key_error(f, p + "expert_group_count",
                       "(" + std::to_string(groups) + ") must divide expert_count (" +
                           std::to_string(a->experts) +
                           ") into groups of at least 2 (a group scores its best two)");
    MILES_RETURN_IF_ERROR(in_range(f, p + "expert_group_used_count", used, 1, groups - 1));
    if (a->experts_used > used * (a->experts / groups))
      return key_error(f, p + "expert_used_count",
                       "(" + std::to_string(a->experts_used) +
                           ") exceeds the experts of expert_group_used_count groups (" +
                           std::to_string(used * (a->experts / groups)) + ")");
    a->expert_groups = groups;
    a->groups_used = used;
  }
  return Status::Ok();
}

}  // namespace

// GLM-4 MoE as llama.cpp's glm4moe defines it (llama-model.cpp / models/glm4-moe.cpp and
// build_moe_ffn in llama-graph.cpp): sigmoid scores (expert_gating_func absent or 0 means sigmoid
// there too), the top experts chosen by score + exp_probs_b, weighted by their scores,
// renormalised when expert_weights_norm, times expert_weights_scale; with expert_group_count > 1
// only the expert_group_used_count groups with the best two-expert sums compete; a shared expert
// of expert_shared_count * expert_feed_forward_length; the first leading_dense_block_count layers
// dense. q/k/v biases and q/k norms are optional per tensor in llama.cpp; HF's attention_bias and
// use_qk_norm are all or nothing, so they are read from layer 0 and required on every layer.
// (Both mask the groups left out with -inf: transformers 5's Glm4MoeTopkRouter as llama.cpp.)
// DeepSeek-V3 as llama.cpp's deepseek2 defines it (models/deepseek2.cpp) routes the same way; its
// loader reads a missing or 0 expert_gating_func as softmax (DeepSeek-V2 / V2.5's routing, which
// DeepseekV3ForCausalLM does not compute) and a missing expert_weights_scale as no scaling; the
// shared expert is always expert_shared_count * expert_feed_forward_length wide.
Status read_grouped_moe(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".";
  const auto& known = a->glm4moe ? glm4moe_keys() : deepseek2_keys();
  if (const auto key = unknown_key(f, a->gguf_arch, known))
    return key_error(
        f, *key,
        "is not a key miles convert knows for " + a->gguf_arch + " (refused, not ignored)");
  MILES_RETURN_IF_ERROR(check_vocab_size(f, *a));
  const std::string sections = p + "rope.dimension_sections";
  if (f.find(sections)) {
    MILES_ASSIGN_OR_RETURN(const std::vector<int64_t> s, f.get_ints(sections));
    for (int64_t v : s)
      if (v != 0)
        return key_error(f, sections,
                         "is set (multimodal M-RoPE, GLM-4.5V); Glm4MoeForCausalLM rotates text "
                         "positions only");
  }
  MILES_RETURN_IF_ERROR(read_expert_sizes(f, a));
  MILES_RETURN_IF_ERROR(read_routing(f, a));
  MILES_RETURN_IF_ERROR(read_expert_groups(f, a));
  if (a->glm4moe) {
    a->qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
    a->qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  }
  return Status::Ok();
}

void grouped_moe_config_json(const GgufArch& a, nlohmann::ordered_json& j) {
  if (a.glm4moe) {
    glm4moe_json(a, j);
  } else {
    deepseek2_json(a, j);
  }
}

}  // namespace miles::gguf::detail
