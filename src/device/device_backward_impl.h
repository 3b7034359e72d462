// BackendModel::backward: the gradients of every parameter from the device tape of the last
// forward_train and d loss / d logits, in the phases of the CPU's Model::backward (LM head → final
// norm → per layer MLP then attention → embedding), each kernel the CPU one's operations in its
// order (device_backward_kernels.h), so the gradients carry the CPU trainer's bits.
#pragma once

#include <string>
#include <vector>

#include "device/device_backward_kernels.h"
#include "device/device_forward_impl.h"
#include "device/device_model_impl.h"
#include "miles/flat_params.h"

namespace miles::device {

template <class B>
class BackendBackward {
 public:
  BackendBackward(BackendModel<B>& m, float* grads, const ParamLayout& layout, float* tied_head)
      : m_(m),
        b_(*m.b_),
        c_(m.config_),
        tape_(m.tape_),
        g_(grads),
        layout_(layout),
        tied_head_(tied_head),
        t_(m.tape_.t) {}

  // dh, dxn, dact/dattn, dgu/dqkv, inv: scratch of the largest layer.
  Status run(const float* dlogits, float* scratch, int64_t* ints) {
    const int64_t d = c_.hidden_size, f = c_.intermediate_size;
    const int64_t ld = c_.q_dim() + 2 * c_.kv_dim();
    dh_ = scratch;
    dxn_ = dh_ + t_ * d;
    dmid_ = dxn_ + t_ * d;                          // d act / d attn: t × max(f, q_dim)
    dwide_ = dmid_ + t_ * std::max(f, c_.q_dim());  // d gate_up / d qkv: t × max(2f, ld)
    inv_ = dwide_ + t_ * std::max(2 * f, ld);
    p_ = inv_ + t_ * std::max(c_.num_heads, int64_t{1});
    moe_ = p_ + attention_floats(c_, tape_);
    dmla_a_ = moe_ + moe_floats(c_, t_);
    dattn_v_ = dmla_a_ + (c_.is_mla() ? t_ * act_width(c_, Act::kMlaA) : 0);
    mla_ = dattn_v_ + (c_.is_mla() ? t_ * act_width(c_, Act::kAttnV) : 0);
    dsel_ = mla_ + mla_floats(c_, t_);
    ints_ = ints;
    b_.launch(layout_.total(), ZeroKernel{g_});
    head(dlogits);
    for (int64_t layer = c_.num_layers - 1; layer >= 0; --layer) {
      layer_ = layer;
      const std::vector<Op>& ops = m_.programs_[layer].ops;
      for (auto op = ops.rbegin(); op != ops.rend(); ++op) MILES_RETURN_IF_ERROR(backward(*op));
    }
    if (const float s = c_.embed_scale(); s != 1.0f) b_.launch(t_ * d, ScaleKernel{dh_, s});
    b_.launch(d, EmbedBackwardKernel{tape_.d_tokens, t_, d, dh_, grad("model.embed_tokens.weight"),
                                     c_.pad_token_id});
    return Status::Ok();
  }

  // Floats of scratch run() needs for a tape of t tokens (attention's p and dS included).
  static int64_t scratch_floats(const ModelConfig& c, const DevTape& tape) {
    const int64_t t = tape.t, d = c.hidden_size, f = c.intermediate_size;
    const int64_t ld = c.q_dim() + 2 * c.kv_dim();
    return 2 * t * d + t * std::max(f, c.q_dim()) + t * std::max(2 * f, ld) +
           t * std::max(c.num_heads, int64_t{1}) + attention_floats(c, tape) + moe_floats(c, t) +
           mla_floats(c, t) + tape.rows * d;
  }
  static int64_t attention_floats(const ModelConfig& c, const DevTape& tape) {
    int64_t pds = 0;
    for (const SeqSpan& s : tape.seqs) pds += c.num_heads * s.n_tokens * s.n_tokens;
    return 2 * pds;
  }
  // MLA's: d of the a-projection's output and of o_proj's input, then the q/k/v op's scratch (the
  // recomputed queries and normed q_a, d q, d of the normed q_a, the latent's input and d).
  static int64_t mla_floats(const ModelConfig& c, int64_t t) {
    if (!c.is_mla()) return 0;
    const MlaConfig& m = c.mla;
    const int64_t hq = c.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
    return t * (act_width(c, Act::kMlaA) + act_width(c, Act::kAttnV) + 2 * hq + 3 * m.q_lora_rank +
                2 * m.kv_lora_rank);
  }
  // A MoE layer's: per slot dw, dy, d act, d gate/up, d x; d router logits; the router's d x.
  static int64_t moe_floats(const ModelConfig& c, int64_t t) {
    if (c.num_moe_layers() == 0) return 0;
    const int64_t slots = t * c.moe.top_k, f = c.moe.moe_intermediate_size, d = c.hidden_size;
    const int64_t fs = c.moe.n_shared_experts * f;  // the shared expert's d act, d gate/up, d x
    return slots * (1 + d + f + 2 * f + d) + t * c.moe.num_experts + t * d + t * (3 * fs + d);
  }

