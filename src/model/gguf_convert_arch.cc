// GGUF `<arch>.*` metadata -> GgufArch -> config.json / generation_config.json.
//
// Why: config.json must describe exactly the weights the conversion writes. llama.cpp's keys map
// one to one onto HF's for the supported architectures (llama, phi3, qwen2, qwen3, gemma3,
// glm4moe, deepseek2: for Gemma 3 llama.cpp also fixes the window pattern, the sliding layers' RoPE
// base and the attention scale in its code, which become layer_types, rope_local_base_freq and
// query_pre_attn_scalar; for GLM-4 MoE the expert_* keys become Glm4MoeConfig's routing fields and
// its NextN blocks are dropped from num_hidden_layers; DeepSeek's MLA sizes, written by llama.cpp
// for its MQA-over-the-latent form, become DeepseekV3Config's ranks and head sizes, and its yarn
// log multiplier mscale_all_dim); everything a plain HF config of those
// classes cannot express (MoE outside glm4moe, llama3 rope_freqs, partial rotary outside phi3 and
// glm4moe, unknown rope scaling, softcapping, gating other than sigmoid, DeepSeek-V2's softmax
// routing) is refused here with an
// error naming the file and the key, rather than converted into a model that computes something
// else. The glm4moe and deepseek2 readers (grouped MoE routing, DeepSeek's MLA) are in
// gguf_convert_moe.cc.
#include "model/gguf_convert_arch.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include "miles/convert.h"
#include "model/gguf_convert_arch_internal.h"
#include "nlohmann/json.hpp"

