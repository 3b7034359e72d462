// DeepSeek-V3's MLA, absorbed (mla.h). Every product is a batch-invariant GEMM over the tokens'
// rows and every norm a per-row kernel, so a token's q/k/v rows do not depend on its batch: the
// engine's decode and the trainer's packed forward give the same bits.
#include "model/mla.h"

#include <algorithm>

#include "miles/backward_kernels.h"
#include "miles/checkpoint.h"
#include "miles/thread_pool.h"

namespace miles {

namespace {

// Position j of the rotated block (r values) reads source position src(j): DeepSeek's interleaved
// pairs (x0, x1), (x2, x3), … laid out as [x0, x2, …, x1, x3, …] for the half-split rotation. (The
// device functors' twin: device_math.h's mla_rope_source.)
int64_t rope_source(const ModelConfig& c, int64_t j) {
  const int64_t r = c.mla.qk_rope_head_dim;
  if (!c.mla.rope_interleave) return j;
  return j < r / 2 ? 2 * j : 2 * (j - r / 2) + 1;
}

// The query path: q [T, H · qk] from a (q_b_proj of the normed q_a, or q_proj's rows as they are).
std::vector<float> queries(const ModelConfig& c, const MlaWeights& w, const float* a, int64_t t,
                           std::vector<float>* qan, ThreadPool* pool) {
  const MlaDims d(c);
  std::vector<float> q(static_cast<size_t>(t * d.h * d.qk));
  if (d.ql == 0) {
    for (int64_t i = 0; i < t; ++i)
      std::copy_n(a + i * d.wa, d.h * d.qk, q.data() + i * d.h * d.qk);
    return q;
  }
  std::vector<float> n(static_cast<size_t>(t * d.ql));
  for (int64_t i = 0; i < t; ++i) std::copy_n(a + i * d.wa, d.ql, n.data() + i * d.ql);
  kernels::rmsnorm(n.data(), t, d.ql, w.q_a_norm.data(), kMlaNormEps, n.data());
  kernels::gemm(n.data(), t, d.ql, w.q_b, q.data(), d.h * d.qk, pool);
  if (qan) *qan = std::move(n);
  return q;
}

}  // namespace

int64_t mla_a_width(const ModelConfig& c) { return MlaDims(c).wa; }
int64_t mla_out_width(const ModelConfig& c) { return c.num_heads * c.mla.v_head_dim; }

std::vector<std::pair<std::string, int64_t>> mla_a_parts(const ModelConfig& c,
                                                         const std::string& p) {
  const MlaDims d(c);
  std::vector<std::pair<std::string, int64_t>> parts;
  if (d.ql > 0) {
    parts.emplace_back(p + "self_attn.q_a_proj.weight", d.ql);
  } else {
    parts.emplace_back(p + "self_attn.q_proj.weight", d.h * d.qk);
  }
  parts.emplace_back(p + "self_attn.kv_a_proj_with_mqa.weight", d.kl + d.r);
  return parts;
}

Status load_mla_weights(const ModelConfig& c, const TensorMap& w, const std::string& p,
                        MlaWeights& out) {
  const MlaDims d(c);
  const std::string a = p + "self_attn.";
  if (d.ql > 0) {
    MILES_ASSIGN_OR_RETURN(Tensor qb, w.get(a + "q_b_proj.weight", {d.h * d.qk, d.ql}));
    out.q_b.assign_rows({&qb});
    MILES_ASSIGN_OR_RETURN(Tensor qn, w.get(a + "q_a_layernorm.weight", {d.ql}));
    qn.to_f32(out.q_a_norm);
  }
  MILES_ASSIGN_OR_RETURN(Tensor kn, w.get(a + "kv_a_layernorm.weight", {d.kl}));
  kn.to_f32(out.kv_a_norm);
  MILES_ASSIGN_OR_RETURN(Tensor kvb, w.get(a + "kv_b_proj.weight", {d.h * (d.nope + d.v), d.kl}));
  out.kb_t.resize(static_cast<size_t>(d.h));
  out.vb.resize(static_cast<size_t>(d.h));
  for (int64_t h = 0; h < d.h; ++h) {
    const int64_t r0 = h * (d.nope + d.v);
    const Tensor kb = kvb.rows(r0, r0 + d.nope), vb = kvb.rows(r0 + d.nope, r0 + d.nope + d.v);
    kernels::PackedMatrix k;
    k.assign_rows({&kb});
    k.transpose_into(out.kb_t[h]);
    out.vb[h].assign_rows({&vb});
  }
  return Status::Ok();
}

void build_mla_backward(const MlaWeights& w, MlaWeightsT& t) {
  if (w.q_b.n() > 0) w.q_b.transpose_into(t.q_b_t);
  t.kb.resize(w.kb_t.size());
  t.vb_t.resize(w.vb.size());
  for (size_t h = 0; h < w.kb_t.size(); ++h) {
    w.kb_t[h].transpose_into(t.kb[h]);
    w.vb[h].transpose_into(t.vb_t[h]);
  }
}

void mla_qkv(const ModelConfig& c, const MlaWeights& w, const float* a, int64_t t, float* qkv,
             ThreadPool* pool) {
  const MlaDims d(c);
  const int64_t ld = d.ld;
  const std::vector<float> q = queries(c, w, a, t, nullptr, pool);
  // The compressed kv, normed: the key's and the value's latent.
  std::vector<float> lat(static_cast<size_t>(t * d.kl));
  for (int64_t i = 0; i < t; ++i) std::copy_n(a + i * d.wa + d.kv_at, d.kl, lat.data() + i * d.kl);
  kernels::rmsnorm(lat.data(), t, d.kl, w.kv_a_norm.data(), kMlaNormEps, lat.data());
  for (int64_t i = 0; i < t; ++i) {
    float* row = qkv + i * ld;
    const float* qi = q.data() + i * d.h * d.qk;
    for (int64_t h = 0; h < d.h; ++h)
      for (int64_t j = 0; j < d.r; ++j)
        row[h * d.hd + j] = qi[h * d.qk + d.nope + rope_source(c, j)];
    float* k = row + d.qd;
    float* v = k + d.kvd;
    const float* pe = a + i * d.wa + d.kv_at + d.kl;
    for (int64_t j = 0; j < d.r; ++j) k[j] = pe[rope_source(c, j)];
    std::copy_n(lat.data() + i * d.kl, d.kl, k + d.r);
    std::fill(v, v + d.r, 0.0f);
    std::copy_n(lat.data() + i * d.kl, d.kl, v + d.r);
  }
  // Each head's absorbed query: q_nope_h · W_kb_h into its latent part.
  for (int64_t h = 0; h < d.h; ++h)
    kernels::gemm(q.data() + h * d.qk, t, d.h * d.qk, w.kb_t[h], qkv + h * d.hd + d.r, ld, pool);
}

void mla_out(const ModelConfig& c, const MlaWeights& w, const float* attn, int64_t t, float* out,
             ThreadPool* pool) {
  const MlaDims d(c);
  for (int64_t h = 0; h < d.h; ++h)
    kernels::gemm(attn + h * d.hd + d.r, t, d.qd, w.vb[h], out + h * d.v, d.h * d.v, pool);
}

namespace {

// Rows [row0, row0 + rows) of tensor `name`'s gradient: dyᵀ · x over t rows.
void rows_grad(GradSink& g, const std::string& name, int64_t row0, const float* dy, int64_t ldy,
               int64_t rows, const float* x, int64_t ldx, int64_t k, int64_t t, ThreadPool* pool) {
  float* dst = g.accumulate(name) + row0 * k;  // each row block of the tensor written once
  const kernels::WeightGradPart part{0, rows, dst, {}};
  kernels::gemm_weight_grad(dy, ldy, x, ldx, t, {&part, 1}, k, pool);
}

}  // namespace

void mla_out_backward(const ModelConfig& c, const MlaWeightsT& wt, const float* attn,
                      const float* dout, int64_t t, float* dattn, const std::string& p, GradSink& g,
                      ThreadPool* pool) {
  const MlaDims d(c);
  const std::string kvb = p + "self_attn.kv_b_proj.weight";
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < d.h; ++h) std::fill_n(dattn + i * d.qd + h * d.hd, d.r, 0.0f);
  for (int64_t h = 0; h < d.h; ++h) {
    kernels::gemm(dout + h * d.v, t, d.h * d.v, wt.vb_t[h], dattn + h * d.hd + d.r, d.qd, pool);
    rows_grad(g, kvb, h * (d.nope + d.v) + d.nope, dout + h * d.v, d.h * d.v, d.v,
              attn + h * d.hd + d.r, d.qd, d.kl, t, pool);
  }
}