 private:
  float* grad(const std::string& name) { return g_ + layout_.at(name).offset; }

  // d x = d y · W through W's transposed pack (BackendModel::make_transposed).
  void gemm_dx(const float* dy, int64_t ldy, const DevMatrix& wt, float* out, int64_t ldo) {
    m_.gemm(dy, t_, ldy, wt, out, ldo);
  }
  // dW [n, k] of y = x Wᵀ over the tape's tokens (or its first m rows of dy and x), rows split
  // into up to three named tensors.
  void weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t n, int64_t k,
                   const std::vector<std::pair<float*, int64_t>>& parts, int64_t m = -1) {
    WeightGradKernel w{dy, ldy, x, ldx, m < 0 ? t_ : m, n, k, kernels::kWeightGradChunk, {}, {}};
    int i = 0;
    int64_t end = 0;
    for (const auto& [dst, rows] : parts) {
      end += rows;
      w.dst[i] = dst;
      w.end[i++] = end;
    }
    for (; i < 3; ++i) w.end[i] = end + 1;
    b_.launch(n * k, w);
  }
  // rmsnorm_backward over `rows` rows: dw accumulated (ascending rows) unless null, dx written.
  void norm_backward(const float* x, const float* dy, Rows rows, int64_t num_rows,
                     const float* weight, float* dx, float* dw, float eps_or_config = -1.0f) {
    const float eps = eps_or_config >= 0.0f ? eps_or_config : static_cast<float>(c_.rms_norm_eps);
    b_.launch(num_rows, RmsInvKernel{x, rows, eps, inv_});
    if (dw) b_.launch(rows.width, RmsWeightGradKernel{x, dy, rows, num_rows, inv_, dw});
    b_.launch(num_rows, RmsDxKernel{x, dy, rows, weight, inv_, dx});
  }

  // The LM head over the tape's head rows (every token, or the logit_rows), as the CPU's: d h of
  // the rows it did not run on is zero.
  void head(const float* dlogits) {
    const int64_t d = c_.hidden_size, v = c_.vocab_size, r = tape_.rows;
    m_.gemm(dlogits, r, v, m_.lm_head_t_, dxn_, d);
    float* head_grad = !c_.tie_word_embeddings ? grad("lm_head.weight")
                       : tied_head_            ? tied_head_
                                               : grad("model.embed_tokens.weight");
    weight_grad(dlogits, v, tape_.normed, d, v, d, {{head_grad, v}}, r);
    const bool every = r == t_;  // head rows ascending: 0 .. T - 1
    norm_backward(tape_.h_final, dxn_, Rows{d, 1, d}, r, m_.final_norm_, every ? dh_ : dsel_,
                  grad("model.norm.weight"));
    if (every) return;
    b_.launch(t_ * d, ZeroKernel{dh_});
    b_.launch(r * d, ScatterRowsKernel{dsel_, tape_.d_rows, d, dh_});
  }

  // Gradient storage of a layer's activations, as the CPU's Backward::grad.
  float* dact(Act a) const {
    switch (grad_home(a)) {
      case Act::kH:
        return dh_;
      case Act::kXn1:
        return dxn_;
      case Act::kAttn:
        return dmid_;
      case Act::kMlaA:
        return dmla_a_;
      case Act::kAttnV:
        return dattn_v_;
      default:
        return dwide_;
    }
  }
  const float* kept(Act a) const { return tape_.layers[layer_][a]; }
  std::vector<std::pair<std::string, int64_t>> parts(Param p) const {
    return param_parts(c_, layer_, p);
  }
  int64_t width(Act a) const { return act_width(c_, a); }

