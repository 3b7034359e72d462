// HF config.json -> ModelConfig, and the cross-field checks every consumer relies on.
//
// Why: a config is user input. Each key is read with its type checked (null counts as absent, as
// HF writes it), defaults follow transformers' for the architecture, and every error names the file
// and the key, so that a wrong config never reaches the model as a silently wrong number.
#include "miles/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "miles/json_text.h"
#include "nlohmann/json.hpp"

namespace miles {
namespace {

using json = nlohmann::json;

// A value for an error message: scalars as written, containers by kind (dump() of deeply nested
// input would recurse without bound).
std::string describe(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  return v.dump();
}

// Typed access to the keys of one JSON object; `where` prefixes key names ("rope_scaling.").
struct Reader {
  const json& obj;
  const std::string& source;
  std::string where;

  const json* find(const char* key) const {
    auto it = obj.find(key);
    return (it == obj.end() || it->is_null()) ? nullptr : &*it;
  }
  // Whether `key` is there as null (transformers' None), which find() reads as absent.
  bool is_null(const char* key) const {
    auto it = obj.find(key);
    return it != obj.end() && it->is_null();
  }
  Status error(const char* key, const std::string& what) const {
    return Status::Error(source + ": key '" + where + key + "' " + what);
  }
  Status read_int(const char* key, int64_t* out, bool required = false) const {
    const json* v = find(key);
    if (!v) return required ? error(key, "is required") : Status::Ok();
    if (v->is_number_integer() && !v->is_number_unsigned()) {
      *out = v->get<int64_t>();
    } else if (v->is_number_unsigned() && v->get<uint64_t>() <= INT64_MAX) {
      *out = static_cast<int64_t>(v->get<uint64_t>());
    } else {
      return error(key, "must be an integer, got " + describe(*v));
    }
    return Status::Ok();
  }
  Status read_double(const char* key, double* out) const {
    const json* v = find(key);
    if (!v) return Status::Ok();
    if (!v->is_number()) return error(key, "must be a number, got " + describe(*v));
    *out = v->get<double>();
    return Status::Ok();
  }
  Status read_bool(const char* key, bool* out) const {
    const json* v = find(key);
    if (!v) return Status::Ok();
    if (!v->is_boolean()) return error(key, "must be true or false, got " + describe(*v));
    *out = v->get<bool>();
    return Status::Ok();
  }
  // An integer or a list of integers (eos_token_id, mlp_only_layers).
  Status read_int_list(const char* key, std::vector<int64_t>* out) const {
    const json* v = find(key);
    if (!v) return Status::Ok();
    out->clear();
    for (const json& e : v->is_array() ? *v : json::array({*v})) {
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX))
        return error(key, "must hold integers, got " + describe(*v));
      out->push_back(e.get<int64_t>());
    }
    return Status::Ok();
  }
};

// bos_token_id, eos_token_id and pad_token_id over the family's defaults. null is transformers'
// None: no such token, whatever the default. A token id is >= 0, except pad_token_id, which every
// family hands to nn.Embedding as padding_idx: torch counts a negative one from the end (-1 is the
// last row) and refuses one outside [-vocab_size, vocab_size); it is stored as the row it names.
Status parse_token_ids(const Reader& r, ModelConfig* c) {
  if (r.is_null("bos_token_id")) c->bos_token_id = -1;
  if (r.is_null("eos_token_id")) c->eos_token_ids.clear();
  if (r.is_null("pad_token_id")) c->pad_token_id = -1;
  if (r.find("bos_token_id")) {
    MILES_RETURN_IF_ERROR(r.read_int("bos_token_id", &c->bos_token_id));
    if (c->bos_token_id < 0)
      return r.error("bos_token_id",
                     "is " + std::to_string(c->bos_token_id) + "; a token id is >= 0 (null: none)");
  }
  MILES_RETURN_IF_ERROR(r.read_int_list("eos_token_id", &c->eos_token_ids));
  for (const int64_t id : c->eos_token_ids)
    if (id < 0)
      return r.error("eos_token_id",
                     "holds " + std::to_string(id) + "; a token id is >= 0 (null: none)");
  if (r.find("pad_token_id")) {
    MILES_RETURN_IF_ERROR(r.read_int("pad_token_id", &c->pad_token_id));
    const int64_t pad = c->pad_token_id, vocab = c->vocab_size;
    if (pad < -vocab || pad >= vocab)
      return r.error("pad_token_id", "is " + std::to_string(pad) +
                                         ", the embedding's padding row: it must be in "
                                         "[-vocab_size, vocab_size) = [" +
                                         std::to_string(-vocab) + ", " + std::to_string(vocab) +
                                         ") (null: none)");
    if (pad < 0) c->pad_token_id = vocab + pad;
  }
  return Status::Ok();
}

