// Model::backward: gradients of every parameter from a forward's tape and d loss / d logits.
//
// Phases mirror the forward in reverse: LM head → final norm → per layer (MLP or MoE, then
// attention) → embedding. Weight gradients are GEMMs over the batch's tokens with the
// chunk-and-tree rule; vector gradients (norms, biases) and scatter-adds run in ascending token
// order, so the result depends only on the batch's content, never on the thread count.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "miles/backward_kernels.h"
#include "kernels/reduce.h"
#include "miles/comm.h"
#include "miles/flat_params.h"
#include "miles/kernels.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "model/backward_weights.h"
#include "model/elementwise.h"
#include "model/forward_tape.h"
#include "miles/grad_sink.h"
#include "model/model_weights.h"

namespace miles {

namespace {

using kernels::gemm;
using kernels::gemm_weight_grad;

constexpr int64_t kRopeRows = 16;  // tokens per RoPE-backward work item

// Column sums of rows [M, N] (stride ld) into out[N], ascending rows.
void column_sums(const float* x, int64_t m, int64_t n, int64_t ld, float* out) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) out[j] = out[j] + x[r * ld + j];
}

class Backward {
 public:
  Backward(const ModelConfig& c, const ModelWeights& w, const BackwardWeights& bw,
           const ForwardTape::Impl& tape, FlatTensors& g, ThreadPool* pool, const BackwardIo& io)
      : c_(c),
        w_(w),
        bw_(bw),
        tape_(tape),
        g_(g, io.fold, pool),
        pool_(pool),
        io_(io),
        t_(tape.tokens.size()) {}

  Status status() const { return err_; }

  void run(std::span<const float> d_output) {
    std::vector<float> dh = tape_.layer_end == c_.num_layers
                                ? head(d_output)
                                : std::vector<float>(d_output.begin(), d_output.end());
    for (int64_t layer = tape_.layer_end - 1; layer >= tape_.layer_begin; --layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      if (w_.layers[layer].moe) {
        moe(layer, p, dh);
      } else {
        mlp(layer, p, dh);
      }
      attention(layer, p, dh);
    }
    if (tape_.layer_begin == 0) {
      embedding(dh);
    } else if (io_.d_input) {
      *io_.d_input = std::move(dh);
    }
    g_.finish();
    if (!tied_stored_) GradSink::fold_buffer(io_.tied_head_grad, io_.tied_fold, pool_);
  }

 private:
  float eps() const { return static_cast<float>(c_.rms_norm_eps); }

  // Tensor parallelism: sums a partial over the group (tree order); the first error sticks.
  void reduce(float* x, int64_t n) {
    if (!io_.tp || !io_.tp->comm || io_.tp->comm->size() == 1 || !err_.ok()) return;
    err_ = io_.tp->comm->all_reduce_sum_deterministic(std::span<float>(x, static_cast<size_t>(n)));
  }

  // logits = norm(h) · headᵀ. Returns d h_final.
  std::vector<float> head(std::span<const float> dlogits) {
    const int64_t d = c_.hidden_size, v = c_.vocab_size;
    std::vector<float> dnormed(static_cast<size_t>(t_ * d));
    gemm(dlogits.data(), t_, v, bw_.lm_head_t, dnormed.data(), d, pool_);
    reduce(dnormed.data(), t_ * d);  // vocabulary-parallel head
    // Tied: the head's gradient lands in io.tied_head_grad when given, else in the embedding's (the
    // embedding's own scatter then adds to it).
    if (!c_.tie_word_embeddings) {
      g_.weight_grad(dlogits.data(), v, tape_.normed.data(), d, t_, d, {{"lm_head.weight", v}});
    } else if (!io_.tied_head_grad.empty()) {
      std::vector<const float*> lefts;
      for (const std::span<float>& l : io_.tied_fold) lefts.push_back(l.data());
      const kernels::WeightGradPart part{
          0, v, io_.tied_fold.empty() ? io_.tied_head_grad.data() : io_.tied_fold.back().data(),
          lefts};
      gemm_weight_grad(dlogits.data(), v, tape_.normed.data(), d, t_, {&part, 1}, d, pool_);
      tied_stored_ = true;
    } else {
      gemm_weight_grad(dlogits.data(), v, tape_.normed.data(), d, t_, v, d,
                       g_.overwrite("model.embed_tokens.weight"), pool_);
    }
    std::vector<float> dh(static_cast<size_t>(t_ * d));
    kernels::rmsnorm_backward(tape_.h_final.data(), dnormed.data(), t_, d, w_.final_norm.data(),
                              eps(), dh.data(), g_.accumulate("model.norm.weight"), pool_);
    return dh;
  }