  // One op's backward (layer_program.h's rules), each the CPU op's operations in its order.
  Status backward(const Op& op) {
    const DevLayer& w = m_.layers_[layer_];
    switch (op.kind) {
      case OpKind::kRmsNorm: {  // the stream: d in += norm_backward(d out); else d in = it
        const int64_t d = width(op.in);
        const float* weight = BackendModel<B>::norm_of(w, op.param);
        if (op.keep == Act::kCount) {  // a block output's norm (d out is the stream's d h)
          norm_backward(kept(op.in), dact(op.out), Rows{d, 1, d}, t_, weight, dact(op.in),
                        grad(parts(op.param)[0].first));
          return Status::Ok();
        }
        norm_backward(kept(op.keep), dact(op.out), Rows{d, 1, d}, t_, weight, dact(op.out),
                      grad(parts(op.param)[0].first));
        b_.launch(t_ * d, AddKernel{dact(op.in), dact(op.out)});
        return Status::Ok();
      }
      case OpKind::kLinear: {  // d in = d out · W; dW = d outᵀ · in
        const int64_t n = width(op.out), k = width(op.in);
        gemm_dx(dact(op.out), n, BackendModel<B>::transposed(w, op.param), dact(op.in), k);
        std::vector<std::pair<float*, int64_t>> dst;
        for (const auto& [name, rows] : parts(op.param)) dst.emplace_back(grad(name), rows);
        weight_grad(dact(op.out), n, kept(op.in), k, n, k, dst);
        return Status::Ok();
      }
      case OpKind::kBias: {  // d b = Σ_rows d out, per stacked tensor
        const int64_t n = width(op.out);
        int64_t at = 0;
        for (const auto& [name, rows] : parts(op.param)) {
          b_.launch(rows, ColumnSumKernel{dact(op.out) + at, t_, n, grad(name)});
          at += rows;
        }
        return Status::Ok();
      }
      case OpKind::kRope:
        rope(op);
        return Status::Ok();
      case OpKind::kAttention:
        attention_core(kept(op.in), dact(op.out), dact(op.in));
        return Status::Ok();
      case OpKind::kSwiGlu: {
        const int64_t f = width(op.out);
        b_.launch(t_ * f, SwigluBackwardKernel{kept(op.in), dact(op.out), f, dact(op.in)});
        return Status::Ok();
      }
      case OpKind::kGeGlu: {
        const int64_t f = width(op.out);
        b_.launch(t_ * f, GegluBackwardKernel{kept(op.in), dact(op.out), f, dact(op.in)});
        return Status::Ok();
      }
      case OpKind::kMoe:
        return moe(kept(op.in), dact(op.out), dact(op.in));
      case OpKind::kResidual:  // d in is d h (one storage)
      case OpKind::kTpEnter:   // one rank holds the whole model (device_supports)
      case OpKind::kTpExit:
        return Status::Ok();
      case OpKind::kMlaQkv:
        mla_qkv(kept(op.in), dact(op.out), dact(op.in));
        return Status::Ok();
      case OpKind::kMlaOut:
        mla_out(kept(op.in), dact(op.out), dact(op.in));
        return Status::Ok();
    }
    return Status::Ok();
  }

  // RoPE's inverse rotation, then the q/k norms' backward, in place on d qkv.
  void rope(const Op& op) {
    const DevLayer& w = m_.layers_[layer_];
    const int64_t qd = c_.q_dim(), ld = width(op.out), hd = c_.head_dim;
    const int64_t heads = c_.num_heads, kvh = c_.num_kv_heads, half = m_.rope_.rotary_dim / 2;
    float* dqkv = dact(op.out);
    const bool local = m_.programs_[layer_].local_rope;
    b_.launch(t_ * (heads + kvh),
              QkNormRopeKernel{dqkv, ld, heads, kvh, hd, half, nullptr, nullptr, 0.0f,
                               local ? tape_.d_cos_local : tape_.d_cos,
                               local ? tape_.d_neg_sin_local : tape_.d_neg_sin});
    if (op.param != Param::kQkNorm) return;
    const auto names = parts(Param::kQkNorm);
    const float* raw = kept(op.in);
    norm_backward(raw, dqkv, Rows{ld, heads, hd}, t_ * heads, w.q_norm, dqkv, grad(names[0].first));
    norm_backward(raw + qd, dqkv + qd, Rows{ld, kvh, hd}, t_ * kvh, w.k_norm, dqkv + qd,
                  grad(names[1].first));
  }