Status parse_arch(const Reader& r, ModelConfig* c) {
  std::string name;
  if (const json* a = r.find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      return r.error("architectures", "must be a non-empty list of strings, got " + describe(*a));
    name = (*a)[0].get<std::string>();
  } else if (const json* t = r.find("model_type")) {
    if (!t->is_string()) return r.error("model_type", "must be a string, got " + describe(*t));
    const std::string type = t->get<std::string>();
    name = type == "llama"         ? "LlamaForCausalLM"
           : type == "qwen2"       ? "Qwen2ForCausalLM"
           : type == "qwen3"       ? "Qwen3ForCausalLM"
           : type == "qwen3_moe"   ? "Qwen3MoeForCausalLM"
           : type == "mistral"     ? "MistralForCausalLM"
           : type == "phi3"        ? "Phi3ForCausalLM"
           : type == "gemma3_text" ? "Gemma3ForCausalLM"
           : type == "glm4_moe"    ? "Glm4MoeForCausalLM"
           : type == "deepseek_v3" ? "DeepseekV3ForCausalLM"
                                   : "";
    if (name.empty()) return r.error("model_type", "has unsupported value '" + type + "'");
  } else {
    return r.error("architectures", "is required (or 'model_type')");
  }
  if (name == "LlamaForCausalLM") {
    c->arch = Arch::kLlama;
  } else if (name == "Qwen2ForCausalLM") {
    c->arch = Arch::kQwen2;
  } else if (name == "Qwen3ForCausalLM") {
    c->arch = Arch::kQwen3;
  } else if (name == "Qwen3MoeForCausalLM") {
    c->arch = Arch::kQwen3Moe;
  } else if (name == "MistralForCausalLM") {
    c->arch = Arch::kMistral;
  } else if (name == "Phi3ForCausalLM") {
    c->arch = Arch::kPhi3;
  } else if (name == "Gemma3ForCausalLM") {
    c->arch = Arch::kGemma3;
  } else if (name == "Glm4MoeForCausalLM") {
    c->arch = Arch::kGlm4Moe;
  } else if (name == "DeepseekV3ForCausalLM") {
    c->arch = Arch::kDeepseekV3;
  } else {
    return r.error(
        "architectures",
        "has unsupported value '" + name +
            "' (supported: DeepseekV3ForCausalLM, Gemma3ForCausalLM, Glm4MoeForCausalLM, "
            "LlamaForCausalLM, "
            "MistralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
            "Qwen3MoeForCausalLM)");
  }
  if (c->arch == Arch::kGemma3) {  // the text model's config (not Gemma3Config's text_config)
    const json* t = r.find("model_type");
    if (t && !(t->is_string() && *t == "gemma3_text"))
      return r.error("model_type", "is " + describe(*t) +
                                       "; Gemma3ForCausalLM reads a gemma3_text config (the "
                                       "multimodal gemma3 model is not supported)");
  }
  c->arch_name = name;
  return Status::Ok();
}

