// The canonical parameter list of the shared model and flat float32 buffers over it.
#include "miles/flat_params.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "miles/check.h"

namespace miles {

void ParamLayout::add(std::string name, std::vector<int64_t> shape, bool trainable) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.trainable = trainable;
  s.numel = 1;
  for (int64_t d : s.shape) s.numel *= d;
  s.offset = total_;
  total_ += s.numel;
  index_[s.name] = specs_.size();
  specs_.push_back(std::move(s));
}

std::shared_ptr<const ParamLayout> ParamLayout::of(const std::vector<ParamSpec>& specs) {
  auto l = std::make_shared<ParamLayout>();
  for (const ParamSpec& s : specs) {
    MILES_CHECK(l->find(s.name) == nullptr, "a layout names each tensor once");
    l->add(s.name, s.shape, s.trainable);
  }
  return l;
}

std::shared_ptr<const ParamLayout> ParamLayout::for_model(const ModelConfig& c,
                                                          const TensorMap* weights) {
  auto l = std::make_shared<ParamLayout>();
  const int64_t d = c.hidden_size;
  l->add("model.embed_tokens.weight", {c.vocab_size, d});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    l->add(p + "input_layernorm.weight", {d});
    if (c.is_mla()) {
      add_mla(*l, c, p);
    } else {
      add_attention(*l, c, p, weights);
    }
    l->add(p + "post_attention_layernorm.weight", {d});
    if (c.has_block_output_norms()) {
      l->add(p + "pre_feedforward_layernorm.weight", {d});
      l->add(p + "post_feedforward_layernorm.weight", {d});
    }
    add_mlp(*l, c, i, p);
  }
  l->add("model.norm.weight", {d});
  if (!c.tie_word_embeddings) l->add("lm_head.weight", {c.vocab_size, d});
  return l;
}

void ParamLayout::add_attention(ParamLayout& l, const ModelConfig& c, const std::string& p,
                                const TensorMap* weights) {
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim();
  l.add(p + "self_attn.q_proj.weight", {q, d});
  l.add(p + "self_attn.k_proj.weight", {kv, d});
  l.add(p + "self_attn.v_proj.weight", {kv, d});
  if (c.attention_bias) {
    l.add(p + "self_attn.q_proj.bias", {q});
    l.add(p + "self_attn.k_proj.bias", {kv});
    l.add(p + "self_attn.v_proj.bias", {kv});
  }
  l.add(p + "self_attn.o_proj.weight", {d, q});
  if (c.attention_bias && c.arch == Arch::kLlama &&
      (!weights || weights->contains(p + "self_attn.o_proj.bias")))
    l.add(p + "self_attn.o_proj.bias", {d});
  if (c.has_qk_norm()) {
    l.add(p + "self_attn.q_norm.weight", {c.head_dim});
    l.add(p + "self_attn.k_norm.weight", {c.head_dim});
  }
}

// DeepSeek-V3's MLA tensors, in its modules' order.
void ParamLayout::add_mla(ParamLayout& l, const ModelConfig& c, const std::string& p) {
  const MlaConfig& a = c.mla;
  const int64_t d = c.hidden_size, qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
  const std::string s = p + "self_attn.";
  if (a.q_lora_rank > 0) {
    l.add(s + "q_a_proj.weight", {a.q_lora_rank, d});
    l.add(s + "q_a_layernorm.weight", {a.q_lora_rank});
    l.add(s + "q_b_proj.weight", {c.num_heads * qk, a.q_lora_rank});
  } else {
    l.add(s + "q_proj.weight", {c.num_heads * qk, d});
  }
  l.add(s + "kv_a_proj_with_mqa.weight", {a.kv_lora_rank + a.qk_rope_head_dim, d});
  l.add(s + "kv_a_layernorm.weight", {a.kv_lora_rank});
  l.add(s + "kv_b_proj.weight",
        {c.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank});
  l.add(s + "o_proj.weight", {d, c.num_heads * a.v_head_dim});
}

// A dense MLP (+ biases), or the router (+ its bias), the experts and the shared expert.
void ParamLayout::add_mlp(ParamLayout& l, const ModelConfig& c, int64_t i, const std::string& p) {
  const int64_t d = c.hidden_size;
  if (!c.is_moe_layer(i)) {
    l.add(p + "mlp.gate_proj.weight", {c.intermediate_size, d});
    l.add(p + "mlp.up_proj.weight", {c.intermediate_size, d});
    l.add(p + "mlp.down_proj.weight", {d, c.intermediate_size});
    if (c.mlp_bias) {
      l.add(p + "mlp.gate_proj.bias", {c.intermediate_size});
      l.add(p + "mlp.up_proj.bias", {c.intermediate_size});
      l.add(p + "mlp.down_proj.bias", {d});
    }
    return;
  }
  const int64_t f = c.moe.moe_intermediate_size;
  l.add(p + "mlp.gate.weight", {c.moe.num_experts, d});
  if (c.moe.score == RouterScore::kSigmoid)
    l.add(p + "mlp.gate.e_score_correction_bias", {c.moe.num_experts}, /*trainable=*/false);
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
    l.add(x + "gate_proj.weight", {f, d});
    l.add(x + "up_proj.weight", {f, d});
    l.add(x + "down_proj.weight", {d, f});
  }
  if (const int64_t fs = c.moe.n_shared_experts * f; fs > 0) {
    const std::string x = p + "mlp.shared_experts.";
    l.add(x + "gate_proj.weight", {fs, d});
    l.add(x + "up_proj.weight", {fs, d});
    l.add(x + "down_proj.weight", {d, fs});
  }
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

const ParamSpec& ParamLayout::at(const std::string& name) const {
  const ParamSpec* s = find(name);
  if (s == nullptr) spdlog::error("no parameter named {}", name);
  MILES_CHECK(s != nullptr, "ParamLayout::at: unknown parameter name");
  return *s;
}

FlatTensors::FlatTensors(std::shared_ptr<const ParamLayout> layout)
    : layout_(std::move(layout)), data_(static_cast<size_t>(layout_->total()), 0.0f) {}

Result<FlatTensors> FlatTensors::from_tensor_map(std::shared_ptr<const ParamLayout> layout,
                                                 const TensorMap& weights) {
  FlatTensors f(std::move(layout));
  for (const ParamSpec& s : f.layout().specs()) {
    MILES_ASSIGN_OR_RETURN(Tensor t, weights.get(s.name, s.shape));
    const std::vector<float> v = t.to_f32();
    std::copy(v.begin(), v.end(), f.data_.begin() + s.offset);
  }
  return f;
}

std::span<float> FlatTensors::get(const std::string& name) {
  const ParamSpec& s = layout_->at(name);
  return std::span<float>(data_).subspan(s.offset, s.numel);
}

std::span<const float> FlatTensors::get(const std::string& name) const {
  const ParamSpec& s = layout_->at(name);
  return std::span<const float>(data_).subspan(s.offset, s.numel);
}

void FlatTensors::zero() { std::fill(data_.begin(), data_.end(), 0.0f); }

TensorMap FlatTensors::as_tensor_map() const {
  TensorMap m;
  for (const ParamSpec& s : layout_->specs())
    m.insert(s.name, Tensor::view(DType::kF32, s.shape, data_.data() + s.offset, nullptr),
             "trainer parameters");
  return m;
}

}  // namespace miles
