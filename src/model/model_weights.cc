// Loading the shared model's parameters from HF-named tensors: presence and shape checked for each,
// errors naming the tensor and its file.
#include "model/model_weights.h"

#include <string>
#include <vector>

#include "miles/thread_pool.h"
#include "model/backward_weights.h"

namespace miles {

namespace {

using kernels::PackedMatrix;

class Loader {
 public:
  // With bw, the transposed packs are rebuilt in the same pass (PackedMatrix::assign_rows).
  Loader(const ModelConfig& c, const TensorMap& w, BackwardWeights* bw = nullptr)
      : c_(c), w_(w), bw_(bw) {}

  static void pack(PackedMatrix& m, const std::vector<const Tensor*>& parts, PackedMatrix* t) {
    if (t) {
      m.assign_rows(parts, *t);
    } else {
      m.assign_rows(parts);
    }
  }

  Status vec(const std::string& name, int64_t n, std::vector<float>& out) {
    MILES_ASSIGN_OR_RETURN(Tensor t, w_.get(name, {n}));
    t.to_f32(out);
    return Status::Ok();
  }
  // A norm's weight as the kernels multiply by it: Gemma's 1 + weight (in float32, as its RMSNorm
  // computes it), else the weight.
  Status norm(const std::string& name, int64_t n, std::vector<float>& out) {
    MILES_RETURN_IF_ERROR(vec(name, n, out));
    if (c_.norm_adds_one())
      for (float& x : out) x = 1.0f + x;
    return Status::Ok();
  }
  Result<Tensor> mat(const std::string& name, int64_t rows, int64_t cols) {
    return w_.get(name, {rows, cols});
  }

  // A row-parallel shard (o_proj, down_proj) reduces its K slice in the full product's chunks, so
  // the ranks' partials are subtrees of the single-process tree (kernels.h).
  void keep_full_chunks(PackedMatrix& m) const {
    if (c_.tensor_parallel > 1) m.set_chunk(kernels::gemm_chunk(m.k() * c_.tensor_parallel));
  }

  // MLA (mla.h): the fused a-projection, o_proj, and the latent path's tensors.
  Status mla(const std::string& p, LayerWeights& l, LayerWeightsT* t) {
    const int64_t d = c_.hidden_size;
    std::vector<Tensor> a;
    for (const auto& [name, rows] : mla_a_parts(c_, p)) {
      MILES_ASSIGN_OR_RETURN(Tensor x, mat(name, rows, d));
      a.push_back(std::move(x));
    }
    MILES_ASSIGN_OR_RETURN(Tensor wo, mat(p + "self_attn.o_proj.weight", d, mla_out_width(c_)));
    std::vector<const Tensor*> parts;
    for (const Tensor& x : a) parts.push_back(&x);
    pack(l.qkv, parts, t ? &t->qkv_t : nullptr);
    pack(l.o, {&wo}, t ? &t->o_t : nullptr);
    keep_full_chunks(l.o);
    l.qkv_bias.clear();
    l.o_bias.clear();
    MILES_RETURN_IF_ERROR(load_mla_weights(c_, w_, p, l.mla));
    if (t) build_mla_backward(l.mla, t->mla);
    return Status::Ok();
  }