// Fields shared by `rope_scaling` and `rope_parameters`.
Status parse_rope_fields(const Reader& r, RopeConfig* rope) {
  std::string type = "default";
  const char* type_key = r.find("rope_type") ? "rope_type" : "type";
  if (const json* t = r.find(type_key)) {
    if (!t->is_string()) return r.error(type_key, "must be a string, got " + describe(*t));
    type = t->get<std::string>();
  }
  using T = RopeConfig::Type;
  if (type == "default") {
    rope->type = T::kDefault;
  } else if (type == "linear") {
    rope->type = T::kLinear;
  } else if (type == "dynamic") {
    rope->type = T::kDynamic;
  } else if (type == "llama3") {
    rope->type = T::kLlama3;
  } else if (type == "yarn") {
    rope->type = T::kYarn;
  } else {
    return r.error(type_key, "has unsupported rope type '" + type +
                                 "' (supported: default, linear, dynamic, llama3, yarn)");
  }
  if (rope->type != T::kDefault && !r.find("factor")) return r.error("factor", "is required");
  if (rope->type == T::kLlama3) {
    for (const char* key :
         {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!r.find(key)) return r.error(key, "is required for rope type llama3");
  }
  MILES_RETURN_IF_ERROR(r.read_double("rope_theta", &rope->theta));
  MILES_RETURN_IF_ERROR(r.read_double("partial_rotary_factor", &rope->partial_rotary_factor));
  MILES_RETURN_IF_ERROR(r.read_double("factor", &rope->factor));
  MILES_RETURN_IF_ERROR(r.read_double("low_freq_factor", &rope->low_freq_factor));
  MILES_RETURN_IF_ERROR(r.read_double("high_freq_factor", &rope->high_freq_factor));
  MILES_RETURN_IF_ERROR(
      r.read_int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  MILES_RETURN_IF_ERROR(r.read_double("beta_fast", &rope->beta_fast));
  MILES_RETURN_IF_ERROR(r.read_double("beta_slow", &rope->beta_slow));
  MILES_RETURN_IF_ERROR(r.read_double("attention_factor", &rope->attention_factor));
  MILES_RETURN_IF_ERROR(r.read_double("mscale", &rope->mscale));
  MILES_RETURN_IF_ERROR(r.read_double("mscale_all_dim", &rope->mscale_all_dim));
  return r.read_bool("truncate", &rope->truncate);
}

// rope_theta + rope_scaling (transformers v4) or rope_parameters (v5); the latter wins.
Status parse_rope(const Reader& r, RopeConfig* rope) {
  MILES_RETURN_IF_ERROR(r.read_double("rope_theta", &rope->theta));
  MILES_RETURN_IF_ERROR(r.read_double("partial_rotary_factor", &rope->partial_rotary_factor));
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json* v = r.find(key);
    if (!v) continue;
    if (!v->is_object()) return r.error(key, "must be an object or null, got " + describe(*v));
    return parse_rope_fields(Reader{*v, r.source, std::string(key) + "."}, rope);
  }
  return Status::Ok();
}

Status parse_moe(const Reader& r, MoeConfig* moe) {
  // transformers v5 writes num_experts as "num_local_experts".
  const char* experts_key = r.find("num_experts") ? "num_experts" : "num_local_experts";
  if (!r.find(experts_key)) return r.error("num_experts", "is required (or 'num_local_experts')");
  MILES_RETURN_IF_ERROR(r.read_int(experts_key, &moe->num_experts, true));
  MILES_RETURN_IF_ERROR(r.read_int("num_experts_per_tok", &moe->top_k, true));
  MILES_RETURN_IF_ERROR(r.read_int("moe_intermediate_size", &moe->moe_intermediate_size, true));
  MILES_RETURN_IF_ERROR(r.read_bool("norm_topk_prob", &moe->norm_topk_prob));
  MILES_RETURN_IF_ERROR(r.read_int("decoder_sparse_step", &moe->decoder_sparse_step));
  return r.read_int_list("mlp_only_layers", &moe->mlp_only_layers);
}

// Mistral's and Phi-3's sliding_window: every layer's (when the key is absent, MistralConfig's
// default is 4096 and Phi3Config's none; null: none). Their classes ignore layer_types, so a
// config that lists them is refused; they have no biases.
Status parse_window_on_every_layer(const Reader& r, ModelConfig* c) {
  const char* cls = c->arch == Arch::kMistral ? "MistralForCausalLM" : "Phi3ForCausalLM";
  if (r.find("layer_types"))
    return r.error("layer_types", "is given; " + std::string(cls) +
                                      " applies sliding_window to every layer and ignores it "
                                      "(remove it)");
  const int64_t absent = c->arch == Arch::kMistral ? 4096 : 0;
  c->sliding_window = r.obj.contains("sliding_window") ? 0 : absent;
  MILES_RETURN_IF_ERROR(r.read_int("sliding_window", &c->sliding_window));
  if (r.find("sliding_window") && c->sliding_window <= 0)
    return r.error("sliding_window",
                   "is " + std::to_string(c->sliding_window) + ", must be > 0 (or null: none)");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (const json* b = r.find(bias); b && b->is_boolean() && b->get<bool>())
      return r.error(bias, "is true; " + std::string(cls) + " has no biases");
  return Status::Ok();
}

// Phi-3: dropout in training only (0 only); its RoPE types other than default are longrope
// (Phi3Config renames su and yarn to longrope), which is not implemented.
Status parse_phi3(const Reader& r) {
  for (const char* key : {"resid_pdrop", "embd_pdrop"})
    if (const json* d = r.find(key); d && !(d->is_number() && d->get<double>() == 0))
      return r.error(key, "is " + describe(*d) + "; dropout is not supported (0 only)");
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json* v = r.find(key);
    if (!v || !v->is_object()) continue;
    for (const char* type_key : {"rope_type", "type"})
      if (auto t = v->find(type_key); t != v->end() && !(t->is_string() && *t == "default"))
        return r.error(key, std::string(".") + type_key + " is " + describe(*t) +
                                "; Phi-3's longrope (su / yarn) scaling is not supported "
                                "(default only)");
  }
  return Status::Ok();
}