  // h_out = h_mid + down(swiglu(gate_up(norm(h_mid)))); dh: d h_out in, d h_mid out.
  void mlp(int64_t layer, const std::string& p, std::vector<float>& dh) {
    const LayerTape& lt = tape_.layers[layer];
    const LayerWeightsT& wt = bw_.layers[layer];
    const int64_t d = c_.hidden_size, f = c_.intermediate_size;
    std::vector<float>& dact = sized(dact_, t_ * f);
    std::vector<float>& dgu = sized(dgu_, t_ * 2 * f);
    gemm(dh.data(), t_, d, wt.down_t, dact.data(), f, pool_);
    g_.weight_grad(dh.data(), d, lt.act.data(), f, t_, f, {{p + "mlp.down_proj.weight", d}});
    parallel_ranges(pool_, t_, 16 * f, [&](int64_t r0, int64_t r1) {  // rows are independent
      kernels::swiglu_backward(lt.gate_up.data() + r0 * 2 * f, lt.gate_up.data() + r0 * 2 * f + f,
                               dact.data() + r0 * f, r1 - r0, f, 2 * f, dgu.data() + r0 * 2 * f,
                               dgu.data() + r0 * 2 * f + f, 2 * f);
    });
    g_.weight_grad(dgu.data(), 2 * f, lt.xn2.data(), d, t_, d,
                   {{p + "mlp.gate_proj.weight", f}, {p + "mlp.up_proj.weight", f}});
    std::vector<float>& dxn = sized(dxn_, t_ * d);
    gemm(dgu.data(), t_, 2 * f, wt.gate_up_t, dxn.data(), d, pool_);
    reduce(dxn.data(), t_ * d);  // column-parallel input gradient
    post_norm(layer, p, dxn, dh);
  }

  // d h_mid = d h_out + norm_backward(d xn2).
  void post_norm(int64_t layer, const std::string& p, std::vector<float>& dxn,
                 std::vector<float>& dh) {
    const LayerTape& lt = tape_.layers[layer];
    kernels::rmsnorm_backward(lt.h_mid.data(), dxn.data(), t_, c_.hidden_size,
                              w_.layers[layer].post_norm.data(), eps(), dxn.data(),
                              g_.accumulate(p + "post_attention_layernorm.weight"), pool_);
    add_into(dh.data(), dxn.data(), t_ * c_.hidden_size, pool_);
  }

