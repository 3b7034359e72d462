// DeepSeek-V3's multi-head latent attention (MLA), run absorbed (model_config.h's MlaConfig): two
// ops of the layer program around the ordinary RoPE and attention ops.
//
//   kMlaQkv: the fused [q_a | q; kv_a] projection's output → the attention's q/k/v rows, before
//     RoPE: head h's query [q_pe_h, q_nope_h · W_kb_h], the key [k_pe, c], the value [0, c], with
//     q_a_layernorm → q_b_proj on the query path, c = kv_a_layernorm(compressed kv), and q_pe, k_pe
//     de-interleaved where rope_interleave (so the half-split RoPE of the first qk_rope_head_dim
//     dimensions rotates DeepSeek's interleaved pairs).
//   kMlaOut: the attention's latent output → head h's value output o_h[rope:] · W_vbᵀ, o_proj's
//     input.
// W_kb_h / W_vb_h: head h's key and value rows of kv_b_proj.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "miles/grad_sink.h"
#include "miles/kernels.h"
#include "miles/model_config.h"

namespace miles {
class ThreadPool;

// The latent norms' epsilon (DeepseekV3RMSNorm's default, not the config's rms_norm_eps).
inline constexpr float kMlaNormEps = 1e-6f;

// MLA's sizes per token, from the config: heads h, q_lora_rank ql (0: q_proj), kv_lora_rank kl,
// qk_nope / qk_rope / v head dims, a query head qk = nope + r, a latent head hd = r + kl, the
// attention's q part qd = h · hd and kv part kvd = hd, a q/k/v row ld = qd + 2 kvd, the
// a-projection's row wa with the compressed kv at kv_at.
struct MlaDims {
  int64_t h, ql, kl, nope, r, v, qk, hd, qd, kvd, ld, kv_at, wa;
  explicit MlaDims(const ModelConfig& c)
      : h(c.num_heads),
        ql(c.mla.q_lora_rank),
        kl(c.mla.kv_lora_rank),
        nope(c.mla.qk_nope_head_dim),
        r(c.mla.qk_rope_head_dim),
        v(c.mla.v_head_dim),
        qk(nope + r),
        hd(r + kl),
        qd(h * hd),
        kvd(hd),
        ld(qd + 2 * kvd),
        kv_at(ql > 0 ? ql : h * qk),
        wa(kv_at + kl + r) {}
};

struct MlaWeights {
  kernels::PackedMatrix q_b;                // (H · qk_head_dim, q_lora_rank), when q_lora_rank
  std::vector<float> q_a_norm, kv_a_norm;   // (q_lora_rank), (kv_lora_rank)
  std::vector<kernels::PackedMatrix> kb_t;  // per head W_kbᵀ (kv_lora_rank, qk_nope_head_dim)
  std::vector<kernels::PackedMatrix> vb;    // per head W_vb (v_head_dim, kv_lora_rank)
};

// The backward's packs: q_b_projᵀ, W_kb and W_vbᵀ per head.
struct MlaWeightsT {
  kernels::PackedMatrix q_b_t;
  std::vector<kernels::PackedMatrix> kb, vb_t;
};

// Widths per token: the fused a-projection's output, and o_proj's input.
int64_t mla_a_width(const ModelConfig& c);
int64_t mla_out_width(const ModelConfig& c);

// The a-projection's tensors in their rows' order ([q_a_proj or q_proj; kv_a_proj_with_mqa]).
std::vector<std::pair<std::string, int64_t>> mla_a_parts(const ModelConfig& c,
                                                         const std::string& layer_prefix);

// Loads the MLA tensors of layer prefix `p` (besides the a-projection and o_proj).
class TensorMap;
Status load_mla_weights(const ModelConfig& c, const TensorMap& w, const std::string& p,
                        MlaWeights& out);
void build_mla_backward(const MlaWeights& w, MlaWeightsT& t);

// a [T, mla_a_width] → qkv [T, q_dim + 2 kv_dim] (before RoPE).
void mla_qkv(const ModelConfig& c, const MlaWeights& w, const float* a, int64_t t, float* qkv,
             ThreadPool* pool);
// attn [T, q_dim] → out [T, mla_out_width].
void mla_out(const ModelConfig& c, const MlaWeights& w, const float* attn, int64_t t, float* out,
             ThreadPool* pool);

// Backwards: d in written whole; weight gradients of layer prefix `p` into g. Under tensor
// parallelism (this rank's heads) `reduce` sums the latent's gradients over the group before the
// replicated norms and projection take them (d in is then the whole model's).
void mla_qkv_backward(const ModelConfig& c, const MlaWeights& w, const MlaWeightsT& wt,
                      const float* a, const float* dqkv, int64_t t, float* da, const std::string& p,
                      GradSink& g, ThreadPool* pool,
                      const std::function<void(float*, int64_t)>& reduce);
void mla_out_backward(const ModelConfig& c, const MlaWeightsT& wt, const float* attn,
                      const float* dout, int64_t t, float* dattn, const std::string& p, GradSink& g,
                      ThreadPool* pool);

}  // namespace miles