namespace miles::gguf {
namespace detail {

Result<int64_t> int_or(const GgufFile& f, const std::string& key, int64_t fallback) {
  if (!f.find(key)) return fallback;
  return f.get_int(key);
}

Result<double> float_or(const GgufFile& f, const std::string& key, double fallback) {
  if (!f.find(key)) return fallback;
  return f.get_float(key);
}

// The shortest decimal spelling of `v` that reads back as it ("30", "0.5").
std::string num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

Status key_error(const GgufFile& f, const std::string& key, const std::string& what) {
  return Status::Error(f.path() + ": metadata key '" + key + "' " + what);
}

// `<arch>.vocab_size`, where given, must be token_embd.weight's rows.
Status check_vocab_size(const GgufFile& f, const GgufArch& a) {
  const std::string key = a.gguf_arch + ".vocab_size";
  if (!f.find(key)) return Status::Ok();
  MILES_ASSIGN_OR_RETURN(const int64_t v, f.get_int(key));
  if (v != a.vocab)
    return key_error(f, key,
                     "is " + std::to_string(v) + " but token_embd.weight has " +
                         std::to_string(a.vocab) + " rows");
  return Status::Ok();
}

// Every <arch>.* key of a plain text model that llama.cpp's converter (TextModel) writes, and
// `more`.
std::set<std::string> text_model_keys(std::initializer_list<const char*> more) {
  std::set<std::string> keys = {
      "context_length",
      "embedding_length",
      "block_count",
      "feed_forward_length",
      "vocab_size",
      "attention.head_count",
      "attention.head_count_kv",
      "attention.key_length",
      "attention.value_length",
      "attention.layer_norm_rms_epsilon",
      "rope.dimension_count",
      "rope.freq_base",
      "rope.scaling.type",
      "rope.scaling.factor",
      "rope.scaling.original_context_length",
  };
  keys.insert(more.begin(), more.end());
  return keys;
}

std::optional<std::string> unknown_key(const GgufFile& f, const std::string& arch,
                                       const std::set<std::string>& known) {
  const std::string p = arch + ".";
  for (const auto& [key, value] : f.metadata())
    if (key.rfind(p, 0) == 0 && !known.count(key.substr(p.size()))) return key;
  return std::nullopt;
}

nlohmann::ordered_json rope_scaling_json(const GgufArch& a) {
  if (a.rope_scaling.empty()) return nullptr;
  nlohmann::ordered_json s = {{"rope_type", a.rope_scaling},
                              {"factor", shortest_f32(a.rope_factor)}};
  if (a.rope_scaling == "yarn") s["original_max_position_embeddings"] = a.rope_original_context;
  return s;
}

}  // namespace detail

namespace {

using namespace detail;

Result<std::string> string_or(const GgufFile& f, const std::string& key, std::string fallback) {
  if (!f.find(key)) return fallback;
  return f.get_string(key);
}

// Architecture-specific class names and conventions.
Status set_family(const GgufFile& f, GgufArch* a) {
  if (a->gguf_arch == "llama") {
    a->hf_class = "LlamaForCausalLM";
    a->model_type = "llama";
    a->permuted_qk = true;  // convert_hf_to_gguf.py's LlamaModel permutes q/k
  } else if (a->gguf_arch == "phi3") {
    a->hf_class = "Phi3ForCausalLM";  // its converter keeps qkv_proj and gate_up_proj fused
    a->model_type = "phi3";
    a->fused = true;
  } else if (a->gguf_arch == "qwen2") {
    a->hf_class = "Qwen2ForCausalLM";  // its converter keeps HF's q/k row order
    a->model_type = "qwen2";
    a->qkv_bias = true;
  } else if (a->gguf_arch == "qwen3") {
    a->hf_class = "Qwen3ForCausalLM";
    a->model_type = "qwen3";
    a->qk_norm = true;
  } else if (a->gguf_arch == "gemma3") {
    a->hf_class = "Gemma3ForCausalLM";  // the text model; its converter keeps HF's q/k row order
    a->model_type = "gemma3_text";
    a->qk_norm = true;
    a->gemma3 = true;
  } else if (a->gguf_arch == "glm4moe") {
    // Its converter keeps HF's q/k row order: llama.cpp runs glm4moe with NeoX RoPE, which rotates
    // the pairs (i, i + rotary_dim / 2) of the leading rotary_dim dimensions, as HF does.
    a->hf_class = "Glm4MoeForCausalLM";
    a->model_type = "glm4_moe";
    a->glm4moe = true;
  } else if (a->gguf_arch == "deepseek2") {
    // Its converter keeps HF's rows: llama.cpp runs deepseek2 with LLAMA_ROPE_TYPE_NORM, rotating
    // adjacent pairs (2i, 2i + 1) of q_pe / k_pe, which is DeepSeek's rope_interleave layout.
    a->hf_class = "DeepseekV3ForCausalLM";
    a->model_type = "deepseek_v3";
    a->deepseek2 = true;
  } else {
    return key_error(f, "general.architecture",
                     "is '" + a->gguf_arch +
                         "', which miles convert does not support (supported: llama, phi3, qwen2, "
                         "qwen3, gemma3, glm4moe, deepseek2)");
  }
  return Status::Ok();
}

Status read_sizes(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".";
  MILES_ASSIGN_OR_RETURN(a->layers, f.get_int(p + "block_count"));
  MILES_ASSIGN_OR_RETURN(a->hidden, f.get_int(p + "embedding_length"));
  MILES_ASSIGN_OR_RETURN(a->intermediate, f.get_int(p + "feed_forward_length"));
  MILES_ASSIGN_OR_RETURN(a->heads, f.get_int(p + "attention.head_count"));
  MILES_ASSIGN_OR_RETURN(a->kv_heads, int_or(f, p + "attention.head_count_kv", a->heads));
  MILES_ASSIGN_OR_RETURN(a->context, int_or(f, p + "context_length", 2048));
  MILES_ASSIGN_OR_RETURN(a->rms_eps, f.get_float(p + "attention.layer_norm_rms_epsilon"));
  MILES_ASSIGN_OR_RETURN(a->rope_theta, float_or(f, p + "rope.freq_base", 10000.0));
  const std::pair<const char*, int64_t> positive[] = {{"block_count", a->layers},
                                                      {"embedding_length", a->hidden},
                                                      {"feed_forward_length", a->intermediate},
                                                      {"attention.head_count", a->heads},
                                                      {"attention.head_count_kv", a->kv_heads},
                                                      {"context_length", a->context}};
  for (const auto& [key, v] : positive)
    if (v <= 0 || v > INT32_MAX)
      return key_error(f, p + key, "is " + std::to_string(v) + ", must be in [1, 2^31)");
  if (a->grouped_moe()) {  // NextN blocks follow the causal LM's layers (llama.cpp skips them too)
    MILES_ASSIGN_OR_RETURN(a->nextn_layers, int_or(f, p + "nextn_predict_layers", 0));
    if (a->nextn_layers < 0 || a->nextn_layers >= a->layers)
      return key_error(f, p + "nextn_predict_layers",
                       "is " + std::to_string(a->nextn_layers) +
                           ", must be in [0, block_count = " + std::to_string(a->layers) + ")");
    a->layers -= a->nextn_layers;
  }
  if (a->heads % a->kv_heads != 0)
    return key_error(f, p + "attention.head_count_kv",
                     "(" + std::to_string(a->kv_heads) + ") must divide attention.head_count (" +
                         std::to_string(a->heads) + ")");
  if (!(a->rms_eps > 0)) return key_error(f, p + "attention.layer_norm_rms_epsilon", "must be > 0");
  if (!(a->rope_theta > 0)) return key_error(f, p + "rope.freq_base", "must be > 0");
  MILES_ASSIGN_OR_RETURN(const int64_t experts, int_or(f, p + "expert_count", 0));
  if (experts > 0 && !a->grouped_moe())
    return key_error(f, p + "expert_count",
                     "is " + std::to_string(experts) +
                         "; mixture-of-experts GGUF models are not "
                         "supported by miles convert for " +
                         a->gguf_arch + " (only glm4moe and deepseek2)");
  return Status::Ok();
}

Status read_head_dim(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".";
  const int64_t even_split = a->hidden % a->heads == 0 ? a->hidden / a->heads : 0;
  MILES_ASSIGN_OR_RETURN(a->head_dim, int_or(f, p + "attention.key_length", even_split));
  if (a->head_dim <= 0 || a->head_dim % 2 != 0 || a->head_dim > 65536)
    return key_error(f, p + "attention.key_length",
                     "gives head_dim " + std::to_string(a->head_dim) +
                         " (needs a positive even number; without the key, embedding_length / "
                         "attention.head_count)");
  MILES_ASSIGN_OR_RETURN(const int64_t v_dim, int_or(f, p + "attention.value_length", a->head_dim));
  if (v_dim != a->head_dim)
    return key_error(f, p + "attention.value_length",
                     "(" + std::to_string(v_dim) + ") differs from the key length (" +
                         std::to_string(a->head_dim) + "); not supported");
  MILES_ASSIGN_OR_RETURN(a->rotary_dim, int_or(f, p + "rope.dimension_count", a->head_dim));
  // Phi-3's (Phi-4-mini's 0.75) and GLM-4 MoE's (0.5) become partial_rotary_factor; elsewhere a
  // plain HF config of the class cannot say it. The factor must give back rotary_dim exactly
  // (transformers and miles take int(head_dim * factor)).
  const bool partial_ok =
      (a->gguf_arch == "phi3" || a->glm4moe) && a->rotary_dim > 0 && a->rotary_dim % 2 == 0;
  if (a->rotary_dim != a->head_dim && !(partial_ok && a->rotary_dim < a->head_dim))
    return key_error(f, p + "rope.dimension_count",
                     "is " + std::to_string(a->rotary_dim) + " but head_dim is " +
                         std::to_string(a->head_dim) + "; partial rotary is not supported");
  const double factor = static_cast<double>(a->rotary_dim) / static_cast<double>(a->head_dim);
  if (static_cast<int64_t>(static_cast<double>(a->head_dim) * factor) != a->rotary_dim)
    return key_error(f, p + "rope.dimension_count",
                     "(" + std::to_string(a->rotary_dim) + " of head_dim " +
                         std::to_string(a->head_dim) +
                         ") has no partial_rotary_factor that gives it back exactly");
  if (a->gguf_arch == "phi3") {
    MILES_ASSIGN_OR_RETURN(a->sliding_window, int_or(f, p + "attention.sliding_window", 0));
    if (a->sliding_window < 0)
      return key_error(f, p + "attention.sliding_window", "must be >= 0 (0: none)");
  }
  return Status::Ok();
}

Status read_rope_scaling(const GgufFile& f, GgufArch* a) {
  const std::string p = a->gguf_arch + ".rope.scaling.";
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
    if (f.find_tensor(t))
      return Status::Error(f.path() + ": tensor '" + t +
                           "' (Phi-3's longrope scaling) is not supported by miles convert");
  if (f.find_tensor("rope_freqs.weight"))
    return Status::Error(f.path() +
                         ": tensor 'rope_freqs.weight' (llama3-style per-frequency "
                         "RoPE factors) is not supported by miles convert");
  MILES_ASSIGN_OR_RETURN(const std::string type, string_or(f, p + "type", "none"));
  if (type == "none") return Status::Ok();
  if (type != "linear" && type != "yarn")
    return key_error(f, p + "type", "is '" + type + "' (supported: none, linear, yarn)");
  a->rope_scaling = type;
  MILES_ASSIGN_OR_RETURN(a->rope_factor, f.get_float(p + "factor"));
  if (!(a->rope_factor > 0)) return key_error(f, p + "factor", "must be > 0");
  if (type == "yarn") {
    MILES_ASSIGN_OR_RETURN(a->rope_original_context, f.get_int(p + "original_context_length"));
  }
  if (a->deepseek2) MILES_RETURN_IF_ERROR(read_deepseek2_yarn(f, a));
  return Status::Ok();
}

// Every gemma3.* key llama.cpp's converter writes (and a few it may); any other is refused, as its
// meaning for the HF class is unknown.
const std::set<std::string>& gemma3_keys() {
  static const std::set<std::string> keys = text_model_keys({
      "attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa",
      "final_logit_softcapping", "attn_logit_softcapping",
      "expert_count",  // refused by read_sizes, naming it
  });
  return keys;
}

// Gemma 3 as llama.cpp's llama-model.cpp defines it: the window from attention.sliding_window on
// every layer but each 6th (set_swa_pattern(6): layer il slides iff il % 6 < 5, the
// `(i + 1) % 6 != 0` of HF's Gemma3TextConfig), those layers' RoPE base fixed at 10000
// (rope_freq_base_train_swa), the queries scaled by 1 / sqrt(head_dim), or 1 / sqrt(hidden /
// heads) for the 27B model (62 layers), which is query_pre_attn_scalar in HF's terms.
Status read_gemma3(const GgufFile& f, GgufArch* a) {
  const std::string p = "gemma3.";
  if (const auto key = unknown_key(f, "gemma3", gemma3_keys())) {
    if (key->rfind(p + "vision.", 0) == 0 || key->rfind(p + "mm.", 0) == 0)
      return key_error(f, *key,
                       "describes a vision tower (a multimodal GGUF); miles convert reads "
                       "Gemma3ForCausalLM text models only");
    return key_error(f, *key, "is not a key miles convert knows for gemma3 (refused, not ignored)");
  }
  MILES_RETURN_IF_ERROR(check_vocab_size(f, *a));
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    MILES_ASSIGN_OR_RETURN(const double cap, float_or(f, p + key, 0.0));
    if (cap != 0)
      return key_error(f, p + key,
                       "is " + num(cap) +
                           "; softcapping is not supported for Gemma 3 (Gemma3ForCausalLM: null)");
  }
  if (a->rope_scaling == "yarn")
    return key_error(f, p + "rope.scaling.type", "is 'yarn' (supported for gemma3: none, linear)");

