// GGUF tensors -> float32 tensors under HF names, q/k rows back in HF's rotary layout.
//
// Why: llama.cpp renames every tensor (blk.N.attn_q.weight for
// model.layers.N.self_attn.q_proj.weight) and, for Llama, its converter permutes the rows of q and
// k within each head: HF rotates the pairs (i, i + head_dim/2) ("half split"), llama.cpp the
// adjacent pairs (2i, 2i + 1). The GGUF row h*head_dim + 2i + j holds HF row h*head_dim +
// j*head_dim/2 + i; we move every row back (the inverse of convert_hf_to_gguf.py's `permute`, as
// transformers' own GGUF loader does). Gemma 3's converter stores every norm weight as 1 + w (HF's
// Gemma3RMSNorm multiplies by 1 + w, llama.cpp's norm by the stored weight); we subtract 1 in
// float32 after dequantising, as transformers' GGUF loader does (Gemma2TensorProcessor). GLM-4
// MoE's converter stacks each layer's routed experts into one 3-D tensor per projection
// (blk.N.ffn_{gate,up,down}_exps: [experts, rows, cols], or gate and up fused as ffn_gate_up_exps,
// gate rows first), which is cut back into HF's per-expert matrices; its NextN blocks (after the
// causal LM's layers) are skipped, as transformers skips those layers' weights. DeepSeek's
// (deepseek2) routed experts come stacked the same way; its converter splits kv_b_proj ([heads *
// (qk_nope + v), kv_lora] viewed per head) into blk.N.attn_k_b ([heads, kv_lora, qk_nope]: each
// head's key rows transposed) and blk.N.attn_v_b ([heads, v, kv_lora]: its value rows), which are
// put back together (older files keep attn_kv_b as it is). Shapes are checked against the
// architecture before anything is dequantised; errors name the GGUF tensor.
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "miles/convert.h"
#include "model/gguf_convert_arch.h"