// Gemma 3 (Gemma3TextConfig): GeGLU, a window on the layers layer_types (or the older
// sliding_window_pattern) names sliding, each kind of layer its own RoPE — rope_parameters keyed by
// layer type (transformers 5) or rope_theta + rope_scaling for the full layers and
// rope_local_base_freq for the sliding ones (v4) —, query_pre_attn_scalar, and softcapping,
// bidirectional attention and biases refused.
Status parse_gemma3(const Reader& r, ModelConfig* c) {
  c->activation = Activation::kGeluTanh;
  if (const json* a = r.find("hidden_activation");
      a && !(a->is_string() && *a == "gelu_pytorch_tanh"))
    return r.error("hidden_activation",
                   "is " + describe(*a) + "; only \"gelu_pytorch_tanh\" (GeGLU) is supported");
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
    if (const json* v = r.find(key))
      return r.error(key, "is " + describe(*v) + "; softcapping is not supported (null only)");
  for (const char* key : {"use_bidirectional_attention", "attention_bias"})
    if (const json* b = r.find(key); b && !(b->is_boolean() && !b->get<bool>()))
      return r.error(key, "is " + describe(*b) + "; only false is supported");
  c->query_pre_attn_scalar = 256;
  MILES_RETURN_IF_ERROR(r.read_double("query_pre_attn_scalar", &c->query_pre_attn_scalar));
  if (!(c->query_pre_attn_scalar > 0)) return r.error("query_pre_attn_scalar", "must be positive");
  c->sliding_window = 4096;
  MILES_RETURN_IF_ERROR(r.read_int("sliding_window", &c->sliding_window));
  if (c->sliding_window <= 0) return r.error("sliding_window", "must be positive");
  int64_t pattern = 6;
  MILES_RETURN_IF_ERROR(r.read_int("sliding_window_pattern", &pattern));
  if (pattern <= 0) return r.error("sliding_window_pattern", "must be positive");
  c->sliding_layers.assign(static_cast<size_t>(std::max<int64_t>(c->num_layers, 0)), false);
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c->num_layers)
      return r.error("layer_types", "must list num_hidden_layers entries, got " + describe(*lt));
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (!(e.is_string() && (e == "sliding_attention" || e == "full_attention")))
        return r.error("layer_types", "[" + std::to_string(i) + "] is " + describe(e) +
                                          "; sliding_attention or full_attention");
      c->sliding_layers[i] = e == "sliding_attention";
    }
  } else {
    for (int64_t i = 0; i < c->num_layers; ++i) c->sliding_layers[i] = (i + 1) % pattern != 0;
  }
  // RoPE: the full layers' (rope_theta, default 1e6, and rope_scaling) and the sliding layers'
  // (rope_local_base_freq, default 1e4, default type); rope_parameters keyed by layer type wins.
  c->rope.theta = 1e6;
  c->rope_local.theta = 1e4;
  MILES_RETURN_IF_ERROR(r.read_double("rope_theta", &c->rope.theta));
  MILES_RETURN_IF_ERROR(r.read_double("rope_local_base_freq", &c->rope_local.theta));
  if (r.find("partial_rotary_factor"))
    return r.error("partial_rotary_factor", "is given; Gemma 3 rotates whole heads");
  if (const json* v = r.find("rope_scaling")) {
    if (!v->is_object()) return r.error("rope_scaling", "must be an object or null");
    MILES_RETURN_IF_ERROR(parse_rope_fields(Reader{*v, r.source, "rope_scaling."}, &c->rope));
  }
  if (const json* v = r.find("rope_parameters")) {
    if (!v->is_object()) return r.error("rope_parameters", "must be an object or null");
    for (const auto& [type, params] : v->items()) {
      RopeConfig* rope = type == "full_attention"      ? &c->rope
                         : type == "sliding_attention" ? &c->rope_local
                                                       : nullptr;
      if (!rope)
        return r.error("rope_parameters", "has key '" + type +
                                              "'; Gemma 3's are full_attention and "
                                              "sliding_attention");
      if (params.is_null()) continue;
      if (!params.is_object()) return r.error("rope_parameters", "." + type + " must be an object");
      MILES_RETURN_IF_ERROR(
          parse_rope_fields(Reader{params, r.source, "rope_parameters." + type + "."}, rope));
    }
  }
  if (c->rope_local.partial_rotary_factor != 1 || c->rope.partial_rotary_factor != 1)
    return r.error("rope_parameters", "sets partial_rotary_factor; Gemma 3 rotates whole heads");
  return Status::Ok();
}