  MILES_ASSIGN_OR_RETURN(a->sliding_window, int_or(f, p + "attention.sliding_window", 0));
  if (a->sliding_window <= 0 || a->sliding_window > INT32_MAX)
    return key_error(f, p + "attention.sliding_window",
                     a->sliding_window == 0
                         ? std::string("is missing or 0 (llama.cpp then gives every layer full "
                                       "attention); only windowed Gemma 3 models are supported")
                         : "is " + std::to_string(a->sliding_window) + ", must be in [1, 2^31)");
  constexpr int64_t kPattern = 6;  // llama.cpp: hparams.set_swa_pattern(6)
  a->sliding_layers.resize(static_cast<size_t>(a->layers));
  for (int64_t l = 0; l < a->layers; ++l)
    a->sliding_layers[static_cast<size_t>(l)] = l % kPattern < kPattern - 1;
  // llama.cpp's gemma3 does not read a pattern key; one that says otherwise is ambiguous.
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  if (const GgufValue* v = f.find(pattern_key)) {
    bool agrees = false;
    if (v->type == GgufType::kArray) {
      MILES_ASSIGN_OR_RETURN(const std::vector<int64_t> flags, f.get_ints(pattern_key));
      agrees = flags.size() == a->sliding_layers.size();
      for (size_t l = 0; agrees && l < flags.size(); ++l)
        agrees = (flags[l] != 0) == a->sliding_layers[l];
    } else {
      MILES_ASSIGN_OR_RETURN(const int64_t n, f.get_int(pattern_key));
      agrees = n == kPattern;
    }
    if (!agrees)
      return key_error(f, pattern_key,
                       "differs from llama.cpp's fixed gemma3 pattern (every 6th layer full "
                       "attention, the rest sliding), which llama.cpp uses regardless");
  }
  constexpr double kLocalBase = 10000.0;  // llama.cpp: hparams.rope_freq_base_train_swa
  MILES_ASSIGN_OR_RETURN(a->rope_local_theta, float_or(f, p + "rope.freq_base_swa", kLocalBase));
  if (a->rope_local_theta != kLocalBase)
    return key_error(f, p + "rope.freq_base_swa",
                     "is " + num(a->rope_local_theta) +
                         "; llama.cpp's gemma3 uses 10000 for the sliding layers regardless");
  // llama.cpp's LLM_TYPE_27B is n_layer == 62; its scale 1 / sqrt(float(n_embd / n_head)) divides
  // integers, as HF's query_pre_attn_scalar (168 for 27B) is.
  a->query_pre_attn_scalar = a->layers == 62 ? a->hidden / a->heads : a->head_dim;
  if (a->query_pre_attn_scalar <= 0)
    return key_error(f, p + "embedding_length", "/ attention.head_count must be positive");
  return Status::Ok();
}

Status read_embedding(const GgufFile& f, GgufArch* a) {
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) return Status::Error(f.path() + ": tensor 'token_embd.weight' is missing");
  if (emb->ne.size() != 2 || emb->ne[0] != a->hidden || emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX)
    return Status::Error(f.path() + ": tensor 'token_embd.weight' must be [vocab, " +
                         std::to_string(a->hidden) + "] (ggml ne [" + std::to_string(a->hidden) +
                         ", vocab])");
  a->vocab = emb->ne[1];
  a->tied = f.find_tensor("output.weight") == nullptr;
  if (f.find("tokenizer.ggml.tokens")) {
    MILES_ASSIGN_OR_RETURN(const auto tokens, f.get_strings("tokenizer.ggml.tokens"));
    if (static_cast<int64_t>(tokens.size()) > a->vocab)
      return key_error(f, "tokenizer.ggml.tokens",
                       "has " + std::to_string(tokens.size()) +
                           " tokens but token_embd.weight only " + std::to_string(a->vocab) +
                           " rows");
  }
  return Status::Ok();
}