namespace miles {
namespace {

using gguf::GgufArch;

struct Target {
  std::string hf_name;
  std::vector<int64_t> shape;  // HF (row-major) shape
  int64_t permute_heads = 0;   // > 0: un-permute q/k rows with this many heads
  bool minus_one = false;      // Gemma 3's norms: stored 1 + w, HF's w
  bool skip = false;           // a NextN block's tensor: not part of the causal LM
  // Stacked experts (shape [experts, rows, cols]): expert e's rows, split evenly among `parts`,
  // become hf_name + e + "." + part + ".weight".
  std::vector<std::string> parts = {};
  // deepseek2's attn_k_b (kKeyRows) / attn_v_b (kValueRows): one half of kv_b_proj, per head.
  enum KvB { kNone, kKeyRows, kValueRows } kv_b = kNone;
};

// The HF names a target writes.
std::vector<std::string> hf_names(const Target& t) {
  if (t.kv_b != Target::kNone)  // the two halves give one tensor, each its own rows
    return {t.hf_name + (t.kv_b == Target::kKeyRows ? " (key rows)" : " (value rows)")};
  if (t.parts.empty()) return {t.hf_name};
  std::vector<std::string> out;
  for (int64_t e = 0; e < t.shape[0]; ++e)
    for (const std::string& part : t.parts)
      out.push_back(t.hf_name + std::to_string(e) + "." + part + ".weight");
  return out;
}

// GLM-4 MoE's per-layer GGUF suffix -> HF suffix and shape: dense MLPs below
// leading_dense_block_count, routed + shared experts from there on.
Result<Target> grouped_ffn_target(const GgufArch& a, const std::string& suffix,
                                  const std::string& p, int64_t layer);

Result<Target> glm4moe_target(const GgufArch& a, const std::string& suffix, const std::string& p,
                              int64_t layer) {
  const int64_t q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim, h = a.hidden;
  if (suffix == "attn_norm.weight") return Target{p + "input_layernorm.weight", {h}};
  if (suffix == "post_attention_norm.weight")
    return Target{p + "post_attention_layernorm.weight", {h}};
  if (suffix == "attn_q.weight") return Target{p + "self_attn.q_proj.weight", {q, h}};
  if (suffix == "attn_k.weight") return Target{p + "self_attn.k_proj.weight", {kv, h}};
  if (suffix == "attn_v.weight") return Target{p + "self_attn.v_proj.weight", {kv, h}};
  if (suffix == "attn_output.weight") return Target{p + "self_attn.o_proj.weight", {h, q}};
  for (const auto& [name, hf, n] : {std::tuple<const char*, const char*, int64_t>{"attn_q", "q", q},
                                    {"attn_k", "k", kv},
                                    {"attn_v", "v", kv}}) {
    if (suffix != std::string(name) + ".bias") continue;
    if (!a.qkv_bias)
      return Status::Error(
          "is present but blk.0.attn_q.bias is not (Glm4MoeForCausalLM's attention_bias gives "
          "every layer q, k and v biases, or none)");
    return Target{p + "self_attn." + hf + "_proj.bias", {n}};
  }
  if (suffix == "attn_q_norm.weight" || suffix == "attn_k_norm.weight") {
    if (!a.qk_norm)
      return Status::Error(
          "is present but blk.0.attn_q_norm.weight is not (Glm4MoeForCausalLM's use_qk_norm gives "
          "every layer q and k norms, or none)");
    return Target{p + "self_attn." + suffix.substr(5, 1) + "_norm.weight", {a.head_dim}};
  }
  return grouped_ffn_target(a, suffix, p, layer);
}

// DeepSeek's per-layer GGUF suffix -> HF suffix and shape: MLA (a q LoRA or a plain q, the
// compressed kv with its rotary key, kv_b_proj whole or in its two halves), then the FFN.
Result<Target> deepseek2_target(const GgufArch& a, const std::string& suffix, const std::string& p,
                                int64_t layer) {
  const int64_t h = a.hidden, heads = a.heads, q = a.heads * (a.qk_nope + a.rotary_dim);
  const int64_t r = a.kv_lora_rank, ql = a.q_lora_rank, nope = a.qk_nope, v = a.v_head_dim;
  const std::string at = p + "self_attn.";
  if (suffix == "attn_norm.weight") return Target{p + "input_layernorm.weight", {h}};
  if (suffix == "ffn_norm.weight") return Target{p + "post_attention_layernorm.weight", {h}};
  const std::pair<const char*, Target> lora_q[] = {
      {"attn_q_a.weight", Target{at + "q_a_proj.weight", {ql, h}}},
      {"attn_q_a_norm.weight", Target{at + "q_a_layernorm.weight", {ql}}},
      {"attn_q_b.weight", Target{at + "q_b_proj.weight", {q, ql}}}};
  for (const auto& [name, target] : lora_q) {
    if (suffix != name) continue;
    if (ql == 0) return Status::Error("is present but attention.q_lora_rank is not (attn_q)");
    return target;
  }
  if (suffix == "attn_q.weight") {
    if (ql > 0)
      return Status::Error("is present but attention.q_lora_rank is " + std::to_string(ql) +
                           " (attn_q_a / attn_q_b)");
    return Target{at + "q_proj.weight", {q, h}};
  }
  if (suffix == "attn_kv_a_mqa.weight")
    return Target{at + "kv_a_proj_with_mqa.weight", {r + a.rotary_dim, h}};
  if (suffix == "attn_kv_a_norm.weight") return Target{at + "kv_a_layernorm.weight", {r}};
  if (suffix == "attn_kv_b.weight") {
    if (a.mla_split)
      return Status::Error(
          "is present but attention.key_length_mla is too (llama.cpp's MLA form reads attn_k_b "
          "and attn_v_b)");
    return Target{at + "kv_b_proj.weight", {heads * (nope + v), r}};
  }
  if (suffix == "attn_k_b.weight" || suffix == "attn_v_b.weight") {
    if (!a.mla_split)
      return Status::Error(
          "is present but attention.key_length_mla is not (older files' attn_kv_b form)");
    Target t{at + "kv_b_proj.weight", {heads, r, nope}};
    t.kv_b = Target::kKeyRows;
    if (suffix == "attn_v_b.weight") {
      t.shape = {heads, v, r};
      t.kv_b = Target::kValueRows;
    }
    return t;
  }
  if (suffix == "attn_output.weight") return Target{at + "o_proj.weight", {h, heads * v}};
  return grouped_ffn_target(a, suffix, p, layer);
}

// GLM-4 MoE's and DeepSeek's FFN: a dense MLP below leading_dense_block_count, routed + shared
// experts from there on.
Result<Target> grouped_ffn_target(const GgufArch& a, const std::string& suffix,
                                  const std::string& p, int64_t layer) {
  const int64_t h = a.hidden, e = a.experts, f = a.expert_ff, fs = a.shared_experts * a.expert_ff;
  const bool dense = layer < a.dense_lead;
  const std::string where = "layer " + std::to_string(layer) + " is " +
                            (dense ? "dense" : "a mixture-of-experts layer") +
                            " (leading_dense_block_count " + std::to_string(a.dense_lead) + ")";
  const std::pair<const char*, Target> dense_parts[] = {
      {"ffn_gate.weight", Target{p + "mlp.gate_proj.weight", {a.intermediate, h}}},
      {"ffn_up.weight", Target{p + "mlp.up_proj.weight", {a.intermediate, h}}},
      {"ffn_down.weight", Target{p + "mlp.down_proj.weight", {h, a.intermediate}}}};
  for (const auto& [name, target] : dense_parts) {
    if (suffix != name) continue;
    if (!dense) return Status::Error("is a dense MLP's, but " + where);
    return target;
  }
  const std::string x = p + "mlp.experts.", sh = p + "mlp.shared_experts.";
  const std::pair<const char*, Target> moe_parts[] = {
      {"ffn_gate_inp.weight", Target{p + "mlp.gate.weight", {e, h}}},
      {"exp_probs_b.bias", Target{p + "mlp.gate.e_score_correction_bias", {e}}},
      {"ffn_gate_exps.weight", Target{x, {e, f, h}, 0, false, false, {"gate_proj"}}},
      {"ffn_up_exps.weight", Target{x, {e, f, h}, 0, false, false, {"up_proj"}}},
      {"ffn_gate_up_exps.weight",
       Target{x, {e, 2 * f, h}, 0, false, false, {"gate_proj", "up_proj"}}},
      {"ffn_down_exps.weight", Target{x, {e, h, f}, 0, false, false, {"down_proj"}}},
      {"ffn_gate_shexp.weight", Target{sh + "gate_proj.weight", {fs, h}}},
      {"ffn_up_shexp.weight", Target{sh + "up_proj.weight", {fs, h}}},
      {"ffn_down_shexp.weight", Target{sh + "down_proj.weight", {h, fs}}}};
  for (const auto& [name, target] : moe_parts) {
    if (suffix != name) continue;
    if (dense) return Status::Error("belongs to a mixture-of-experts layer, but " + where);
    if (fs == 0 && target.hf_name.starts_with(sh))
      return Status::Error("is a shared expert's, but expert_shared_count is 0");
    return target;
  }
  return Status::Error("has no Hugging Face counterpart in " + a.hf_class);
}

// Per-layer GGUF suffix -> HF suffix and shape.
Result<Target> layer_target(const GgufArch& a, const std::string& suffix, const std::string& p,
                            int64_t layer) {
  if (a.glm4moe) return glm4moe_target(a, suffix, p, layer);
  if (a.deepseek2) return deepseek2_target(a, suffix, p, layer);
  const int64_t q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
  const int64_t heads = a.permuted_qk ? a.heads : 0, kv_heads = a.permuted_qk ? a.kv_heads : 0;
  if (a.gemma3) {  // four norms per layer: around attention and around the MLP
    if (suffix == "post_attention_norm.weight")
      return Target{p + "post_attention_layernorm.weight", {a.hidden}};
    if (suffix == "ffn_norm.weight")
      return Target{p + "pre_feedforward_layernorm.weight", {a.hidden}};
    if (suffix == "post_ffw_norm.weight")
      return Target{p + "post_feedforward_layernorm.weight", {a.hidden}};
  }
  if (suffix == "attn_norm.weight") return Target{p + "input_layernorm.weight", {a.hidden}};
  if (suffix == "ffn_norm.weight") return Target{p + "post_attention_layernorm.weight", {a.hidden}};
  if (a.fused && suffix == "attn_qkv.weight")  // Phi-3: HF's fused names (hf_names.h splits them)
    return Target{p + "self_attn.qkv_proj.weight", {q + 2 * kv, a.hidden}};
  if (a.fused && suffix == "ffn_up.weight")  // [gate; up], as HF's gate_up_proj
    return Target{p + "mlp.gate_up_proj.weight", {2 * a.intermediate, a.hidden}};
  if (a.fused && (suffix == "attn_q.weight" || suffix == "attn_k.weight" ||
                  suffix == "attn_v.weight" || suffix == "ffn_gate.weight"))
    return Status::Error("is not how " + a.hf_class + " stores it (attn_qkv, ffn_up fused)");
  if (suffix == "attn_q.weight") return Target{p + "self_attn.q_proj.weight", {q, a.hidden}, heads};
  if (suffix == "attn_k.weight")
    return Target{p + "self_attn.k_proj.weight", {kv, a.hidden}, kv_heads};
  if (suffix == "attn_v.weight") return Target{p + "self_attn.v_proj.weight", {kv, a.hidden}};
  if (suffix == "attn_output.weight") return Target{p + "self_attn.o_proj.weight", {a.hidden, q}};
  if (suffix == "ffn_gate.weight")
    return Target{p + "mlp.gate_proj.weight", {a.intermediate, a.hidden}};
  if (suffix == "ffn_up.weight")
    return Target{p + "mlp.up_proj.weight", {a.intermediate, a.hidden}};
  if (suffix == "ffn_down.weight")
    return Target{p + "mlp.down_proj.weight", {a.hidden, a.intermediate}};
  if (a.qkv_bias && suffix == "attn_q.bias") return Target{p + "self_attn.q_proj.bias", {q}};
  if (a.qkv_bias && suffix == "attn_k.bias") return Target{p + "self_attn.k_proj.bias", {kv}};
  if (a.qkv_bias && suffix == "attn_v.bias") return Target{p + "self_attn.v_proj.bias", {kv}};
  if (a.qk_norm && suffix == "attn_q_norm.weight")
    return Target{p + "self_attn.q_norm.weight", {a.head_dim}};
  if (a.qk_norm && suffix == "attn_k_norm.weight")
    return Target{p + "self_attn.k_norm.weight", {a.head_dim}};
  return Status::Error("has no Hugging Face counterpart in " + a.hf_class);
}

// GGUF name -> HF name, shape and permutation.
Result<Target> mapped_target(const GgufArch& a, const std::string& name) {
  if (name.rfind("v.", 0) == 0 || name.rfind("mm.", 0) == 0)
    return Status::Error("belongs to a vision tower or multimodal projector; miles convert reads " +
                         a.hf_class + " text models only");
  if (name == "token_embd.weight") return Target{"model.embed_tokens.weight", {a.vocab, a.hidden}};
  if (name == "output_norm.weight") return Target{"model.norm.weight", {a.hidden}};
  if (name == "output.weight") return Target{"lm_head.weight", {a.vocab, a.hidden}};
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    const std::string num = name.substr(4, dot == std::string::npos ? 0 : dot - 4);
    int64_t layer = -1;
    if (!num.empty() && num.size() <= 9 && num.find_first_not_of("0123456789") == std::string::npos)
      layer = std::stoll(num);
    const int64_t blocks = a.layers + a.nextn_layers;
    if (layer < 0 || layer >= blocks)
      return Status::Error("has a layer number outside [0, " + std::to_string(blocks) + ")");
    if (layer >= a.layers) {  // a NextN / multi-token-prediction block
      Target skipped;
      skipped.skip = true;
      return skipped;
    }
    return layer_target(a, name.substr(dot + 1), "model.layers." + std::to_string(layer) + ".",
                        layer);
  }
  return Status::Error("has no Hugging Face counterpart in " + a.hf_class);
}

// GGUF name -> HF name, shape, permutation and norm shift.
Result<Target> target_of(const GgufArch& a, const std::string& name) {
  MILES_ASSIGN_OR_RETURN(Target t, mapped_target(a, name));
  const std::string norm = "norm.weight";  // every norm's name ends so, and nothing else's
  t.minus_one = a.gemma3 && name.size() >= norm.size() &&
                name.compare(name.size() - norm.size(), norm.size(), norm) == 0;
  return t;
}

// HF row h*hd + j*hd/2 + i <- GGUF row h*hd + 2i + j, for each of `heads` heads.
Tensor unpermute_rows(const Tensor& t, int64_t heads) {
  const int64_t rows = t.dim(0), cols = t.dim(1), hd = rows / heads, half = hd / 2;
  Tensor out = Tensor::zeros(DType::kF32, t.shape());
  const float* src = t.data<float>();
  float* dst = out.mutable_data<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(dst + (h * hd + j * half + i) * cols, src + (h * hd + 2 * i + j) * cols,
                    static_cast<size_t>(cols) * sizeof(float));
  return out;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The GGUF suffixes layer l needs (the rest of the model's tensors are checked by name).
std::vector<std::string> required_parts(const GgufArch& a, int64_t l, const GgufFile& f) {
  std::vector<std::string> parts = {"attn_norm",   "ffn_norm", "attn_q", "attn_k",  "attn_v",
                                    "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  if (a.fused) parts = {"attn_norm", "ffn_norm", "attn_qkv", "attn_output", "ffn_up", "ffn_down"};
  if (a.deepseek2) {
    parts = {"attn_norm", "ffn_norm", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_output"};
    if (a.q_lora_rank > 0) {
      parts.insert(parts.end(), {"attn_q_a", "attn_q_a_norm", "attn_q_b"});
    } else {
      parts.push_back("attn_q");
    }
    if (a.mla_split) {
      parts.insert(parts.end(), {"attn_k_b", "attn_v_b"});
    } else {
      parts.push_back("attn_kv_b");
    }
  }
  if (a.glm4moe)
    parts = {"attn_norm", "post_attention_norm", "attn_q", "attn_k", "attn_v", "attn_output"};
  if (a.grouped_moe()) {
    if (l < a.dense_lead) {
      parts.insert(parts.end(), {"ffn_gate", "ffn_up", "ffn_down"});
    } else {
      parts.insert(parts.end(), {"ffn_gate_inp", "ffn_down_exps"});
      const std::string fused = "blk." + std::to_string(l) + ".ffn_gate_up_exps.weight";
      if (!f.find_tensor(fused)) parts.insert(parts.end(), {"ffn_gate_exps", "ffn_up_exps"});
      if (a.shared_experts > 0)
        parts.insert(parts.end(), {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"});
    }
  }
  if (a.qk_norm) parts.insert(parts.end(), {"attn_q_norm", "attn_k_norm"});
  if (a.gemma3) parts.insert(parts.end(), {"post_attention_norm", "post_ffw_norm"});
  for (std::string& part : parts) part += ".weight";
  if (a.qkv_bias) parts.insert(parts.end(), {"attn_q.bias", "attn_k.bias", "attn_v.bias"});
  if (a.grouped_moe() && l >= a.dense_lead) parts.push_back("exp_probs_b.bias");
  return parts;
}

// Expert e's `part`-th block of rows of a stacked [experts, rows, cols] tensor.
Tensor expert_rows(const Tensor& t, int64_t e, int64_t part, int64_t parts) {
  const int64_t rows = t.dim(1) / parts, cols = t.dim(2);
  Tensor out = Tensor::zeros(DType::kF32, {rows, cols});
  const float* src = t.data<float>() + (e * t.dim(1) + part * rows) * cols;
  std::memcpy(out.mutable_data<float>(), src, static_cast<size_t>(rows * cols) * sizeof(float));
  return out;
}

// kv_b_proj's rows of head h are [its qk_nope key rows; its v value rows]: key row i, column c is
// attn_k_b[h, c, i]; value row j is attn_v_b[h, j, :].
void fill_kv_b(const Tensor& half, bool key_rows, const GgufArch& a, Tensor* kv_b) {
  const int64_t r = a.kv_lora_rank, nope = a.qk_nope, v = a.v_head_dim;
  const float* src = half.data<float>();
  float* dst = kv_b->mutable_data<float>();
  for (int64_t h = 0; h < a.heads; ++h) {
    float* head = dst + h * (nope + v) * r;
    if (key_rows) {
      const float* k = src + h * r * nope;
      for (int64_t c = 0; c < r; ++c)
        for (int64_t i = 0; i < nope; ++i) head[i * r + c] = k[c * nope + i];
    } else {
      std::memcpy(head + nope * r, src + h * v * r, static_cast<size_t>(v * r) * sizeof(float));
    }
  }
}

}  // namespace

Result<std::vector<std::pair<std::string, Tensor>>> gguf_hf_tensors(const GgufFile& f) {
  MILES_ASSIGN_OR_RETURN(const GgufArch a, gguf::read_gguf_arch(f));
  std::vector<std::pair<const GgufTensorInfo*, Target>> plan;
  std::map<std::string, const GgufTensorInfo*> written;  // HF name -> its GGUF tensor
  for (const GgufTensorInfo& t : f.tensors()) {
    auto target = target_of(a, t.name);
    if (!target.ok())
      return Status::Error(f.path() + ": tensor '" + t.name + "' " + target.message());
    if (target->skip) continue;
    const std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
    if (shape != target->shape)
      return Status::Error(
          f.path() + ": tensor '" + t.name + "' has shape " + shape_str(shape) + " but " +
          a.hf_class + " needs " + shape_str(target->shape) + " for " + target->hf_name +
          (target->parts.empty() ? std::string() : "<expert>.* (experts stacked)"));
    for (const std::string& name : hf_names(*target)) {
      auto [it, fresh] = written.emplace(name, &t);
      if (!fresh)
        return Status::Error(f.path() + ": tensors '" + it->second->name + "' and '" + t.name +
                             "' both give " + name);
    }
    plan.emplace_back(&t, *target);
  }
  // Every tensor the HF model needs must be there.
  for (int64_t l = 0; l < a.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const std::string& part : required_parts(a, l, f)) {
      if (!f.find_tensor(p + part))
        return Status::Error(f.path() + ": tensor '" + p + part + "' is missing");
    }
  }
  if (!f.find_tensor("output_norm.weight"))
    return Status::Error(f.path() + ": tensor 'output_norm.weight' is missing");
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(written.size());
  std::map<std::string, Tensor> kv_b;  // deepseek2: kv_b_proj, filled from attn_k_b and attn_v_b
  for (const auto& [info, target] : plan) {
    MILES_ASSIGN_OR_RETURN(Tensor t, f.dequantize(*info));
    if (target.kv_b != Target::kNone) {
      auto it = kv_b.find(target.hf_name);
      if (it == kv_b.end())
        it = kv_b.emplace(target.hf_name,
                          Tensor::zeros(DType::kF32,
                                        {a.heads * (a.qk_nope + a.v_head_dim), a.kv_lora_rank}))
                 .first;
      fill_kv_b(t, target.kv_b == Target::kKeyRows, a, &it->second);
      continue;
    }
    if (target.permute_heads > 0) t = unpermute_rows(t, target.permute_heads);
    if (target.minus_one) {
      float* x = t.mutable_data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) x[i] -= 1.0f;
    }
    if (target.parts.empty()) {
      out.emplace_back(target.hf_name, std::move(t));
      continue;
    }
    const std::vector<std::string> names = hf_names(target);
    const int64_t parts = static_cast<int64_t>(target.parts.size());
    for (int64_t e = 0; e < t.dim(0); ++e)
      for (int64_t k = 0; k < parts; ++k)
        out.emplace_back(names[static_cast<size_t>(e * parts + k)], expert_rows(t, e, k, parts));
  }
  for (auto& [name, t] : kv_b) out.emplace_back(name, std::move(t));
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return out;
}

}  // namespace miles