  void moe(int64_t layer, const std::string& p, std::vector<float>& dh) {
    const LayerTape& lt = tape_.layers[layer];
    const MoeTape& mt = lt.moe;
    const LayerWeightsT& wt = bw_.layers[layer];
    const int64_t d = c_.hidden_size, f = c_.moe.moe_intermediate_size, k = c_.moe.top_k;
    const int64_t e = c_.moe.num_experts;
    // out_t = Σ_j w_tj y_tj: d w_tj = dh_t · y_tj; d y_tj = w_tj dh_t.
    std::vector<float> dw(static_cast<size_t>(t_ * k));
    for (int64_t s = 0; s < t_ * k; ++s)
      dw[s] = kernels::detail::dot(dh.data() + (s / k) * d, mt.y.data() + s * d, d);
    // (the forward summed each expert output over the tensor-parallel group: y and dw are complete)
    std::vector<float> dxn(static_cast<size_t>(t_ * d), 0.0f);
    for (int64_t ex = 0; ex < e; ++ex) {
      const ExpertTape& et = mt.experts[ex];
      const std::string xp = p + "mlp.experts." + std::to_string(ex) + ".";
      if (et.slots.empty()) continue;  // its gradients stay zero (GradSink::finish)
      const int64_t n = et.slots.size();
      std::vector<float> dy(static_cast<size_t>(n * d)), xs(static_cast<size_t>(n * d));
      for (int64_t r = 0; r < n; ++r) {
        const int64_t s = et.slots[r], tok = s / k;
        const float wgt = mt.weights[s];
        for (int64_t i = 0; i < d; ++i) dy[r * d + i] = dh[tok * d + i] * wgt;
        std::copy_n(lt.xn2.data() + tok * d, d, xs.data() + r * d);
      }
      std::vector<float> dact(static_cast<size_t>(n * f)), dgu(static_cast<size_t>(n * 2 * f));
      gemm(dy.data(), n, d, wt.experts[ex].down_t, dact.data(), f, pool_);
      g_.weight_grad(dy.data(), d, et.act.data(), f, n, f, {{xp + "down_proj.weight", d}});
      kernels::swiglu_backward(et.gate_up.data(), et.gate_up.data() + f, dact.data(), n, f, 2 * f,
                               dgu.data(), dgu.data() + f, 2 * f);
      g_.weight_grad(dgu.data(), 2 * f, xs.data(), d, n, d,
                     {{xp + "gate_proj.weight", f}, {xp + "up_proj.weight", f}});
      std::vector<float> dxs(static_cast<size_t>(n * d));
      gemm(dgu.data(), n, 2 * f, wt.experts[ex].gate_up_t, dxs.data(), d, pool_);
      for (int64_t r = 0; r < n; ++r)
        add_into(dxn.data() + (et.slots[r] / k) * d, dxs.data() + r * d, d);
    }
    reduce(dxn.data(), t_ * d);
    // Gate weights: w = p[ids] (/ Σ p[ids] when renormalised); router softmax backward.
    std::vector<float> dz(static_cast<size_t>(t_ * e), 0.0f);
    for (int64_t i = 0; i < t_; ++i) {
      const float* prob = mt.probs.data() + i * e;
      const int32_t* ids = mt.ids.data() + i * k;
      const float* w = mt.weights.data() + i * k;
      const float* g = dw.data() + i * k;
      float* dzi = dz.data() + i * e;
      std::vector<float> dp(static_cast<size_t>(e), 0.0f);
      if (c_.moe.norm_topk_prob) {
        float sum = 0.0f, gw = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum = sum + prob[ids[j]];
        for (int64_t j = 0; j < k; ++j) gw = std::fma(g[j], w[j], gw);
        for (int64_t j = 0; j < k; ++j) dp[ids[j]] = (g[j] - gw) / sum;
      } else {
        for (int64_t j = 0; j < k; ++j) dp[ids[j]] = g[j];
      }
      float pd = 0.0f;
      for (int64_t x = 0; x < e; ++x) pd = std::fma(prob[x], dp[x], pd);
      for (int64_t x = 0; x < e; ++x) dzi[x] = prob[x] * (dp[x] - pd);
    }
    g_.weight_grad(dz.data(), e, lt.xn2.data(), d, t_, d, {{p + "mlp.gate.weight", e}});
    std::vector<float> dxr(static_cast<size_t>(t_ * d));
    gemm(dz.data(), t_, e, wt.router_t, dxr.data(), d, pool_);
    add_into(dxn.data(), dxr.data(), t_ * d, pool_);
    post_norm(layer, p, dxn, dh);
  }