Status read_special_ids(const GgufFile& f, GgufArch* a) {
  const std::pair<const char*, int64_t*> ids[] = {{"tokenizer.ggml.bos_token_id", &a->bos},
                                                  {"tokenizer.ggml.eos_token_id", &a->eos},
                                                  {"tokenizer.ggml.padding_token_id", &a->pad}};
  for (const auto& [key, out] : ids) {
    MILES_ASSIGN_OR_RETURN(*out, int_or(f, key, -1));
    if (*out < -1 || *out >= a->vocab)
      return key_error(f, key, "is " + std::to_string(*out) + ", outside the vocabulary");
  }
  return Status::Ok();
}

}  // namespace

double shortest_f32(double v) {
  const float fv = static_cast<float>(v);
  if (static_cast<double>(fv) != v || !std::isfinite(fv)) return v;
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), fv);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

Result<GgufArch> read_gguf_arch(const GgufFile& f) {
  GgufArch a;
  MILES_ASSIGN_OR_RETURN(a.gguf_arch, f.get_string("general.architecture"));
  MILES_RETURN_IF_ERROR(set_family(f, &a));
  MILES_RETURN_IF_ERROR(read_sizes(f, &a));
  MILES_RETURN_IF_ERROR(a.deepseek2 ? read_mla(f, &a) : read_head_dim(f, &a));
  MILES_RETURN_IF_ERROR(read_rope_scaling(f, &a));
  MILES_RETURN_IF_ERROR(read_embedding(f, &a));
  MILES_RETURN_IF_ERROR(read_special_ids(f, &a));
  if (a.gemma3) MILES_RETURN_IF_ERROR(read_gemma3(f, &a));
  if (a.grouped_moe()) MILES_RETURN_IF_ERROR(read_grouped_moe(f, &a));
  return a;
}

}  // namespace miles::gguf

