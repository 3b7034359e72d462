// Backward of the shared model's kernels (kernels.h), for the trainer.
//
// Why: the learner needs d loss / d input and d loss / d weight of every forward kernel. Each
// function here is the exact derivative of its forward in float32, reduced in a fixed order
// (ascending rows, ascending positions), so gradients are deterministic whatever the thread count.
// They are checked against torch autograd (tests/model_grad_test.cc).
#pragma once

#include <cstdint>
#include <span>

#include "miles/kernels.h"

namespace miles::kernels {

// y = rmsnorm(x) * w (rows of d). dx[M, D] = d y / d x · dy; dw[D] += Σ_rows dy * x̂ (ascending
// rows). dx may alias dy. Rows run across the pool; dw keeps its ascending-row order.
void rmsnorm_backward(const float* x, const float* dy, int64_t m, int64_t d, const float* weight,
                      float eps, float* dx, float* dw, ThreadPool* pool = nullptr);

// Inverse rotation of rope_apply: d x = Rᵀ d y, in place on dx[T, H, head_dim].
void rope_backward(float* dx, int64_t t, int64_t heads, int64_t head_dim, const int32_t* positions,
                   const RopeTable& table);

// a = silu(g) * u. d_gate / d_up rows with stride ld_out (written), da rows of f.
void swiglu_backward(const float* gate, const float* up, const float* da, int64_t m, int64_t f,
                     int64_t ld_in, float* d_gate, float* d_up, int64_t ld_out);

// a = gelu_tanh(g) * u, the same layout as swiglu_backward.
void geglu_backward(const float* gate, const float* up, const float* da, int64_t m, int64_t f,
                    int64_t ld_in, float* d_gate, float* d_up, int64_t ld_out);

// Causal self-attention of one sequence from position 0: q[T, H, hd], k/v[T, KVH, hd] (rows with
// strides ldq, ldkv), out = softmax(q kᵀ · scale) v, each query seeing keys 0..i (or with a sliding
// window > 0, i − window + 1 .. i). Given d_out[T, H, hd], writes dq (stride ldq) and dk, dv
// (stride ldkv), overwriting them. Probabilities are recomputed (two-pass softmax).
void attention_backward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldkv,
                        const float* d_out, int64_t t, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, float scale, float* dq, float* dk, float* dv,
                        int64_t window = 0);
// One sequence of a packed batch for attention_backward_batch: its rows of q, k, v (strides ldq,
// ldkv) and d_out ([t, H, hd]), and where its dq, dk, dv rows go.
struct AttentionSeq {
  const float *q, *k, *v, *d_out;
  float *dq, *dk, *dv;
  int64_t t;
};
// attention_backward for every sequence, spread over the pool: work items are (sequence, kv head,
// block of queries) for the scores and dq, then (sequence, kv head, run of keys) for dk / dv, so a
// few kv heads still fill many threads. Bit-identical to attention_backward per sequence: every
// dq row is one query's, and every dk / dv row sums its query blocks in ascending order.
void attention_backward_batch(std::span<const AttentionSeq> seqs, int64_t ldq, int64_t ldkv,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
                              ThreadPool* pool, int64_t window = 0);

// Attention of pass p of a draft head's training-time test (draft_head.h; ForwardOptions::
// earlier_passes) over sequences whose rows are the same in every pass: qkv rows [q (heads · hd) |
// k | v (kv_heads · hd each)] with stride ld in every pass. Query row i of pass p sees, in position
// order, pass 1's keys 0 .. i − p + 1, pass q's key i − p + q for 1 < q < p, and its own (with a
// sliding window > 0: only positions > i − window), which is what a draft p tokens ahead sees in
// the engine's draft KV.
struct PassAttentionSeq {
  std::span<const float* const> earlier;  // p − 1 passes' qkv rows of this sequence, oldest first
  const float* qkv;                       // this pass's rows
  int64_t t;
  float* out = nullptr;          // forward: [t, heads · hd], written
  const float* d_out = nullptr;  // backward: [t, heads · hd]
  float* dqkv =
      nullptr;  // backward (stride ld): every row's d q and its own key's d k, d v, written
  // backward: the earlier passes' d qkv rows (stride ld, same order as `earlier`): the d k, d v of
  // every earlier key a row saw are added there. Empty: the earlier keys are constants. Given for
  // every sequence of a call or for none.
  std::span<float* const> d_earlier = {};
};
// Scores are the contract's dot (kernels::detail::dot), the softmax two-pass with exp_f32, out =
// Σ_j p_j v_j in position order; every row is one work item, so the bits do not depend on threads.
void pass_attention(std::span<const PassAttentionSeq> seqs, int64_t ld, int64_t heads,
                    int64_t kv_heads, int64_t head_dim, float scale, int64_t window,
                    ThreadPool* pool);
// Its backward: ds_j = p_j (d_out · v_j − Σ p d_out · v) · scale; dq = Σ_j ds_j k_j (position
// order); the own key's dk = Σ_h ds_own q_h and dv = Σ_h p_own d_out_h over the kv head's query
// heads in ascending order. With d_earlier, an earlier key's dk += ds q_h and dv += p d_out_h
// over the query rows ascending, then the heads ascending (one work item per sequence and kv head
// then, so the sums' order does not depend on threads).
void pass_attention_backward(std::span<const PassAttentionSeq> seqs, int64_t ld, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, float scale, int64_t window,
                             ThreadPool* pool);

// dW[N, K] = dYᵀ · X summed over the M rows with the GEMM's chunk-and-tree rule over rows, in
// chunks of kWeightGradChunk rows:
// dy[M, N] (stride ldy), x[M, K] (stride ldx), dw[N, K] overwritten.
void gemm_weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m,
                      int64_t n, int64_t k, float* dw, ThreadPool* pool);
// Rows [row0, row0 + rows) of a stacked dW (fused q/k/v, gate/up) and where they go: dw [rows, K],
// folded into `lefts` as gemm_xt defines.
struct WeightGradPart {
  int64_t row0 = 0, rows = 0;
  float* dw = nullptr;
  GemmLefts lefts;
};
// gemm_weight_grad by parts, Xᵀ packed once for all of them: each part's rows get the bits the
// whole product gives them.
void gemm_weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m,
                      std::span<const WeightGradPart> parts, int64_t k, ThreadPool* pool);

}  // namespace miles::kernels