  // h_mid = h_in + o(attn(rope(norm_qk(qkv(norm(h_in)))))); dh: d h_mid in, d h_in out.
  void attention(int64_t layer, const std::string& p, std::vector<float>& dh) {
    const LayerTape& lt = tape_.layers[layer];
    const LayerWeights& l = w_.layers[layer];
    const LayerWeightsT& wt = bw_.layers[layer];
    const int64_t d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim;
    const int64_t ld = qd + 2 * kvd;
    // o_proj
    std::vector<float>& dattn = sized(dattn_, t_ * qd);
    gemm(dh.data(), t_, d, wt.o_t, dattn.data(), qd, pool_);
    g_.weight_grad(dh.data(), d, lt.attn.data(), qd, t_, qd, {{p + "self_attn.o_proj.weight", d}});
    if (!l.o_bias.empty())
      column_sums(dh.data(), t_, d, d, g_.accumulate(p + "self_attn.o_proj.bias"));
    // attention per sequence, then RoPE and q/k norm backward per token
    std::vector<float>& dqkv = sized(dqkv_, t_ * ld);  // every row written by its kv heads
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // Work items over (sequence, kv head, query block), then (sequence, kv head, run of keys);
    // every sum keeps its (head, query, key) order.
    std::vector<kernels::AttentionSeq> seqs;
    for (size_t s = 0; s < tape_.seqs.size(); ++s) {
      const int64_t off = tape_.offset[s];
      const float* q = lt.qkv.data() + off * ld;
      float* dq = dqkv.data() + off * ld;
      seqs.push_back({q, q + qd, q + qd + kvd, dattn.data() + off * qd, dq, dq + qd, dq + qd + kvd,
                      tape_.seqs[s].n_tokens});
    }
    kernels::attention_backward_batch(seqs, ld, ld, c_.num_heads, c_.num_kv_heads, hd, scale,
                                      pool_);
    std::vector<float> dnorm_q, dnorm_k;
    if (!l.q_norm.empty()) {
      dnorm_q.assign(static_cast<size_t>(hd), 0.0f);
      dnorm_k.assign(static_cast<size_t>(hd), 0.0f);
    }
    // RoPE per token (disjoint rows, in parallel), then the q/k norms in ascending token order.
    parallel_for(pool_, (t_ + kRopeRows - 1) / kRopeRows, [&](int64_t b) {
      for (int64_t i = b * kRopeRows; i < std::min(t_, (b + 1) * kRopeRows); ++i) {
        float* dq = dqkv.data() + i * ld;
        // dq's heads then dk's, side by side in the row (k at qd = num_heads · hd).
        kernels::rope_backward(dq, 1, c_.num_heads + c_.num_kv_heads, hd, &tape_.positions[i],
                               w_.rope);
      }
    });
    for (int64_t i = 0; i < t_ && !l.q_norm.empty(); ++i) {
      float* dq = dqkv.data() + i * ld;
      const float* raw = lt.qkv_raw.data() + i * ld;
      kernels::rmsnorm_backward(raw, dq, c_.num_heads, hd, l.q_norm.data(), eps(), dq,
                                dnorm_q.data());
      kernels::rmsnorm_backward(raw + qd, dq + qd, c_.num_kv_heads, hd, l.k_norm.data(), eps(),
                                dq + qd, dnorm_k.data());
    }
    if (!l.q_norm.empty()) {
      reduce(dnorm_q.data(), hd);  // heads are split; the norm weights are shared
      reduce(dnorm_k.data(), hd);
      std::copy(dnorm_q.begin(), dnorm_q.end(), g_.overwrite(p + "self_attn.q_norm.weight"));
      std::copy(dnorm_k.begin(), dnorm_k.end(), g_.overwrite(p + "self_attn.k_norm.weight"));
    }
    if (!l.qkv_bias.empty()) {
      std::vector<float> db(static_cast<size_t>(ld), 0.0f);
      column_sums(dqkv.data(), t_, ld, ld, db.data());
      std::copy_n(db.data(), qd, g_.overwrite(p + "self_attn.q_proj.bias"));
      std::copy_n(db.data() + qd, kvd, g_.overwrite(p + "self_attn.k_proj.bias"));
      std::copy_n(db.data() + qd + kvd, kvd, g_.overwrite(p + "self_attn.v_proj.bias"));
    }
    g_.weight_grad(dqkv.data(), ld, lt.xn1.data(), d, t_, d,
                   {{p + "self_attn.q_proj.weight", qd},
                    {p + "self_attn.k_proj.weight", kvd},
                    {p + "self_attn.v_proj.weight", kvd}});
    std::vector<float>& dxn = sized(dxn_, t_ * d);
    gemm(dqkv.data(), t_, ld, wt.qkv_t, dxn.data(), d, pool_);
    reduce(dxn.data(), t_ * d);  // column-parallel input gradient
    kernels::rmsnorm_backward(lt.h_in.data(), dxn.data(), t_, d, l.input_norm.data(), eps(),
                              dxn.data(), g_.accumulate(p + "input_layernorm.weight"), pool_);
    add_into(dh.data(), dxn.data(), t_ * d, pool_);
  }