namespace miles {

namespace {

// Llama, Phi-3 and the Qwen families: RoPE, tying, SwiGLU, and their classes' bias / window keys.
void plain_json(const gguf::GgufArch& a, nlohmann::ordered_json& j) {
  j["rope_theta"] = gguf::shortest_f32(a.rope_theta);
  if (a.rotary_dim != a.head_dim)
    j["partial_rotary_factor"] =
        static_cast<double>(a.rotary_dim) / static_cast<double>(a.head_dim);
  j["rope_scaling"] = gguf::detail::rope_scaling_json(a);
  j["tie_word_embeddings"] = a.tied;
  j["hidden_act"] = "silu";
  // Qwen2's q/k/v biases are its class's; Phi-3's class has none and a window of its own.
  if (a.model_type != "qwen2" && a.model_type != "phi3") j["attention_bias"] = false;
  if (a.model_type == "llama") j["mlp_bias"] = false;
  if (a.model_type == "phi3") {
    j["sliding_window"] =
        a.sliding_window > 0 ? nlohmann::ordered_json(a.sliding_window) : nlohmann::ordered_json();
  } else if (a.model_type != "llama") {
    j["use_sliding_window"] = false;
  }
}

// Gemma 3: GeGLU, the query scale, the window on the layers llama.cpp's pattern makes sliding, and
// the two RoPEs (rope_theta + rope_scaling for the full layers, rope_local_base_freq for the
// sliding ones, as transformers 4 and 5 both read them); no softcapping.
void gemma3_json(const gguf::GgufArch& a, nlohmann::ordered_json& j) {
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["tie_word_embeddings"] = a.tied;
  j["query_pre_attn_scalar"] = a.query_pre_attn_scalar;
  j["sliding_window"] = a.sliding_window;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (bool sliding : a.sliding_layers)
    types.push_back(sliding ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["rope_theta"] = gguf::shortest_f32(a.rope_theta);
  j["rope_local_base_freq"] = gguf::shortest_f32(a.rope_local_theta);
  j["rope_scaling"] = gguf::detail::rope_scaling_json(a);
  j["final_logit_softcapping"] = nullptr;
  j["attn_logit_softcapping"] = nullptr;
}

}  // namespace

Result<std::string> gguf_config_json(const GgufFile& f) {
  MILES_ASSIGN_OR_RETURN(const gguf::GgufArch a, gguf::read_gguf_arch(f));
  nlohmann::ordered_json j;
  j["architectures"] = {a.hf_class};
  j["model_type"] = a.model_type;
  j["vocab_size"] = a.vocab;
  j["hidden_size"] = a.hidden;
  j["intermediate_size"] = a.intermediate;
  j["num_hidden_layers"] = a.layers;
  j["num_attention_heads"] = a.heads;
  j["num_key_value_heads"] = a.kv_heads;
  j["head_dim"] = a.head_dim;
  j["max_position_embeddings"] = a.context;
  j["rms_norm_eps"] = gguf::shortest_f32(a.rms_eps);
  if (a.gemma3) {
    gemma3_json(a, j);
  } else if (a.grouped_moe()) {
    gguf::detail::grouped_moe_config_json(a, j);
  } else {
    plain_json(a, j);
  }
  if (a.bos >= 0) j["bos_token_id"] = a.bos;
  if (a.eos >= 0) j["eos_token_id"] = a.eos;
  if (a.pad >= 0) j["pad_token_id"] = a.pad;
  j["torch_dtype"] = "float32";
  j["use_cache"] = true;
  j["converted_from"] = "gguf";
  return j.dump(2) + "\n";
}

Result<std::string> gguf_generation_config_json(const GgufFile& f) {
  MILES_ASSIGN_OR_RETURN(const gguf::GgufArch a, gguf::read_gguf_arch(f));
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (a.bos >= 0) j["bos_token_id"] = a.bos;
  if (a.eos >= 0) j["eos_token_id"] = a.eos;
  if (a.pad >= 0) j["pad_token_id"] = a.pad;
  return j.dump(2) + "\n";
}

}  // namespace miles