  Status attention(const std::string& p, LayerWeights& l, LayerWeightsT* t) {
    if (c_.is_mla()) return mla(p, l, t);
    const int64_t d = c_.hidden_size, q = c_.q_dim(), kv = c_.kv_dim();
    MILES_ASSIGN_OR_RETURN(Tensor wq, mat(p + "self_attn.q_proj.weight", q, d));
    MILES_ASSIGN_OR_RETURN(Tensor wk, mat(p + "self_attn.k_proj.weight", kv, d));
    MILES_ASSIGN_OR_RETURN(Tensor wv, mat(p + "self_attn.v_proj.weight", kv, d));
    MILES_ASSIGN_OR_RETURN(Tensor wo, mat(p + "self_attn.o_proj.weight", d, q));
    pack(l.qkv, {&wq, &wk, &wv}, t ? &t->qkv_t : nullptr);
    pack(l.o, {&wo}, t ? &t->o_t : nullptr);
    keep_full_chunks(l.o);
    l.qkv_bias.clear();
    l.o_bias.clear();
    if (c_.attention_bias) {
      std::vector<float> b;
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
        const int64_t rows = std::string(n) == "q_proj" ? q : kv;
        MILES_RETURN_IF_ERROR(vec(p + "self_attn." + n + ".bias", rows, b));
        l.qkv_bias.insert(l.qkv_bias.end(), b.begin(), b.end());
      }
      if (c_.arch == Arch::kLlama && w_.contains(p + "self_attn.o_proj.bias"))
        MILES_RETURN_IF_ERROR(vec(p + "self_attn.o_proj.bias", d, l.o_bias));
    }
    if (c_.has_qk_norm()) {
      MILES_RETURN_IF_ERROR(norm(p + "self_attn.q_norm.weight", c_.head_dim, l.q_norm));
      MILES_RETURN_IF_ERROR(norm(p + "self_attn.k_norm.weight", c_.head_dim, l.k_norm));
    }
    return Status::Ok();
  }

  Status dense_mlp(const std::string& p, int64_t inter, PackedMatrix& gate_up, PackedMatrix& down,
                   PackedMatrix* gate_up_t, PackedMatrix* down_t) {
    const int64_t d = c_.hidden_size;
    MILES_ASSIGN_OR_RETURN(Tensor g, mat(p + "gate_proj.weight", inter, d));
    MILES_ASSIGN_OR_RETURN(Tensor u, mat(p + "up_proj.weight", inter, d));
    MILES_ASSIGN_OR_RETURN(Tensor dn, mat(p + "down_proj.weight", d, inter));
    pack(gate_up, {&g, &u}, gate_up_t);
    pack(down, {&dn}, down_t);
    keep_full_chunks(down);
    return Status::Ok();
  }

  // mlp_bias: [gate; up] stacked as their matrices are, and down's.
  Status mlp_biases(const std::string& p, LayerWeights& l) {
    l.gate_up_bias.clear();
    l.down_bias.clear();
    if (!c_.mlp_bias) return Status::Ok();
    std::vector<float> b;
    for (const char* n : {"gate_proj.bias", "up_proj.bias"}) {
      MILES_RETURN_IF_ERROR(vec(p + n, c_.intermediate_size, b));
      l.gate_up_bias.insert(l.gate_up_bias.end(), b.begin(), b.end());
    }
    return vec(p + "down_proj.bias", c_.hidden_size, l.down_bias);
  }

  Status moe(const std::string& p, LayerWeights& l, LayerWeightsT* t) {
    const int64_t e = c_.moe.num_experts;
    MILES_ASSIGN_OR_RETURN(Tensor router, mat(p + "mlp.gate.weight", e, c_.hidden_size));
    pack(l.router, {&router}, t ? &t->router_t : nullptr);
    l.experts.resize(static_cast<size_t>(e));
    if (t) t->experts.resize(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) {
      ExpertWeightsT* et = t ? &t->experts[i] : nullptr;
      MILES_RETURN_IF_ERROR(dense_mlp(p + "mlp.experts." + std::to_string(i) + ".",
                                      c_.moe.moe_intermediate_size, l.experts[i].gate_up,
                                      l.experts[i].down, et ? &et->gate_up_t : nullptr,
                                      et ? &et->down_t : nullptr));
    }
    l.router_bias.clear();
    if (c_.moe.score == RouterScore::kSigmoid)
      MILES_RETURN_IF_ERROR(vec(p + "mlp.gate.e_score_correction_bias", e, l.router_bias));
    l.has_shared = c_.moe.n_shared_experts > 0;
    if (!l.has_shared) return Status::Ok();
    return dense_mlp(p + "mlp.shared_experts.",
                     c_.moe.n_shared_experts * c_.moe.moe_intermediate_size, l.shared.gate_up,
                     l.shared.down, t ? &t->shared.gate_up_t : nullptr,
                     t ? &t->shared.down_t : nullptr);
  }