  void embedding(const std::vector<float>& dh) {
    const int64_t vb = io_.tp ? io_.tp->vocab_begin : 0, vl = c_.vocab_size;
    std::vector<int64_t> rows(static_cast<size_t>(t_));
    for (int64_t i = 0; i < t_; ++i) {
      const int64_t row = tape_.tokens[i] - vb;  // vocabulary-parallel: this rank's rows only
      rows[i] = row >= 0 && row < vl ? row : -1;
    }
    g_.scatter_rows("model.embed_tokens.weight", rows, dh.data(), c_.hidden_size);
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  const BackwardWeights& bw_;
  const ForwardTape::Impl& tape_;
  GradSink g_;
  ThreadPool* pool_;
  const BackwardIo& io_;
  const int64_t t_;
  bool tied_stored_ = false;  // the tied head's share written (folded) by head()
  // Per-layer temporaries, sized once and reused by every layer (each use overwrites them whole).
  std::vector<float> dact_, dgu_, dxn_, dattn_, dqkv_;
  Status err_;
};

}  // namespace

Status Model::backward(const ForwardTape& tape, std::span<const float> d_output, FlatTensors& grads,
                       ThreadPool* pool, const BackwardIo& io) const {
  const ForwardTape::Impl& t = tape.impl();
  const int64_t n = t.tokens.size();
  if (t.layers.size() != static_cast<size_t>(config_.num_layers) || n == 0)
    return Status::Error("backward needs the tape of a training forward of this model");
  const bool head = t.layer_end == config_.num_layers;
  const int64_t want = n * (head ? config_.vocab_size : config_.hidden_size);
  if (static_cast<int64_t>(d_output.size()) != want)
    return Status::Error(std::string("backward: d ") + (head ? "logits" : "hidden") + " has " +
                         std::to_string(d_output.size()) + " values, expected " +
                         std::to_string(want));
  if (!io.tied_head_grad.empty() &&
      (!config_.tie_word_embeddings ||
       static_cast<int64_t>(io.tied_head_grad.size()) != config_.vocab_size * config_.hidden_size))
    return Status::Error("backward: tied_head_grad needs a tied model and vocab × hidden values");
  if (grads.layout().total() != ParamLayout::for_model(config_)->total())
    return Status::Error("backward: the gradient buffer's layout does not match this model");
  for (const FlatTensors* f : io.fold)
    if (f == nullptr || f->layout().total() != grads.layout().total())
      return Status::Error("backward: a buffer to fold into does not match the gradients' layout");
  if (!io.tied_fold.empty() && io.tied_head_grad.empty())
    return Status::Error("backward: tied_fold needs tied_head_grad");
  for (const std::span<float>& l : io.tied_fold)
    if (l.size() != io.tied_head_grad.size())
      return Status::Error("backward: a tied share to fold into has the wrong size");
  Backward b(config_, *w_, backward_weights(pool), t, grads, pool, io);
  b.run(d_output);
  return b.status();
}

}  // namespace miles