void mla_qkv_backward(const ModelConfig& c, const MlaWeights& w, const MlaWeightsT& wt,
                      const float* a, const float* dqkv, int64_t t, float* da, const std::string& p,
                      GradSink& g, ThreadPool* pool,
                      const std::function<void(float*, int64_t)>& reduce) {
  const MlaDims d(c);
  const int64_t ld = d.ld;
  const std::string at = p + "self_attn.";
  std::vector<float> qan;
  const std::vector<float> q = queries(c, w, a, t, &qan, pool);
  // d q [T, H · qk]: the rotated parts back to their places, the nope parts from the absorption.
  std::vector<float> dq(static_cast<size_t>(t * d.h * d.qk));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < d.h; ++h)
      for (int64_t j = 0; j < d.r; ++j)
        dq[(i * d.h + h) * d.qk + d.nope + rope_source(c, j)] = dqkv[i * ld + h * d.hd + j];
  for (int64_t h = 0; h < d.h; ++h) {
    kernels::gemm(dqkv + h * d.hd + d.r, t, ld, wt.kb[h], dq.data() + h * d.qk, d.h * d.qk, pool);
    rows_grad(g, at + "kv_b_proj.weight", h * (d.nope + d.v), q.data() + h * d.qk, d.h * d.qk,
              d.nope, dqkv + h * d.hd + d.r, ld, d.kl, t, pool);
  }
  // The latent: d c = d k[r:] + d v[r:] and d k_pe (this rank's heads' parts, summed over the
  // group), then through kv_a_layernorm; d k_pe to its places.
  std::vector<float> x(static_cast<size_t>(t * d.kl)), dc(static_cast<size_t>(t * d.kl));
  std::vector<float> dpe(static_cast<size_t>(t * d.r));
  for (int64_t i = 0; i < t; ++i) {
    const float* dk = dqkv + i * ld + d.qd;
    const float* dv = dk + d.kvd;
    for (int64_t j = 0; j < d.kl; ++j) dc[i * d.kl + j] = dk[d.r + j] + dv[d.r + j];
    std::copy_n(a + i * d.wa + d.kv_at, d.kl, x.data() + i * d.kl);
    std::copy_n(dk, d.r, dpe.data() + i * d.r);
  }
  reduce(dc.data(), t * d.kl);
  reduce(dpe.data(), t * d.r);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < d.r; ++j)
      da[i * d.wa + d.kv_at + d.kl + rope_source(c, j)] = dpe[i * d.r + j];
  kernels::rmsnorm_backward(x.data(), dc.data(), t, d.kl, w.kv_a_norm.data(), kMlaNormEps,
                            dc.data(), g.accumulate(at + "kv_a_layernorm.weight"), pool);
  for (int64_t i = 0; i < t; ++i) std::copy_n(dc.data() + i * d.kl, d.kl, da + i * d.wa + d.kv_at);
  if (d.ql == 0) {
    for (int64_t i = 0; i < t; ++i)
      std::copy_n(dq.data() + i * d.h * d.qk, d.h * d.qk, da + i * d.wa);
    return;
  }
  // q_b_proj and q_a_layernorm.
  g.weight_grad(dq.data(), d.h * d.qk, qan.data(), d.ql, t, d.ql,
                {{at + "q_b_proj.weight", d.h * d.qk}});
  std::vector<float> dn(static_cast<size_t>(t * d.ql)), xa(static_cast<size_t>(t * d.ql));
  kernels::gemm(dq.data(), t, d.h * d.qk, wt.q_b_t, dn.data(), d.ql, pool);
  reduce(dn.data(), t * d.ql);
  for (int64_t i = 0; i < t; ++i) std::copy_n(a + i * d.wa, d.ql, xa.data() + i * d.ql);
  kernels::rmsnorm_backward(xa.data(), dn.data(), t, d.ql, w.q_a_norm.data(), kMlaNormEps,
                            dn.data(), g.accumulate(at + "q_a_layernorm.weight"), pool);
  for (int64_t i = 0; i < t; ++i) std::copy_n(dn.data() + i * d.ql, d.ql, da + i * d.wa);
}

}  // namespace miles
