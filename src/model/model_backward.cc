// Model::backward: gradients of every parameter from a forward's tape and d loss / d logits.
//
// Phases mirror the forward in reverse: LM head → final norm → per layer (MLP or MoE, then
// attention) → embedding. Weight gradients are GEMMs over the batch's tokens with the
// chunk-and-tree rule; vector gradients (norms, biases) and scatter-adds run in ascending token
// order, so the result depends only on the batch's content, never on the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/reduce.h"
#include "miles/backward_kernels.h"
#include "miles/comm.h"
#include "miles/flat_params.h"
#include "miles/grad_sink.h"
#include "miles/kernels.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "model/backward_weights.h"
#include "model/elementwise.h"
#include "model/forward_tape.h"
#include "model/mla.h"
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
    if (!io_.d_hidden.empty()) add_into(dh.data(), io_.d_hidden.data(), t_ * c_.hidden_size, pool_);
    dh_ = dh.data();
    size_grads();
    for (int64_t layer = tape_.layer_end - 1; layer >= tape_.layer_begin; --layer) {
      layer_ = layer;
      const std::vector<Op>& ops = w_.programs[layer].ops;
      for (auto op = ops.rbegin(); op != ops.rend(); ++op) backward(*op);
    }
    if (tape_.embedded) {
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

  // logits = norm(h) · headᵀ over the tape's head rows. Returns d h_final of every token (zero on
  // the rows the head did not run on).
  std::vector<float> head(std::span<const float> dlogits) {
    const int64_t d = c_.hidden_size, v = c_.vocab_size;
    const int64_t r = static_cast<int64_t>(tape_.head_rows.size());
    std::vector<float> dnormed(static_cast<size_t>(r * d));
    gemm(dlogits.data(), r, v, bw_.lm_head_t, dnormed.data(), d, pool_);
    reduce(dnormed.data(), r * d);  // vocabulary-parallel head
    // Tied: the head's gradient lands in io.tied_head_grad when given, else in the embedding's (the
    // embedding's own scatter then adds to it).
    if (!c_.tie_word_embeddings) {
      g_.weight_grad(dlogits.data(), v, tape_.normed.data(), d, r, d, {{"lm_head.weight", v}});
    } else if (!io_.tied_head_grad.empty()) {
      std::vector<const float*> lefts;
      for (const std::span<float>& l : io_.tied_fold) lefts.push_back(l.data());
      const kernels::WeightGradPart part{
          0, v, io_.tied_fold.empty() ? io_.tied_head_grad.data() : io_.tied_fold.back().data(),
          lefts};
      gemm_weight_grad(dlogits.data(), v, tape_.normed.data(), d, r, {&part, 1}, d, pool_);
      tied_stored_ = true;
    } else {
      gemm_weight_grad(dlogits.data(), v, tape_.normed.data(), d, r, v, d,
                       g_.overwrite("model.embed_tokens.weight"), pool_);
    }
    std::vector<float> dsel(static_cast<size_t>(r * d));
    kernels::rmsnorm_backward(tape_.h_final.data(), dnormed.data(), r, d, w_.final_norm.data(),
                              eps(), dsel.data(), g_.accumulate("model.norm.weight"), pool_);
    if (r == t_) return dsel;  // every row (head_rows ascending: 0 .. T - 1)
    std::vector<float> dh(static_cast<size_t>(t_ * d), 0.0f);
    for (int64_t i = 0; i < r; ++i)
      std::copy_n(dsel.data() + i * d, d, dh.data() + tape_.head_rows[i] * d);
    return dh;
  }

  const LayerWeights& l() const { return w_.layers[layer_]; }
  std::string layer_prefix() const { return "model.layers." + std::to_string(layer_) + "."; }
  const LayerTape& lt() const { return tape_.layers[layer_]; }
  int64_t width(Act a) const { return act_width(c_, a); }
  std::vector<std::pair<std::string, int64_t>> parts(Param p) const {
    return param_parts(c_, layer_, p);
  }

  // Gradient storage of a layer's activations (layer_program.h's rules): the stream's and the
  // block output's is d h itself; the others are written whole by the one op that reads them, and
  // those never live at once share a buffer sized for the widest.
  void size_grads() {
    std::array<int64_t, kNumActs> widest{};
    for (int a = 0; a < kNumActs; ++a) {
      int64_t& w = widest[static_cast<int>(grad_home(static_cast<Act>(a)))];
      w = std::max(w, width(static_cast<Act>(a)));
    }
    sized(dxn_, t_ * widest[static_cast<int>(Act::kXn1)]);
    sized(dmid_, t_ * widest[static_cast<int>(Act::kAttn)]);
    sized(dwide_, t_ * widest[static_cast<int>(Act::kQkvRaw)]);
  }
  float* grad(Act a) {
    switch (grad_home(a)) {
      case Act::kH:
        return dh_;
      case Act::kXn1:
        return dxn_.data();
      case Act::kAttn:
        return dmid_.data();
      default:
        return dwide_.data();
    }
  }
  // An activation as the forward kept it.
  const float* kept(Act a) const { return lt()[a].data(); }

  const std::vector<float>& norm_weight(Param p) const {
    switch (p) {
      case Param::kInputNorm:
        return l().input_norm;
      case Param::kAttnOutNorm:
        return l().attn_out_norm;
      case Param::kMlpOutNorm:
        return l().mlp_out_norm;
      default:
        return l().post_norm;
    }
  }
  const kernels::PackedMatrix& transposed(Param p) const {
    const LayerWeightsT& wt = bw_.layers[layer_];
    switch (p) {
      case Param::kQkv:
        return wt.qkv_t;
      case Param::kO:
        return wt.o_t;
      case Param::kGateUp:
        return wt.gate_up_t;
      default:
        return wt.down_t;
    }
  }

  void backward(const Op& op) {
    switch (op.kind) {
      case OpKind::kRmsNorm: {  // the stream: d in += norm_backward(d out); else d in = it
        const int64_t d = width(op.in);
        float* dout = grad(op.out);
        if (op.keep == Act::kCount) {  // a block output's norm (d out is the stream's d h)
          kernels::rmsnorm_backward(kept(op.in), dout, t_, d, norm_weight(op.param).data(), eps(),
                                    grad(op.in), g_.accumulate(parts(op.param)[0].first), pool_);
          return;
        }
        kernels::rmsnorm_backward(kept(op.keep), dout, t_, d, norm_weight(op.param).data(), eps(),
                                  dout, g_.accumulate(parts(op.param)[0].first), pool_);
        add_into(grad(op.in), dout, t_ * d, pool_);
        return;
      }
      case OpKind::kLinear: {  // d in = d out · W; dW = d outᵀ · in
        const int64_t n = width(op.out), k = width(op.in);
        gemm(grad(op.out), t_, n, transposed(op.param), grad(op.in), k, pool_);
        g_.weight_grad(grad(op.out), n, kept(op.in), k, t_, k, parts(op.param));
        return;
      }
      case OpKind::kBias: {  // d b = Σ_rows d out, split into the stacked tensors
        const int64_t n = width(op.out);
        std::vector<float> db(static_cast<size_t>(n), 0.0f);
        column_sums(grad(op.out), t_, n, n, db.data());
        int64_t at = 0;
        for (const auto& [name, rows] : parts(op.param)) {
          std::copy_n(db.data() + at, rows, g_.overwrite(name));
          at += rows;
        }
        return;
      }
      case OpKind::kRope:
        rope(op);
        return;
      case OpKind::kAttention:
        attention(kept(op.in), grad(op.out), grad(op.in));
        return;
      case OpKind::kSwiGlu:
      case OpKind::kGeGlu: {
        const int64_t f = width(op.out);
        const float* gu = kept(op.in);
        const float* dact = grad(op.out);
        float* dgu = grad(op.in);
        const auto kernel =
            op.kind == OpKind::kSwiGlu ? kernels::swiglu_backward : kernels::geglu_backward;
        parallel_ranges(pool_, t_, 16 * f, [&](int64_t r0, int64_t r1) {  // rows are independent
          kernel(gu + r0 * 2 * f, gu + r0 * 2 * f + f, dact + r0 * f, r1 - r0, f, 2 * f,
                 dgu + r0 * 2 * f, dgu + r0 * 2 * f + f, 2 * f);
        });
        return;
      }
      case OpKind::kMoe:
        moe(kept(op.in), grad(op.out), grad(op.in));
        return;
      case OpKind::kMlaQkv:
        mla_qkv_backward(c_, l().mla, bw_.layers[layer_].mla, kept(op.in), grad(op.out), t_,
                         grad(op.in), layer_prefix(), g_, pool_,
                         [this](float* x, int64_t n) { reduce(x, n); });
        return;
      case OpKind::kMlaOut:
        mla_out_backward(c_, bw_.layers[layer_].mla, kept(op.in), grad(op.out), t_, grad(op.in),
                         layer_prefix(), g_, pool_);
        return;
      case OpKind::kResidual:  // d in is d h (grad() gives them one storage)
      case OpKind::kTpExit:
        return;
      case OpKind::kTpEnter:  // the column-parallel input's gradient, summed over the group
        reduce(grad(op.in), t_ * width(op.in));
        return;
    }
  }

  // The MoE block's backward: xn2 its input as kept, dh d out (the stream's gradient), dxn d in,
  // written whole.
  void moe(const float* xn2, const float* dh, float* dxn) {
    const int64_t layer = layer_;
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const MoeTape& mt = lt().moe;
    const LayerWeightsT& wt = bw_.layers[layer];
    const int64_t d = c_.hidden_size, f = c_.moe.moe_intermediate_size, k = c_.moe.top_k;
    const int64_t e = c_.moe.num_experts;
    // out_t = Σ_j w_tj y_tj (+ shared_t): d w_tj = dh_t · y_tj; d y_tj = w_tj dh_t.
    std::vector<float> dw(static_cast<size_t>(t_ * k));
    for (int64_t s = 0; s < t_ * k; ++s)
      dw[s] = kernels::detail::dot(dh + (s / k) * d, mt.y.data() + s * d, d);
    // (the forward summed each expert output over the tensor-parallel group: y and dw are complete)
    std::fill(dxn, dxn + t_ * d, 0.0f);
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
        std::copy_n(xn2 + tok * d, d, xs.data() + r * d);
      }
      const std::vector<float> dxs =
          expert_backward(et, wt.experts[ex], f, xs.data(), dy.data(), n, xp);
      for (int64_t r = 0; r < n; ++r) add_into(dxn + (et.slots[r] / k) * d, dxs.data() + r * d, d);
    }
    if (w_.layers[layer].has_shared) shared_expert(xn2, dh, p + "mlp.shared_experts.", dxn);
    reduce(dxn, t_ * d);
    // Gate weights: w = p[ids] (/ Σ p[ids] when renormalised); router softmax backward.
    std::vector<float> dz(static_cast<size_t>(t_ * e), 0.0f);
    for (int64_t i = 0; i < t_ && c_.moe.score == RouterScore::kSigmoid; ++i)
      sigmoid_router_grad(mt.probs.data() + i * e, mt.ids.data() + i * k, mt.weights.data() + i * k,
                          dw.data() + i * k, dz.data() + i * e);
    for (int64_t i = 0; i < t_ && c_.moe.score == RouterScore::kSoftmax; ++i) {
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
    g_.weight_grad(dz.data(), e, xn2, d, t_, d, {{p + "mlp.gate.weight", e}});
    std::vector<float> dxr(static_cast<size_t>(t_ * d));
    gemm(dz.data(), t_, e, wt.router_t, dxr.data(), d, pool_);
    add_into(dxn, dxr.data(), t_ * d, pool_);
  }

  // GLM-4 MoE's gate weights w_j = scale · s_j (/ (Σ s + 1e-20) when renormalised) of the sigmoid
  // scores s = sigmoid(z) (the bias only chooses): d s_m = (scale · d w_m − Σ_j d w_j w_j) / (Σ s +
  // 1e-20) (or scale · d w_m), d z = d s · s (1 − s); unchosen experts get none.
  void sigmoid_router_grad(const float* s, const int32_t* ids, const float* w, const float* g,
                           float* dz) const {
    const int64_t k = c_.moe.top_k;
    const float scale = static_cast<float>(c_.moe.routed_scaling_factor);
    float sum = 0.0f, gw = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum = sum + s[ids[j]];
    sum = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) gw = std::fma(g[j], w[j], gw);
    for (int64_t j = 0; j < k; ++j) {
      const float ds = c_.moe.norm_topk_prob ? (scale * g[j] - gw) / sum : scale * g[j];
      const float sj = s[ids[j]];
      dz[ids[j]] = ds * (sj * (1.0f - sj));
    }
  }

  // One expert MLP's backward over its n rows (x: their inputs, dy: d of their outputs): its weight
  // gradients (prefix xp), and d x returned [n, d].
  std::vector<float> expert_backward(const ExpertTape& et, const ExpertWeightsT& wt, int64_t f,
                                     const float* x, const float* dy, int64_t n,
                                     const std::string& xp) {
    const int64_t d = c_.hidden_size;
    std::vector<float> dact(static_cast<size_t>(n * f)), dgu(static_cast<size_t>(n * 2 * f));
    gemm(dy, n, d, wt.down_t, dact.data(), f, pool_);
    g_.weight_grad(dy, d, et.act.data(), f, n, f, {{xp + "down_proj.weight", d}});
    kernels::swiglu_backward(et.gate_up.data(), et.gate_up.data() + f, dact.data(), n, f, 2 * f,
                             dgu.data(), dgu.data() + f, 2 * f);
    g_.weight_grad(dgu.data(), 2 * f, x, d, n, d,
                   {{xp + "gate_proj.weight", f}, {xp + "up_proj.weight", f}});
    std::vector<float> dx(static_cast<size_t>(n * d));
    gemm(dgu.data(), n, 2 * f, wt.gate_up_t, dx.data(), d, pool_);
    return dx;
  }

  // The shared expert's backward (its output added with weight 1, every token its row): weight
  // gradients, and its input gradient added into dxn.
  void shared_expert(const float* xn2, const float* dh, const std::string& xp, float* dxn) {
    const int64_t f = c_.moe.n_shared_experts * c_.moe.moe_intermediate_size;
    const std::vector<float> dxs =
        expert_backward(lt().moe.shared, bw_.layers[layer_].shared, f, xn2, dh, t_, xp);
    add_into(dxn, dxs.data(), t_ * c_.hidden_size, pool_);
  }

  // Attention per sequence: d attn in, d qkv (after RoPE) out, every row written by its kv heads.
  void attention(const float* qkv, float* dattn, float* dqkv) {
    const int64_t qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim, ld = qd + 2 * kvd;
    const float scale = c_.attention_scale();
    if (!tape_.earlier.empty()) {
      pass_attention(qkv, dattn, dqkv);
      return add_sent(dqkv);
    }
    // Work items over (sequence, kv head, query block), then (sequence, kv head, run of keys);
    // every sum keeps its (head, query, key) order.
    std::vector<kernels::AttentionSeq> seqs;
    for (size_t s = 0; s < tape_.seqs.size(); ++s) {
      const int64_t off = tape_.offset[s];
      const float* q = qkv + off * ld;
      float* dq = dqkv + off * ld;
      seqs.push_back({q, q + qd, q + qd + kvd, dattn + off * qd, dq, dq + qd, dq + qd + kvd,
                      tape_.seqs[s].n_tokens});
    }
    kernels::attention_backward_batch(seqs, ld, ld, c_.num_heads, c_.num_kv_heads, hd, scale, pool_,
                                      w_.programs[layer_].window);
    add_sent(dqkv);
  }

  // A training-time test pass (ForwardOptions::earlier_passes): each row writes its d q and its own
  // key's d k / d v, and with BackwardIo::earlier_passes adds the d k / d v of the earlier keys it
  // saw into their tapes' sent_dqkv.
  void pass_attention(const float* qkv, const float* dattn, float* dqkv) {
    const int64_t qd = c_.q_dim(), ld = qd + 2 * c_.kv_dim();
    const size_t np = tape_.earlier.size();
    const bool send = !io_.earlier_passes.empty();
    std::vector<const float*> rows(tape_.seqs.size() * np);
    std::vector<float*> drows(send ? rows.size() : 0);
    std::vector<float*> sent(send ? np : 0);
    for (size_t p = 0; p < sent.size(); ++p) {
      std::vector<std::vector<float>>& to = io_.earlier_passes[p]->impl().sent_dqkv;
      to.resize(static_cast<size_t>(c_.num_layers));
      if (to[layer_].empty()) to[layer_].assign(static_cast<size_t>(t_ * ld), 0.0f);
      sent[p] = to[layer_].data();
    }
    std::vector<kernels::PassAttentionSeq> seqs;
    for (size_t s = 0; s < tape_.seqs.size(); ++s) {
      const int64_t off = tape_.offset[s];
      for (size_t p = 0; p < np; ++p) {
        rows[s * np + p] = tape_.earlier[p]->layers[layer_][Act::kQkv].data() + off * ld;
        if (send) drows[s * np + p] = sent[p] + off * ld;
      }
      kernels::PassAttentionSeq q{
          {rows.data() + s * np, np}, qkv + off * ld, tape_.seqs[s].n_tokens};
      q.d_out = dattn + off * qd;
      q.dqkv = dqkv + off * ld;
      if (send) q.d_earlier = {drows.data() + s * np, np};
      seqs.push_back(q);
    }
    kernels::pass_attention_backward(seqs, ld, c_.num_heads, c_.num_kv_heads, c_.head_dim,
                                     c_.attention_scale(), w_.programs[layer_].window, pool_);
  }

  // What later training-time-test passes sent to this pass's keys and values (after its own).
  void add_sent(float* dqkv) {
    if (static_cast<int64_t>(tape_.sent_dqkv.size()) <= layer_ || tape_.sent_dqkv[layer_].empty())
      return;
    const int64_t qd = c_.q_dim(), kvd2 = 2 * c_.kv_dim(), ld = qd + kvd2;
    const float* from = tape_.sent_dqkv[layer_].data();
    parallel_for(pool_, t_,
                 [&](int64_t i) { add_into(dqkv + i * ld + qd, from + i * ld + qd, kvd2); });
  }

  // RoPE per token (disjoint rows, in parallel), then the q/k norms in ascending token order, in
  // place on d qkv (the op's in and out share gradient storage).
  void rope(const Op& op) {
    const int64_t qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim, ld = qd + 2 * kvd;
    float* dqkv = grad(op.out);
    const kernels::RopeTable& table = w_.programs[layer_].local_rope ? w_.rope_local : w_.rope;
    parallel_for(pool_, (t_ + kRopeRows - 1) / kRopeRows, [&](int64_t b) {
      for (int64_t i = b * kRopeRows; i < std::min(t_, (b + 1) * kRopeRows); ++i) {
        float* dq = dqkv + i * ld;
        // dq's heads then dk's, side by side in the row (k at qd = num_heads · hd).
        kernels::rope_backward(dq, 1, c_.num_heads + c_.num_kv_heads, hd, &tape_.positions[i],
                               table);
      }
    });
    if (op.param != Param::kQkNorm) return;
    std::vector<float> dnorm_q(static_cast<size_t>(hd), 0.0f),
        dnorm_k(static_cast<size_t>(hd), 0.0f);
    for (int64_t i = 0; i < t_; ++i) {
      float* dq = dqkv + i * ld;
      const float* raw = kept(op.in) + i * ld;
      kernels::rmsnorm_backward(raw, dq, c_.num_heads, hd, l().q_norm.data(), eps(), dq,
                                dnorm_q.data());
      kernels::rmsnorm_backward(raw + qd, dq + qd, c_.num_kv_heads, hd, l().k_norm.data(), eps(),
                                dq + qd, dnorm_k.data());
    }
    reduce(dnorm_q.data(), hd);  // heads are split; the norm weights are shared
    reduce(dnorm_k.data(), hd);
    const auto names = parts(Param::kQkNorm);
    std::copy(dnorm_q.begin(), dnorm_q.end(), g_.overwrite(names[0].first));
    std::copy(dnorm_k.begin(), dnorm_k.end(), g_.overwrite(names[1].first));
  }

  // h = embed[token] · embed_scale: the rows' gradient is d h · embed_scale (in place: d h is
  // dead); the padding row's lookups add nothing (torch's padding_idx).
  void embedding(std::vector<float>& dh) {
    if (const float s = c_.embed_scale(); s != 1.0f)
      for (float& x : dh) x = x * s;
    const int64_t vb = io_.tp ? io_.tp->vocab_begin : 0, vl = c_.vocab_size;
    std::vector<int64_t> rows(static_cast<size_t>(t_));
    for (int64_t i = 0; i < t_; ++i) {
      const int64_t row = tape_.tokens[i] - vb;  // vocabulary-parallel: this rank's rows only
      rows[i] = row >= 0 && row < vl && tape_.tokens[i] != c_.pad_token_id ? row : -1;
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
  // Per-layer gradients (grad()), sized once and reused by every layer.
  int64_t layer_ = 0;
  float* dh_ = nullptr;
  std::vector<float> dxn_, dmid_, dwide_;
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
  const int64_t want = head ? static_cast<int64_t>(t.head_rows.size()) * config_.vocab_size
                            : n * config_.hidden_size;
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
  if (!io.d_hidden.empty() &&
      (!head || static_cast<int64_t>(io.d_hidden.size()) != n * config_.hidden_size))
    return Status::Error("backward: d_hidden needs a forward through the last layer and " +
                         std::to_string(n) + " × hidden values");
  if (!io.earlier_passes.empty()) {
    bool same = io.earlier_passes.size() == t.earlier.size();
    for (size_t p = 0; same && p < t.earlier.size(); ++p)
      same = io.earlier_passes[p] && &io.earlier_passes[p]->impl() == t.earlier[p];
    if (!same)
      return Status::Error("backward: earlier_passes are not the tapes this pass's forward read");
  }
  Backward b(config_, *w_, backward_weights(pool), t, grads, pool, io);
  b.run(d_output);
  return b.status();
}

}  // namespace miles
