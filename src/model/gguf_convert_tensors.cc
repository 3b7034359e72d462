// GGUF tensors -> float32 tensors under HF names, q/k rows back in HF's rotary layout.
//
// Why: llama.cpp renames every tensor (blk.N.attn_q.weight for
// model.layers.N.self_attn.q_proj.weight) and, for Llama, its converter permutes the rows of q and
// k within each head: HF rotates the pairs (i, i + head_dim/2) ("half split"), llama.cpp the
// adjacent pairs (2i, 2i + 1). The GGUF row h*head_dim + 2i + j holds HF row h*head_dim +
// j*head_dim/2 + i; we move every row back (the inverse of convert_hf_to_gguf.py's `permute`, as
// transformers' own GGUF loader does). Gemma 3's converter stores every norm weight as 1 + w (HF's
// Gemma3RMSNorm multiplies by 1 + w, llama.cpp's norm by the stored weight); we subtract 1 in
// float32 after dequantising, as transformers' GGUF loader does (Gemma2TensorProcessor). Shapes are
// checked against the architecture before anything is dequantised; errors name the GGUF tensor.
#include <cstring>
#include <map>

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
};

// Per-layer GGUF suffix -> HF suffix and shape.
Result<Target> layer_target(const GgufArch& a, const std::string& suffix, const std::string& p) {
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
    if (layer < 0 || layer >= a.layers)
      return Status::Error("has a layer number outside [0, " + std::to_string(a.layers) + ")");
    return layer_target(a, name.substr(dot + 1), "model.layers." + std::to_string(layer) + ".");
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

}  // namespace

Result<std::vector<std::pair<std::string, Tensor>>> gguf_hf_tensors(const GgufFile& f) {
  MILES_ASSIGN_OR_RETURN(const GgufArch a, gguf::read_gguf_arch(f));
  std::map<std::string, std::pair<const GgufTensorInfo*, Target>> plan;
  for (const GgufTensorInfo& t : f.tensors()) {
    auto target = target_of(a, t.name);
    if (!target.ok())
      return Status::Error(f.path() + ": tensor '" + t.name + "' " + target.message());
    const std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
    if (shape != target->shape)
      return Status::Error(f.path() + ": tensor '" + t.name + "' has shape " + shape_str(shape) +
                           " but " + a.hf_class + " needs " + shape_str(target->shape) + " for " +
                           target->hf_name);
    plan.emplace(target->hf_name, std::make_pair(&t, *target));
  }
  // Every tensor the HF model needs must be there.
  for (int64_t l = 0; l < a.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<std::string> parts = {"attn_norm",   "ffn_norm", "attn_q", "attn_k",  "attn_v",
                                      "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    if (a.fused) parts = {"attn_norm", "ffn_norm", "attn_qkv", "attn_output", "ffn_up", "ffn_down"};
    if (a.qk_norm) parts.insert(parts.end(), {"attn_q_norm", "attn_k_norm"});
    if (a.gemma3) parts.insert(parts.end(), {"post_attention_norm", "post_ffw_norm"});
    for (std::string& part : parts) part += ".weight";
    if (a.qkv_bias) parts.insert(parts.end(), {"attn_q.bias", "attn_k.bias", "attn_v.bias"});
    for (const std::string& part : parts) {
      if (!f.find_tensor(p + part))
        return Status::Error(f.path() + ": tensor '" + p + part + "' is missing");
    }
  }
  if (!f.find_tensor("output_norm.weight"))
    return Status::Error(f.path() + ": tensor 'output_norm.weight' is missing");
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(plan.size());
  for (const auto& [hf_name, entry] : plan) {
    const auto& [info, target] = entry;
    MILES_ASSIGN_OR_RETURN(Tensor t, f.dequantize(*info));
    if (target.permute_heads > 0) t = unpermute_rows(t, target.permute_heads);
    if (target.minus_one) {
      float* x = t.mutable_data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) x[i] -= 1.0f;
    }
    out.emplace_back(hf_name, std::move(t));
  }
  return out;
}

}  // namespace miles