  // moe_block's backward (model_backward.cc's moe): the gates, every routed slot's expert MLP
  // (per-slot GEMMs through the transposed packs), the slots' d x summed per token in ascending
  // expert id, each expert's weight gradients over its slots in ascending order, the router. xn2:
  // its input as kept; dh: d out (the stream's); dxn: d in, written whole.
  Status moe(const float* xn2, const float* dh, float* dxn) {
    const int64_t layer = layer_;
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const DevTapeLayer& lt = tape_.layers[layer];
    const DevLayer& w = m_.layers_[layer];
    const int64_t d = c_.hidden_size, f = c_.moe.moe_intermediate_size, k = c_.moe.top_k;
    const int64_t e = c_.moe.num_experts, slots = t_ * k;
    float* dw = moe_;
    float* dy = dw + slots;
    float* dact = dy + slots * d;
    float* dgu = dact + slots * f;
    float* dxs = dgu + slots * 2 * f;
    float* dz = dxs + slots * d;
    float* dxr = dz + t_ * e;
    b_.launch(slots, MoeGateGradKernel{dh, lt.moe_y, k, d, dw});
    b_.launch(slots * d, MoeDyKernel{dh, lt.moe_weights, k, d, dy});
    const DevMatrix& dt = w.expert_down_t;
    const DevMatrix& gt = w.expert_gate_up_t;
    b_.launch(GemmKernel::items(slots, dt.n),
              ExpertGemmKernel{dy, d, 1, lt.moe_ids, dt.data, BackendModel<B>::expert_floats(dt),
                               slots, dt.n, dt.k, dt.chunk, dact, f});
    b_.launch(slots * f, SwigluBackwardKernel{lt.moe_gate_up, dact, f, dgu});
    b_.launch(
        GemmKernel::items(slots, gt.n),
        ExpertGemmKernel{dgu, 2 * f, 1, lt.moe_ids, gt.data, BackendModel<B>::expert_floats(gt),
                         slots, gt.n, gt.k, gt.chunk, dxs, d});
    b_.launch(t_ * d, MoeCombineKernel{dxs, lt.moe_ids, nullptr, k, d, dxn});
    // Each expert's slots, ascending (the rows the CPU gathers for it).
    std::vector<int32_t> ids(static_cast<size_t>(slots));
    MILES_RETURN_IF_ERROR(b_.download(ids.data(), lt.moe_ids, sizeof(int32_t) * ids.size()));
    std::vector<int32_t> lists;
    std::vector<int64_t> first(static_cast<size_t>(e + 1), 0);
    for (int64_t ex = 0; ex < e; ++ex) {
      first[ex] = static_cast<int64_t>(lists.size());
      for (int64_t s = 0; s < slots; ++s)
        if (ids[s] == ex) lists.push_back(static_cast<int32_t>(s));
    }
    first[e] = static_cast<int64_t>(lists.size());
    MILES_ASSIGN_OR_RETURN(int32_t * dl, m_.scratch(m_.slot_lists_, std::max<int64_t>(slots, 1)));
    MILES_RETURN_IF_ERROR(b_.upload(dl, lists.data(), sizeof(int32_t) * lists.size()));
    for (int64_t ex = 0; ex < e; ++ex) {
      const int64_t n = first[ex + 1] - first[ex];
      if (n == 0) continue;  // its gradients stay zero
      const std::string xp = p + "mlp.experts." + std::to_string(ex) + ".";
      const int32_t* rows = dl + first[ex];
      WeightGradKernel down{dy,
                            d,
                            lt.moe_act,
                            f,
                            n,
                            d,
                            f,
                            kernels::kWeightGradChunk,
                            {grad(xp + "down_proj.weight"), nullptr, nullptr},
                            {d, d + 1, d + 1},
                            rows,
                            1,
                            1};
      b_.launch(d * f, down);
      WeightGradKernel gu{dgu,
                          2 * f,
                          xn2,
                          d,
                          n,
                          2 * f,
                          d,
                          kernels::kWeightGradChunk,
                          {grad(xp + "gate_proj.weight"), grad(xp + "up_proj.weight"), nullptr},
                          {f, 2 * f, 2 * f + 1},
                          rows,
                          1,
                          k};
      b_.launch(2 * f * d, gu);
    }
    if (w.shared) shared_expert(xn2, dh, p + "mlp.shared_experts.", dxr + t_ * d, dxn);
    RouterBackwardKernel router{lt.probs, lt.moe_ids, lt.moe_weights,        dw,
                                e,        k,          c_.moe.norm_topk_prob, dz};
    router.sigmoid = c_.moe.score == RouterScore::kSigmoid;
    router.scale = static_cast<float>(c_.moe.routed_scaling_factor);
    b_.launch(t_, router);
    weight_grad(dz, e, xn2, d, e, d, {{grad(p + "mlp.gate.weight"), e}});
    gemm_dx(dz, e, w.router_t, dxr, d);
    b_.launch(t_ * d, AddKernel{dxn, dxr});
    return Status::Ok();
  }