// GLM-4 MoE's and DeepSeek-V3's MoE (their config classes' defaults where a key is absent):
// sigmoid routing with a score-correction bias among n_group groups, a shared expert, dense layers
// below first_k_dense_replace. Their multi-token-prediction layers (num_nextn_predict_layers) are
// not part of the causal LM (transformers skips their tensors).
Status parse_grouped_moe(const Reader& r, ModelConfig* c) {
  MoeConfig& m = c->moe;
  const bool glm = c->arch == Arch::kGlm4Moe;
  m.score = RouterScore::kSigmoid;
  m.num_experts = glm ? 128 : 256;
  m.top_k = 8;
  m.moe_intermediate_size = glm ? 1408 : 2048;
  m.norm_topk_prob = true;
  m.n_shared_experts = 1;
  m.first_k_dense_replace = glm ? 1 : 3;
  m.routed_scaling_factor = glm ? 1.0 : 2.5;
  m.n_group = glm ? 1 : 8;
  m.topk_group = glm ? 1 : 4;
  const char* experts_key = r.find("n_routed_experts") ? "n_routed_experts" : "num_local_experts";
  MILES_RETURN_IF_ERROR(r.read_int(experts_key, &m.num_experts));
  MILES_RETURN_IF_ERROR(r.read_int("num_experts_per_tok", &m.top_k));
  MILES_RETURN_IF_ERROR(r.read_int("moe_intermediate_size", &m.moe_intermediate_size));
  MILES_RETURN_IF_ERROR(r.read_bool("norm_topk_prob", &m.norm_topk_prob));
  MILES_RETURN_IF_ERROR(r.read_int("n_shared_experts", &m.n_shared_experts));
  MILES_RETURN_IF_ERROR(r.read_double("routed_scaling_factor", &m.routed_scaling_factor));
  MILES_RETURN_IF_ERROR(r.read_int("n_group", &m.n_group));
  MILES_RETURN_IF_ERROR(r.read_int("topk_group", &m.topk_group));
  MILES_RETURN_IF_ERROR(r.read_int("first_k_dense_replace", &m.first_k_dense_replace));
  if (glm) MILES_RETURN_IF_ERROR(r.read_bool("use_qk_norm", &c->use_qk_norm));
  for (const char* key : {"decoder_sparse_step", "mlp_only_layers"})
    if (r.find(key))
      return r.error(key, "is given; " + c->arch_name +
                              " places its MoE layers by first_k_dense_replace and ignores it "
                              "(remove it)");
  // DeepSeek's own config.json names its routing; V3's is the only one implemented.
  for (const auto& [key, want] :
       {std::pair{"topk_method", "noaux_tc"}, std::pair{"scoring_func", "sigmoid"}})
    if (const json* v = r.find(key); v && !(v->is_string() && *v == want))
      return r.error(key, "is " + describe(*v) + "; only \"" + want +
                              "\" (DeepSeek-V3's routing) is supported");
  return Status::Ok();
}

// DeepSeek-V3's MLA (DeepseekV3Config's defaults where a key is absent): the attention runs over
// one latent head of width qk_rope_head_dim + kv_lora_rank (MlaConfig), so num_kv_heads and
// head_dim become those; config.json's num_key_value_heads is kept for the writer.
Status parse_mla(const Reader& r, ModelConfig* c) {
  MlaConfig& a = c->mla;
  a.q_lora_rank = 1536;
  a.kv_lora_rank = 512;
  a.qk_nope_head_dim = 128;
  a.qk_rope_head_dim = 64;
  a.v_head_dim = 128;
  if (r.is_null("q_lora_rank")) a.q_lora_rank = 0;
  MILES_RETURN_IF_ERROR(r.read_int("q_lora_rank", &a.q_lora_rank));
  MILES_RETURN_IF_ERROR(r.read_int("kv_lora_rank", &a.kv_lora_rank));
  MILES_RETURN_IF_ERROR(r.read_int("qk_nope_head_dim", &a.qk_nope_head_dim));
  MILES_RETURN_IF_ERROR(r.read_int("qk_rope_head_dim", &a.qk_rope_head_dim));
  MILES_RETURN_IF_ERROR(r.read_int("v_head_dim", &a.v_head_dim));
  MILES_RETURN_IF_ERROR(r.read_bool("rope_interleave", &a.rope_interleave));
  for (const auto& [key, v] :
       {std::pair{"kv_lora_rank", a.kv_lora_rank},
        std::pair{"qk_nope_head_dim", a.qk_nope_head_dim},
        std::pair{"qk_rope_head_dim", a.qk_rope_head_dim}, std::pair{"v_head_dim", a.v_head_dim}})
    if (v <= 0 || v > INT32_MAX) return r.error(key, "must be in [1, 2^31)");
  if (a.q_lora_rank < 0 || a.q_lora_rank > INT32_MAX)
    return r.error("q_lora_rank", "must be null or in [1, 2^31)");
  if (a.qk_rope_head_dim % 2 != 0) return r.error("qk_rope_head_dim", "must be even");
  if (c->attention_bias)
    return r.error("attention_bias", "is true; DeepSeek-V3's attention biases are not supported");
  if (c->rope.partial_rotary_factor != 1)
    return r.error("partial_rotary_factor", "is given; DeepSeek-V3 rotates qk_rope_head_dim");
  // Its attention expands the latent to every head: transformers would repeat those again.
  if (c->num_kv_heads != c->num_heads)
    return r.error("num_key_value_heads", "(" + std::to_string(c->num_kv_heads) +
                                              ") must equal num_attention_heads (" +
                                              std::to_string(c->num_heads) + ") for MLA");
  a.num_key_value_heads = c->num_kv_heads;
  c->num_kv_heads = 1;
  c->head_dim = a.qk_rope_head_dim + a.kv_lora_rank;
  return Status::Ok();
}