  Status layer(int64_t i, LayerWeights& l) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeightsT* t = bw_ ? &bw_->layers[i] : nullptr;
    const int64_t d = c_.hidden_size;
    MILES_RETURN_IF_ERROR(norm(p + "input_layernorm.weight", d, l.input_norm));
    l.attn_out_norm.clear();
    l.mlp_out_norm.clear();
    if (c_.has_block_output_norms()) {  // Gemma 3: its MLP's input norm is pre_feedforward's
      MILES_RETURN_IF_ERROR(norm(p + "post_attention_layernorm.weight", d, l.attn_out_norm));
      MILES_RETURN_IF_ERROR(norm(p + "pre_feedforward_layernorm.weight", d, l.post_norm));
      MILES_RETURN_IF_ERROR(norm(p + "post_feedforward_layernorm.weight", d, l.mlp_out_norm));
    } else {
      MILES_RETURN_IF_ERROR(norm(p + "post_attention_layernorm.weight", d, l.post_norm));
    }
    MILES_RETURN_IF_ERROR(attention(p, l, t));
    l.moe = c_.is_moe_layer(i);
    if (l.moe) return moe(p, l, t);
    MILES_RETURN_IF_ERROR(mlp_biases(p + "mlp.", l));
    return dense_mlp(p + "mlp.", c_.intermediate_size, l.gate_up, l.down,
                     t ? &t->gate_up_t : nullptr, t ? &t->down_t : nullptr);
  }

  // Fills m, reusing the storage it already has (a reload of same-shaped weights allocates
  // nothing large). Work items across the pool: the LM head (the largest, first), the embedding,
  // then one per layer; each writes only its own buffers, so the result does not depend on the
  // split. The first error in item order is returned.
  Status all(ModelWeights& m, ThreadPool* pool) {
    MILES_ASSIGN_OR_RETURN(Tensor emb,
                           mat("model.embed_tokens.weight", c_.vocab_size, c_.hidden_size));
    Tensor head = emb;
    if (!c_.tie_word_embeddings) {
      MILES_ASSIGN_OR_RETURN(head, mat("lm_head.weight", c_.vocab_size, c_.hidden_size));
    }
    m.layers.resize(static_cast<size_t>(c_.num_layers));
    if (bw_) bw_->layers.resize(static_cast<size_t>(c_.num_layers));
    std::vector<Status> got(static_cast<size_t>(c_.num_layers + 2));
    parallel_for(pool, c_.num_layers + 2, [&](int64_t i) {
      if (i == 0) {
        pack(m.lm_head, {&head}, bw_ ? &bw_->lm_head_t : nullptr);
      } else if (i == 1) {
        emb.to_f32(m.embed);
        if (const float s = c_.embed_scale(); s != 1.0f)
          for (float& x : m.embed) x = x * s;
      } else {
        got[i] = layer(i - 2, m.layers[i - 2]);
      }
    });
    for (const Status& s : got) MILES_RETURN_IF_ERROR(s);
    MILES_RETURN_IF_ERROR(norm("model.norm.weight", c_.hidden_size, m.final_norm));
    // MLA rotates the first qk_rope_head_dim of each (latent) head.
    MILES_ASSIGN_OR_RETURN(
        m.rope,
        kernels::make_rope_table(c_.rope, c_.is_mla() ? c_.mla.qk_rope_head_dim : c_.head_dim));
    if (c_.arch == Arch::kGemma3) {
      MILES_ASSIGN_OR_RETURN(m.rope_local, kernels::make_rope_table(c_.rope_local, c_.head_dim));
    }
    m.programs.clear();
    for (int64_t l = 0; l < c_.num_layers; ++l)
      m.programs.push_back(describe_layer(c_, l, m.layers[l]));
    return Status::Ok();
  }

 private:
  const ModelConfig& c_;
  const TensorMap& w_;
  BackwardWeights* bw_;
};

}  // namespace

Result<ModelWeights> load_model_weights(const ModelConfig& config, const TensorMap& weights,
                                        ThreadPool* pool) {
  ModelWeights m;
  MILES_RETURN_IF_ERROR(Loader(config, weights).all(m, pool));
  return m;
}

Status reload_model_weights(const ModelConfig& config, const TensorMap& weights, ModelWeights& m,
                            ThreadPool* pool, BackwardWeights* transposed) {
  return Loader(config, weights, transposed).all(m, pool);
}

}  // namespace miles