  // mla.cc's mla_out_backward: d of each head's latent output (its rotary part 0) and W_vb's rows
  // of kv_b_proj's gradient.
  void mla_out(const float* attn, const float* dout, float* dattn) {
    const DevLayer& w = m_.layers_[layer_];
    const MlaDims d(c_);
    const int64_t h = d.h, r = d.r, kl = d.kl, v = d.v, hd = d.hd, nope = d.nope;
    float* kvb = grad("model.layers." + std::to_string(layer_) + ".self_attn.kv_b_proj.weight");
    b_.launch(t_ * h * r, ZeroColumnsKernel{dattn, h * hd, hd, r});
    for (int64_t x = 0; x < h; ++x) {
      gemm_dx(dout + x * v, h * v, w.vb_t[x], dattn + x * hd + r, h * hd);
      weight_grad(dout + x * v, h * v, attn + x * hd + r, h * hd, v, kl,
                  {{kvb + (x * (nope + v) + nope) * kl, v}});
    }
  }

  // mla.cc's mla_qkv_backward (one rank: nothing to sum): the queries recomputed, d q (its rotary
  // parts back in place, its nope parts through W_kb), W_kb's rows of kv_b_proj's gradient, the
  // latent's d through kv_a_layernorm, d k_pe in place, then q_b_proj and q_a_layernorm.
  void mla_qkv(const float* a, const float* dqkv, float* da) {
    const DevLayer& w = m_.layers_[layer_];
    const MlaDims d(c_);
    const int64_t h = d.h, nope = d.nope, r = d.r, kl = d.kl, ql = d.ql, v = d.v, qk = d.qk;
    const int64_t hd = d.hd, ld = d.ld, kv_at = d.kv_at, wa = d.wa;
    const bool interleave = c_.mla.rope_interleave;
    const std::string at = "model.layers." + std::to_string(layer_) + ".self_attn.";
    constexpr float eps = kMlaNormEps;
    float* q = mla_;
    float* dq = q + t_ * h * qk;
    float* qan = dq + t_ * h * qk;
    float* dn = qan + t_ * ql;
    float* xa = dn + t_ * ql;
    float* xc = xa + t_ * ql;
    float* dc = xc + t_ * kl;
    const float* qs = a;
    int64_t qld = wa;
    if (ql > 0) {
      b_.launch(t_, RmsnormKernel{a, wa, w.q_a_norm, ql, eps, qan, ql});
      m_.gemm(qan, t_, ql, w.q_b, q, h * qk);
      qs = q;
      qld = h * qk;
    }
    b_.launch(t_ * h * r, MlaRopeGradKernel{dqkv, ld, hd, h, nope, r, interleave, dq});
    for (int64_t x = 0; x < h; ++x) {
      gemm_dx(dqkv + x * hd + r, ld, w.kb[x], dq + x * qk, h * qk);
      weight_grad(qs + x * qk, qld, dqkv + x * hd + r, ld, nope, kl,
                  {{grad(at + "kv_b_proj.weight") + x * (nope + v) * kl, nope}});
    }
    b_.launch(t_ * (kl + r),
              MlaLatentGradKernel{dqkv + h * hd, ld, r, kl, interleave, dc, da + kv_at + kl, wa});
    b_.launch(t_ * kl, StridedCopyKernel{a + kv_at, wa, xc, kl, kl});
    norm_backward(xc, dc, Rows{kl, 1, kl}, t_, w.kv_a_norm, dc, grad(at + "kv_a_layernorm.weight"),
                  eps);
    b_.launch(t_ * kl, StridedCopyKernel{dc, kl, da + kv_at, wa, kl});
    if (ql == 0) {
      b_.launch(t_ * h * qk, StridedCopyKernel{dq, h * qk, da, wa, h * qk});
      return;
    }
    weight_grad(dq, h * qk, qan, ql, h * qk, ql, {{grad(at + "q_b_proj.weight"), h * qk}});
    gemm_dx(dq, h * qk, w.q_b_t, dn, ql);
    b_.launch(t_ * ql, StridedCopyKernel{a, wa, xa, ql, ql});
    norm_backward(xa, dn, Rows{ql, 1, ql}, t_, w.q_a_norm, dn, grad(at + "q_a_layernorm.weight"),
                  eps);
    b_.launch(t_ * ql, StridedCopyKernel{dn, ql, da, wa, ql});
  }