Status parse_fields(const Reader& r, ModelConfig* c) {
  MILES_RETURN_IF_ERROR(parse_arch(r, c));
  if (const json* w = r.find("use_sliding_window"); w && w->is_boolean() && w->get<bool>())
    return r.error("use_sliding_window", "is true; sliding-window attention is not supported");
  if (c->arch == Arch::kMistral || c->arch == Arch::kPhi3)
    MILES_RETURN_IF_ERROR(parse_window_on_every_layer(r, c));
  if (c->arch == Arch::kPhi3) MILES_RETURN_IF_ERROR(parse_phi3(r));
  // transformers 5 lists each layer's attention; every one must be full (causal) attention
  // (Gemma 3's are read with its window).
  if (const json* lt = r.find("layer_types"); lt && c->arch != Arch::kGemma3) {
    if (!lt->is_array()) return r.error("layer_types", "must be a list, got " + describe(*lt));
    for (size_t i = 0; i < lt->size(); ++i)
      if (!((*lt)[i].is_string() && (*lt)[i] == "full_attention"))
        return r.error("layer_types", "[" + std::to_string(i) + "] is " + describe((*lt)[i]) +
                                          "; only full_attention is supported");
  }
  MILES_RETURN_IF_ERROR(r.read_int("vocab_size", &c->vocab_size, true));
  MILES_RETURN_IF_ERROR(r.read_int("hidden_size", &c->hidden_size, true));
  MILES_RETURN_IF_ERROR(r.read_int("intermediate_size", &c->intermediate_size, true));
  MILES_RETURN_IF_ERROR(r.read_int("num_hidden_layers", &c->num_layers, true));
  MILES_RETURN_IF_ERROR(r.read_int("num_attention_heads", &c->num_heads, true));
  c->num_kv_heads = c->num_heads;
  MILES_RETURN_IF_ERROR(r.read_int("num_key_value_heads", &c->num_kv_heads));
  if (c->arch == Arch::kGemma3) c->head_dim = 256;  // Gemma3TextConfig's default
  if (r.find("head_dim") || c->arch == Arch::kGemma3) {
    MILES_RETURN_IF_ERROR(r.read_int("head_dim", &c->head_dim));
  } else if (c->num_heads > 0 && c->hidden_size % c->num_heads != 0) {
    return r.error("num_attention_heads",
                   "(" + std::to_string(c->num_heads) + ") must divide hidden_size (" +
                       std::to_string(c->hidden_size) + ") when head_dim is not given");
  } else if (c->num_heads > 0) {
    c->head_dim = c->hidden_size / c->num_heads;
  }
  c->max_position_embeddings = c->arch == Arch::kLlama        ? 2048
                               : c->arch == Arch::kMistral    ? 131072
                               : c->arch == Arch::kPhi3       ? 4096
                               : c->arch == Arch::kGemma3     ? 131072
                               : c->arch == Arch::kGlm4Moe    ? 131072
                               : c->arch == Arch::kDeepseekV3 ? 4096
                                                              : 32768;
  MILES_RETURN_IF_ERROR(r.read_int("max_position_embeddings", &c->max_position_embeddings));
  if (c->arch == Arch::kGlm4Moe) c->rms_norm_eps = 1e-5;  // Glm4MoeConfig's default
  MILES_RETURN_IF_ERROR(r.read_double("rms_norm_eps", &c->rms_norm_eps));
  c->tie_word_embeddings = c->arch == Arch::kGemma3;  // Gemma3TextConfig's default
  MILES_RETURN_IF_ERROR(r.read_bool("tie_word_embeddings", &c->tie_word_embeddings));
  MILES_RETURN_IF_ERROR(r.read_bool("attention_bias", &c->attention_bias));
  // Qwen2 always has q/k/v biases and none on o_proj: transformers' Qwen2 ignores attention_bias
  // (a config may carry it, e.g. false, from a generic template), and so does this.
  if (c->arch == Arch::kQwen2) c->attention_bias = true;
  MILES_RETURN_IF_ERROR(r.read_bool("mlp_bias", &c->mlp_bias));
  // Fields that change the numbers and are not implemented are refused, never dropped.
  if (c->mlp_bias && c->arch != Arch::kLlama)
    return r.error("mlp_bias", "is true; MLP biases are implemented for Llama's dense MLP only");
  if (const json* d = r.find("attention_dropout"); d && !(d->is_number() && d->get<double>() == 0))
    return r.error("attention_dropout",
                   "is " + describe(*d) + "; dropout is not supported (0 only)");
  if (const json* o = r.find("output_router_logits"); o && o->is_boolean() && o->get<bool>())
    return r.error("output_router_logits",
                   "is true; the router's auxiliary loss is not supported (false only)");
  // Gemma 3 reads hidden_activation (parse_gemma3) and ignores hidden_act, as transformers does.
  if (const json* act = r.find("hidden_act");
      act && c->arch != Arch::kGemma3 && !(act->is_string() && *act == "silu"))
    return r.error("hidden_act", "is " + describe(*act) + "; only \"silu\" (SwiGLU) is supported");
  if (c->arch == Arch::kGemma3) {
    c->bos_token_id = 2;  // Gemma3TextConfig's defaults
    c->eos_token_ids = {1};
  }
  if (c->arch == Arch::kDeepseekV3) {
    c->bos_token_id = 0;  // DeepseekV3Config's defaults
    c->eos_token_ids = {1};
  }
  if (c->arch == Arch::kGemma3) c->pad_token_id = 0;  // Gemma3TextConfig's default
  MILES_RETURN_IF_ERROR(parse_token_ids(r, c));
  if (c->arch == Arch::kGemma3) {
    MILES_RETURN_IF_ERROR(parse_gemma3(r, c));
  } else {
    if (c->arch == Arch::kGlm4Moe) c->rope.partial_rotary_factor = 0.5;  // Glm4MoeConfig's
    MILES_RETURN_IF_ERROR(parse_rope(r, &c->rope));
  }
  c->rope.max_position_embeddings = c->max_position_embeddings;
  c->rope_local.max_position_embeddings = c->max_position_embeddings;
  if (c->arch == Arch::kQwen3Moe) MILES_RETURN_IF_ERROR(parse_moe(r, &c->moe));
  if (c->arch == Arch::kGlm4Moe || c->arch == Arch::kDeepseekV3)
    MILES_RETURN_IF_ERROR(parse_grouped_moe(r, c));
  if (c->arch == Arch::kDeepseekV3) MILES_RETURN_IF_ERROR(parse_mla(r, c));
  return Status::Ok();
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (arch == Arch::kGlm4Moe || arch == Arch::kDeepseekV3)
    return moe.num_experts > 0 && layer >= moe.first_k_dense_replace;
  if (arch != Arch::kQwen3Moe || moe.num_experts <= 0 || moe.decoder_sparse_step <= 0) return false;
  const auto& only = moe.mlp_only_layers;
  if (std::find(only.begin(), only.end(), layer) != only.end()) return false;
  return (layer + 1) % moe.decoder_sparse_step == 0;
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

float ModelConfig::attention_scale() const {
  if (is_mla()) {  // (qk_nope + qk_rope)^-1/2, times yarn's mscale squared with mscale_all_dim
    double s = std::pow(static_cast<double>(mla.qk_nope_head_dim + mla.qk_rope_head_dim), -0.5);
    if (rope.type != RopeConfig::Type::kDefault && rope.mscale_all_dim != 0 && rope.factor > 1) {
      const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
      s = s * m * m;
    }
    return static_cast<float>(s);
  }
  if (query_pre_attn_scalar > 0) return static_cast<float>(std::pow(query_pre_attn_scalar, -0.5));
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

float ModelConfig::embed_scale() const {
  return arch == Arch::kGemma3 ? static_cast<float>(std::sqrt(static_cast<double>(hidden_size)))
                               : 1.0f;
}

int64_t ModelConfig::rotary_dim() const {
  if (is_mla()) return mla.qk_rope_head_dim;
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

Status ModelConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& key, const std::string& what) {
    return Status::Error(source + ": key '" + key + "' " + what);
  };
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings}};
  for (const auto& [key, v] : positive)  // the bound keeps products of sizes within int64
    if (v <= 0 || v > INT32_MAX) return fail(key, "must be in [1, 2^31), got " + str(v));
  if (num_heads % num_kv_heads != 0)
    return fail(
        "num_key_value_heads",
        "(" + str(num_kv_heads) + ") must divide num_attention_heads (" + str(num_heads) + ")");
  if (!(rms_norm_eps > 0)) return fail("rms_norm_eps", "must be positive");
  if (!(rope.theta > 0)) return fail("rope_theta", "must be positive");
  if (arch == Arch::kGemma3 && !(rope_local.theta > 0))
    return fail("rope_local_base_freq", "must be positive");
  if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1))
    return fail("partial_rotary_factor", "must be in (0, 1]");
  const int64_t rd = rotary_dim();
  if (rd <= 0 || rd % 2 != 0)
    return fail("partial_rotary_factor", "gives rotary_dim " + str(rd) + " (head_dim " +
                                             str(head_dim) + "); it must be even and positive");
  if (rope.type != RopeConfig::Type::kDefault && !(rope.factor > 0))
    return fail("rope_scaling.factor", "must be positive");
  if (rope.type == RopeConfig::Type::kLlama3 && (!(rope.high_freq_factor > rope.low_freq_factor) ||
                                                 rope.original_max_position_embeddings <= 0))
    return fail("rope_scaling",
                "llama3 needs high_freq_factor > low_freq_factor and a positive "
                "original_max_position_embeddings");
  if (arch != Arch::kQwen3Moe && arch != Arch::kGlm4Moe && arch != Arch::kDeepseekV3)
    return Status::Ok();
  const bool glm = arch != Arch::kQwen3Moe;
  if (moe.num_experts <= 0)
    return fail(glm ? "n_routed_experts" : "num_experts",
                "must be positive, got " + str(moe.num_experts));
  if (moe.top_k <= 0 || moe.top_k > moe.num_experts)
    return fail("num_experts_per_tok", "(" + str(moe.top_k) + ") must be in [1, num_experts = " +
                                           str(moe.num_experts) + "]");
  if (moe.moe_intermediate_size <= 0) return fail("moe_intermediate_size", "must be positive");
  if (glm) return validate_grouped_routing(source);
  if (moe.decoder_sparse_step <= 0) return fail("decoder_sparse_step", "must be positive");
  for (int64_t l : moe.mlp_only_layers)
    if (l < 0 || l >= num_layers)
      return fail("mlp_only_layers",
                  "holds " + str(l) + ", not a layer in [0, " + str(num_layers) + ")");
  return Status::Ok();
}

