// Loading the shared model's parameters from HF-named tensors: presence and shape checked for each,
// errors naming the tensor and its file.
#include "model/model_weights.h"

#include <string>

namespace miles {

namespace {

using kernels::PackedMatrix;

class Loader {
 public:
  Loader(const ModelConfig& c, const TensorMap& w) : c_(c), w_(w) {}

  Result<std::vector<float>> vec(const std::string& name, int64_t n) {
    MILES_ASSIGN_OR_RETURN(Tensor t, w_.get(name, {n}));
    return t.to_f32();
  }
  Result<Tensor> mat(const std::string& name, int64_t rows, int64_t cols) {
    return w_.get(name, {rows, cols});
  }

  // A row-parallel shard (o_proj, down_proj) reduces its K slice in the full product's chunks, so
  // the ranks' partials are subtrees of the single-process tree (kernels.h).
  void keep_full_chunks(PackedMatrix& m) const {
    if (c_.tensor_parallel > 1) m.set_chunk(kernels::gemm_chunk(m.k() * c_.tensor_parallel));
  }

  Status attention(const std::string& p, LayerWeights& l) {
    const int64_t d = c_.hidden_size, q = c_.q_dim(), kv = c_.kv_dim();
    MILES_ASSIGN_OR_RETURN(Tensor wq, mat(p + "self_attn.q_proj.weight", q, d));
    MILES_ASSIGN_OR_RETURN(Tensor wk, mat(p + "self_attn.k_proj.weight", kv, d));
    MILES_ASSIGN_OR_RETURN(Tensor wv, mat(p + "self_attn.v_proj.weight", kv, d));
    MILES_ASSIGN_OR_RETURN(Tensor wo, mat(p + "self_attn.o_proj.weight", d, q));
    l.qkv = PackedMatrix::pack_rows({&wq, &wk, &wv});
    l.o = PackedMatrix::pack(wo);
    keep_full_chunks(l.o);
    if (c_.attention_bias) {
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
        const int64_t rows = std::string(n) == "q_proj" ? q : kv;
        MILES_ASSIGN_OR_RETURN(auto b, vec(p + "self_attn." + n + ".bias", rows));
        l.qkv_bias.insert(l.qkv_bias.end(), b.begin(), b.end());
      }
      if (w_.contains(p + "self_attn.o_proj.bias")) {
        MILES_ASSIGN_OR_RETURN(l.o_bias, vec(p + "self_attn.o_proj.bias", d));
      }
    }
    if (c_.arch == Arch::kQwen3 || c_.arch == Arch::kQwen3Moe) {
      MILES_ASSIGN_OR_RETURN(l.q_norm, vec(p + "self_attn.q_norm.weight", c_.head_dim));
      MILES_ASSIGN_OR_RETURN(l.k_norm, vec(p + "self_attn.k_norm.weight", c_.head_dim));
    }
    return Status::Ok();
  }

  Status dense_mlp(const std::string& p, int64_t inter, PackedMatrix& gate_up, PackedMatrix& down) {
    const int64_t d = c_.hidden_size;
    MILES_ASSIGN_OR_RETURN(Tensor g, mat(p + "gate_proj.weight", inter, d));
    MILES_ASSIGN_OR_RETURN(Tensor u, mat(p + "up_proj.weight", inter, d));
    MILES_ASSIGN_OR_RETURN(Tensor dn, mat(p + "down_proj.weight", d, inter));
    gate_up = PackedMatrix::pack_rows({&g, &u});
    down = PackedMatrix::pack(dn);
    keep_full_chunks(down);
    return Status::Ok();
  }

  Status moe(const std::string& p, LayerWeights& l) {
    const int64_t e = c_.moe.num_experts;
    MILES_ASSIGN_OR_RETURN(Tensor router, mat(p + "mlp.gate.weight", e, c_.hidden_size));
    l.router = PackedMatrix::pack(router);
    l.experts.resize(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) {
      MILES_RETURN_IF_ERROR(dense_mlp(p + "mlp.experts." + std::to_string(i) + ".",
                                      c_.moe.moe_intermediate_size, l.experts[i].gate_up,
                                      l.experts[i].down));
    }
    return Status::Ok();
  }

  Status layer(int64_t i, LayerWeights& l) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    MILES_ASSIGN_OR_RETURN(l.input_norm, vec(p + "input_layernorm.weight", c_.hidden_size));
    MILES_ASSIGN_OR_RETURN(l.post_norm, vec(p + "post_attention_layernorm.weight", c_.hidden_size));
    MILES_RETURN_IF_ERROR(attention(p, l));
    l.moe = c_.is_moe_layer(i);
    if (l.moe) return moe(p, l);
    return dense_mlp(p + "mlp.", c_.intermediate_size, l.gate_up, l.down);
  }

  Result<ModelWeights> all() {
    ModelWeights m;
    MILES_ASSIGN_OR_RETURN(Tensor emb, mat("model.embed_tokens.weight", c_.vocab_size, c_.hidden_size));
    m.embed = emb.to_f32();
    m.layers.resize(static_cast<size_t>(c_.num_layers));
    for (int64_t i = 0; i < c_.num_layers; ++i) MILES_RETURN_IF_ERROR(layer(i, m.layers[i]));
    MILES_ASSIGN_OR_RETURN(m.final_norm, vec("model.norm.weight", c_.hidden_size));
    if (c_.tie_word_embeddings) {
      m.lm_head = PackedMatrix::pack(emb);
    } else {
      MILES_ASSIGN_OR_RETURN(Tensor head, mat("lm_head.weight", c_.vocab_size, c_.hidden_size));
      m.lm_head = PackedMatrix::pack(head);
    }
    MILES_ASSIGN_OR_RETURN(m.rope, kernels::make_rope_table(c_.rope, c_.head_dim));
    return m;
  }

 private:
  const ModelConfig& c_;
  const TensorMap& w_;
};

}  // namespace

Result<ModelWeights> load_model_weights(const ModelConfig& config, const TensorMap& weights) {
  return Loader(config, weights).all();
}

}  // namespace miles