  // model_backward.cc's shared_expert: its weight gradients, its d x added into dxn. scratch: t ×
  // (3 fs + d) floats.
  void shared_expert(const float* xn2, const float* dh, const std::string& xp, float* scratch,
                     float* dxn) {
    const DevTapeLayer& lt = tape_.layers[layer_];
    const DevLayer& w = m_.layers_[layer_];
    const int64_t d = c_.hidden_size, fs = c_.moe.n_shared_experts * c_.moe.moe_intermediate_size;
    float* dact = scratch;
    float* dgu = dact + t_ * fs;
    float* dx = dgu + t_ * 2 * fs;
    gemm_dx(dh, d, w.shared_down_t, dact, fs);
    weight_grad(dh, d, lt.shared_act, fs, d, fs, {{grad(xp + "down_proj.weight"), d}});
    b_.launch(t_ * fs, SwigluBackwardKernel{lt.shared_gate_up, dact, fs, dgu});
    weight_grad(dgu, 2 * fs, xn2, d, 2 * fs, d,
                {{grad(xp + "gate_proj.weight"), fs}, {grad(xp + "up_proj.weight"), fs}});
    gemm_dx(dgu, 2 * fs, w.shared_gate_up_t, dx, d);
    b_.launch(t_ * d, AddKernel{dxn, dx});
  }

  // Per sequence: P and dS rows with dq (phase 1), then dk and dv (phase 2).
  void attention_core(const float* qkv, const float* dattn, float* dqkv) {
    const int64_t qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim;
    const int64_t ld = qd + 2 * kvd, heads = c_.num_heads, kvh = c_.num_kv_heads;
    const int64_t ns = static_cast<int64_t>(tape_.seqs.size());
    int64_t* first = ints_;
    int64_t* len = first + ns;
    int64_t* item1 = len + ns;
    int64_t* item2 = item1 + ns;
    int64_t* pbase = item2 + ns;
    const int64_t items1 = ints_host_[5 * ns], items2 = ints_host_[5 * ns + 1];
    const float scale = c_.attention_scale();
    float* ds = p_ + ints_host_[5 * ns + 2];  // after every sequence's p
    const int64_t window = m_.programs_[layer_].window;
    b_.launch(items1, AttnBackwardRowsKernel{qkv, ld, qd, kvd, heads, kvh, hd, dattn, scale, window,
                                             ns, first, len, item1, pbase, p_, ds, dqkv});
    b_.launch(items2, AttnBackwardKvKernel{qkv, ld, qd, kvd, heads, kvh, hd, dattn, ns, first, len,
                                           item2, pbase, p_, ds, dqkv});
  }

