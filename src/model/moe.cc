// Qwen3-MoE block. Routing is per token (a pure function of the token's row), experts run as GEMMs
// over the rows routed to them (batch-invariant kernels), and each token's expert outputs are
// summed in ascending expert id — so a token's result does not depend on which other tokens share
// its experts.
#include "model/moe.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "miles/comm.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"
#include "model/forward_tape.h"

namespace miles {

namespace {

struct Routing {
  std::vector<int32_t> ids;    // [T, k]
  std::vector<float> weights;  // [T, k]
  std::vector<float> probs;    // [T, experts] router softmax
};

Routing route(const ModelConfig& c, const LayerWeights& l, const float* x, int64_t t,
              std::span<const int32_t> forced, int64_t forced_stride, ThreadPool* pool) {
  const int64_t e = c.moe.num_experts, k = c.moe.top_k;
  std::vector<float> probs(static_cast<size_t>(t * e));
  kernels::gemm(x, t, c.hidden_size, l.router, probs.data(), e, pool);
  Routing r{std::vector<int32_t>(t * k), std::vector<float>(t * k), {}};
  for (int64_t i = 0; i < t; ++i) {
    float* p = probs.data() + i * e;
    kernels::softmax_row(p, e);
    int32_t* ids = r.ids.data() + i * k;
    float* w = r.weights.data() + i * k;
    if (!forced.empty()) {
      for (int64_t j = 0; j < k; ++j) {
        ids[j] = forced[i * forced_stride + j];
        w[j] = p[ids[j]];
      }
    } else {
      kernels::topk(p, e, k, ids, w);
    }
    if (c.moe.norm_topk_prob) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum = sum + w[j];
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / sum;
    }
  }
  r.probs = std::move(probs);
  return r;
}

// Runs expert `ex` on the given rows of x; results into y_rows[slot] ([T * k, hidden]).
void run_expert(const ModelConfig& c, const ExpertWeights& ex, const float* x,
                const std::vector<int64_t>& slots, int64_t k, float* y_slots, ExpertTape* tape,
                ThreadPool* pool) {
  const int64_t d = c.hidden_size, f = c.moe.moe_intermediate_size, n = slots.size();
  std::vector<float> xs(n * d), gu(n * 2 * f), act(n * f), ys(n * d);
  for (int64_t r = 0; r < n; ++r) std::copy_n(x + (slots[r] / k) * d, d, xs.data() + r * d);
  kernels::gemm(xs.data(), n, d, ex.gate_up, gu.data(), 2 * f, pool);
  kernels::swiglu(gu.data(), gu.data() + f, n, f, 2 * f, act.data());
  if (tape) {
    tape->slots = slots;
    tape->gate_up = gu;
    tape->act = act;
  }
  kernels::gemm(act.data(), n, f, ex.down, ys.data(), d, pool);
  for (int64_t r = 0; r < n; ++r) std::copy_n(ys.data() + r * d, d, y_slots + slots[r] * d);
}

}  // namespace

Status moe_block(const ModelConfig& c, const LayerWeights& l, const float* x, int64_t t,
                 std::span<const int32_t> forced, int64_t forced_stride, float* out,
                 int32_t* ids_out, float* weights_out, int64_t out_stride, MoeTape* tape,
                 const TensorParallel* tp, ThreadPool* pool) {
  const int64_t e = c.moe.num_experts, k = c.moe.top_k, d = c.hidden_size;
  const Routing r = route(c, l, x, t, forced, forced_stride, pool);
  // slots of each expert: slot = token * k + j.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(e));
  for (int64_t s = 0; s < t * k; ++s) by_expert[r.ids[s]].push_back(s);
  std::vector<float> y(static_cast<size_t>(t * k * d));
  if (tape) tape->experts.assign(static_cast<size_t>(e), ExpertTape{});
  for (int64_t ex = 0; ex < e; ++ex)
    if (!by_expert[ex].empty())
      run_expert(c, l.experts[ex], x, by_expert[ex], k, y.data(),
                 tape ? &tape->experts[ex] : nullptr, pool);
  if (tp && tp->comm && tp->comm->size() > 1)
    MILES_RETURN_IF_ERROR(tp->comm->all_reduce_sum_deterministic(std::span<float>(y)));
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int64_t> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return r.ids[i * k + a] < r.ids[i * k + b]; });
    float* o = out + i * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t j : order) {
      const float w = r.weights[i * k + j];
      const float* yj = y.data() + (i * k + j) * d;
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = o[dd] + yj[dd] * w;
    }
    if (ids_out) std::copy_n(r.ids.data() + i * k, k, ids_out + i * out_stride);
    if (weights_out) std::copy_n(r.weights.data() + i * k, k, weights_out + i * out_stride);
  }
  if (tape) {
    tape->probs = r.probs;
    tape->ids = r.ids;
    tape->weights = r.weights;
    tape->y = std::move(y);
  }
  return Status::Ok();
}

}  // namespace miles
