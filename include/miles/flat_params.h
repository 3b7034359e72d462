// ParamLayout and FlatTensors: every trainable tensor of the shared model in one float32
// allocation.
//
// Why: the trainer keeps parameters, gradients and the optimizer's two moments as buffers with one
// layout (HF names and row-major HF shapes, in a fixed canonical order), so that AdamW, the
// gradient norm, data-parallel reduction, checkpoints and weight sync each walk one flat array, and
// any tensor is reachable by name (llm.c's "one named-pointer struct over one allocation").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/huge_pages.h"
#include "miles/model_config.h"
#include "miles/status.h"

namespace miles {

struct ParamSpec {
  std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape, e.g. (q_dim, hidden)
  int64_t offset = 0;          // first float in the flat buffer
  int64_t numel = 0;
  // False for a buffer the model reads but training never changes (GLM-4 MoE's
  // e_score_correction_bias): no gradient reaches it and the optimizer skips it.
  bool trainable = true;
};

class ParamLayout {
 public:
  // Every parameter the shared model reads for `config`, in canonical order: embedding; per layer
  // input norm, q/k/v (+ biases), o (+ bias), q/k norms, post-attention norm, MLP (gate, up, down)
  // or router (+ its score-correction bias) then experts (+ the shared expert); final norm; lm_head
  // unless tied. `weights` (optional) decides optional
  // tensors that config.json does not pin down (o_proj.bias).
  static std::shared_ptr<const ParamLayout> for_model(const ModelConfig& config,
                                                      const TensorMap* weights = nullptr);
  // The tensors given (name, shape, trainable), in that order (offsets and sizes computed): a
  // layout that is not a model's (a draft head's, draft_head.h).
  static std::shared_ptr<const ParamLayout> of(const std::vector<ParamSpec>& specs);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  const ParamSpec* find(const std::string& name) const;
  const ParamSpec& at(const std::string& name) const;  // invariant: present

 private:
  void add(std::string name, std::vector<int64_t> shape, bool trainable = true);
  // for_model's parts of one layer (prefix p).
  static void add_attention(ParamLayout& l, const ModelConfig& c, const std::string& p,
                            const TensorMap* weights);
  static void add_mla(ParamLayout& l, const ModelConfig& c, const std::string& p);
  static void add_mlp(ParamLayout& l, const ModelConfig& c, int64_t layer, const std::string& p);
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0;
};

// A float32 buffer [layout.total()] with named views.
class FlatTensors {
 public:
  FlatTensors() = default;
  explicit FlatTensors(std::shared_ptr<const ParamLayout> layout);  // zero-filled
  // Values of every tensor of `layout` from `weights` (widened exactly from bf16 / f16); errors
  // name the missing or mis-shaped tensor and its file.
  static Result<FlatTensors> from_tensor_map(std::shared_ptr<const ParamLayout> layout,
                                             const TensorMap& weights);

  const ParamLayout& layout() const { return *layout_; }
  const std::shared_ptr<const ParamLayout>& layout_ptr() const { return layout_; }
  std::span<float> get(const std::string& name);
  std::span<const float> get(const std::string& name) const;
  std::span<float> all() { return data_; }
  std::span<const float> all() const { return data_; }
  void zero();
  // Views of every tensor (no copy; valid while this object lives and is not resized).
  TensorMap as_tensor_map() const;

 private:
  std::shared_ptr<const ParamLayout> layout_;
  LargeVector<float> data_;
};

}  // namespace miles