 public:
  // The sequences' tables for attention_core, made once per backward (host copy kept).
  std::vector<int64_t> attention_tables() {
    const int64_t ns = static_cast<int64_t>(tape_.seqs.size());
    std::vector<int64_t> v(static_cast<size_t>(5 * ns + 3));
    int64_t items1 = 0, items2 = 0, pds = 0;
    for (int64_t s = 0; s < ns; ++s) {
      const int64_t n = tape_.seqs[s].n_tokens;
      v[s] = tape_.offset[s];
      v[ns + s] = n;
      v[2 * ns + s] = items1;
      v[3 * ns + s] = items2;
      v[4 * ns + s] = pds;
      items1 += c_.num_heads * n;
      items2 += c_.num_kv_heads * n * c_.head_dim;
      pds += c_.num_heads * n * n;
    }
    v[5 * ns] = items1;
    v[5 * ns + 1] = items2;
    v[5 * ns + 2] = pds;
    ints_host_ = v;
    return v;
  }

 private:
  BackendModel<B>& m_;
  B& b_;
  const ModelConfig& c_;
  const DevTape& tape_;
  float* g_;
  const ParamLayout& layout_;
  float* tied_head_;
  const int64_t t_;
  float *dh_ = nullptr, *dxn_ = nullptr, *dmid_ = nullptr, *dwide_ = nullptr, *inv_ = nullptr;
  float* p_ = nullptr;
  float* moe_ = nullptr;
  float *mla_ = nullptr, *dmla_a_ = nullptr, *dattn_v_ = nullptr;  // MLA's scratch and gradients
  float* dsel_ = nullptr;  // d h_final of the LM head's rows, when they are not every token's
  int64_t layer_ = 0;
  int64_t* ints_ = nullptr;
  std::vector<int64_t> ints_host_;
};

template <class B>
Status BackendModel<B>::backward(std::span<const float> dlogits, FlatTensors& grads,
                                 std::span<float> tied_head_grad) {
  const ModelConfig& c = config_;
  const int64_t t = tape_.t;
  if (t == 0 || tape_.layers.empty())
    return Status::Error("device backward needs the tape of a forward_train(keep_tape = true)");
  const int64_t rows = tape_.rows;  // the LM head's rows of the forward
  if (static_cast<int64_t>(dlogits.size()) != rows * c.vocab_size)
    return Status::Error("device backward: d logits has " + std::to_string(dlogits.size()) +
                         " values, expected " + std::to_string(rows * c.vocab_size));
  if (grads.layout().total() != ParamLayout::for_model(c)->total())
    return Status::Error("device backward: the gradient buffer's layout does not match the model");
  if (!tied_head_grad.empty() &&
      (!c.tie_word_embeddings ||
       static_cast<int64_t>(tied_head_grad.size()) != c.vocab_size * c.hidden_size))
    return Status::Error("device backward: tied_head_grad needs a tied model and vocab × hidden");
  const int64_t total = grads.layout().total();
  MILES_ASSIGN_OR_RETURN(float* g, scratch(grads_, total));
  float* tied = nullptr;
  if (!tied_head_grad.empty()) {
    MILES_ASSIGN_OR_RETURN(tied, scratch(tied_, c.vocab_size * c.hidden_size));
  }
  MILES_RETURN_IF_ERROR(make_transposed());
  BackendBackward<B> bw(*this, g, grads.layout(), tied);
  const std::vector<int64_t> tables = bw.attention_tables();
  MILES_ASSIGN_OR_RETURN(int64_t * di, scratch(bwd_ints_, static_cast<int64_t>(tables.size())));
  MILES_RETURN_IF_ERROR(b_->upload(di, tables.data(), sizeof(int64_t) * tables.size()));
  // d logits and the backward's scratch in one buffer.
  const int64_t need = rows * c.vocab_size + BackendBackward<B>::scratch_floats(c, tape_);
  MILES_ASSIGN_OR_RETURN(float* buf, scratch(bwd_, need));
  MILES_RETURN_IF_ERROR(b_->upload(buf, dlogits.data(), sizeof(float) * dlogits.size()));
  MILES_RETURN_IF_ERROR(bw.run(buf, buf + rows * c.vocab_size, di));
  MILES_RETURN_IF_ERROR(b_->download(grads.all().data(), g, sizeof(float) * total));
  if (tied)
    MILES_RETURN_IF_ERROR(
        b_->download(tied_head_grad.data(), tied, sizeof(float) * tied_head_grad.size()));
  return b_->sync();
}

}  // namespace miles::device