Status ModelConfig::validate_grouped_routing(const std::string& source) const {
  auto fail = [&](const std::string& key, const std::string& what) {
    return Status::Error(source + ": key '" + key + "' " + what);
  };
  const MoeConfig& m = moe;
  if (m.n_group <= 0 || m.num_experts % m.n_group != 0)
    return fail("n_group", "(" + str(m.n_group) + ") must divide n_routed_experts (" +
                               str(m.num_experts) + ")");
  if (m.num_experts / m.n_group < 2)
    return fail("n_group", "leaves " + str(m.num_experts / m.n_group) +
                               " expert per group; a group's score sums its best two");
  if (m.topk_group <= 0 || m.topk_group > m.n_group)
    return fail("topk_group",
                "(" + str(m.topk_group) + ") must be in [1, n_group = " + str(m.n_group) + "]");
  if (m.top_k > m.topk_group * (m.num_experts / m.n_group))
    return fail("num_experts_per_tok", "(" + str(m.top_k) + ") exceeds the experts of topk_group " +
                                           "groups (" +
                                           str(m.topk_group * (m.num_experts / m.n_group)) + ")");
  if (m.n_shared_experts < 0) return fail("n_shared_experts", "must be >= 0");
  if (m.first_k_dense_replace < 0) return fail("first_k_dense_replace", "must be >= 0");
  if (!(std::isfinite(m.routed_scaling_factor) && m.routed_scaling_factor > 0))
    return fail("routed_scaling_factor", "must be positive");
  return Status::Ok();
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  auto parsed = parse_json_text(json_text);
  if (!parsed.ok()) return Status::Error(source + ": not valid JSON: " + parsed.message());
  const json& j = *parsed;
  if (!j.is_object()) return Status::Error(source + ": config must be a JSON object");
  ModelConfig c;
  MILES_RETURN_IF_ERROR(parse_fields(Reader{j, source, ""}, &c));
  MILES_RETURN_IF_ERROR(c.validate(source));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open model config");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::Error(path + ": read error");
  return parse_model_config(text.str(), path);
}

}  // namespace miles
