// The MoE block: Qwen3-MoE's softmax routing or GLM-4 MoE's grouped sigmoid routing, routed
// experts, and GLM-4 MoE's shared expert. Routing is per token (a pure function of the token's
// row), experts run as GEMMs over the rows routed to them (batch-invariant kernels), and each
// token's expert outputs are summed in ascending expert id — so a token's result does not depend on
// which other tokens share its experts.
#include "model/moe.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/exp.h"
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

// GLM-4 MoE's routing of one token (MoeConfig): p holds the router logits and gets the sigmoid
// scores; the experts are chosen by the biased scores among the topk_group best groups (a group's
// score: the sum of its two best biased scores), unless replayed.
void route_sigmoid(const MoeConfig& m, const float* bias, float* p, const int32_t* forced,
                   int32_t* ids, float* w) {
  const int64_t e = m.num_experts, k = m.top_k, per = e / m.n_group;
  for (int64_t x = 0; x < e; ++x) p[x] = 1.0f / (1.0f + kernels::detail::exp_f32(-p[x]));
  if (forced) {
    std::copy_n(forced, k, ids);
  } else {
    std::vector<float> choice(static_cast<size_t>(e)), group(static_cast<size_t>(m.n_group));
    for (int64_t x = 0; x < e; ++x) choice[x] = p[x] + bias[x];
    int32_t best[2];
    float top[2];
    for (int64_t g = 0; g < m.n_group; ++g) {
      kernels::topk(choice.data() + g * per, per, 2, best, top);
      group[g] = top[0] + top[1];
    }
    std::vector<int32_t> kept(static_cast<size_t>(m.topk_group));
    kernels::topk(group.data(), m.n_group, m.topk_group, kept.data(), nullptr);
    std::vector<float> masked(static_cast<size_t>(e), -std::numeric_limits<float>::infinity());
    for (int32_t g : kept) std::copy_n(choice.data() + g * per, per, masked.data() + g * per);
    kernels::topk(masked.data(), e, k, ids, nullptr);
  }
  for (int64_t j = 0; j < k; ++j) w[j] = p[ids[j]];
  if (m.norm_topk_prob) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum = sum + w[j];
    sum = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] / sum;
  }
  const float scale = static_cast<float>(m.routed_scaling_factor);
  for (int64_t j = 0; j < k; ++j) w[j] = w[j] * scale;
}

Routing route(const ModelConfig& c, const LayerWeights& l, const float* x, int64_t t,
              std::span<const int32_t> forced, int64_t forced_stride, ThreadPool* pool) {
  const int64_t e = c.moe.num_experts, k = c.moe.top_k;
  std::vector<float> probs(static_cast<size_t>(t * e));
  kernels::gemm(x, t, c.hidden_size, l.router, probs.data(), e, pool);
  Routing r{std::vector<int32_t>(t * k), std::vector<float>(t * k), {}};
  for (int64_t i = 0; i < t; ++i) {
    float* p = probs.data() + i * e;
    if (c.moe.score == RouterScore::kSigmoid) {
      route_sigmoid(c.moe, l.router_bias.data(), p,
                    forced.empty() ? nullptr : forced.data() + i * forced_stride,
                    r.ids.data() + i * k, r.weights.data() + i * k);
      continue;
    }
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

// Runs expert `ex` (intermediate f) on the given rows of x; results into y_rows[slot]
// ([T * k, hidden]).
void run_expert(const ModelConfig& c, const ExpertWeights& ex, int64_t f, const float* x,
                const std::vector<int64_t>& slots, int64_t k, float* y_slots, ExpertTape* tape,
                ThreadPool* pool) {
  const int64_t d = c.hidden_size, n = slots.size();
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
  // The routed slots' outputs, then (with a shared expert) every token's shared output: summed over
  // the tensor-parallel group in one reduction.
  const int64_t f = c.moe.moe_intermediate_size;
  std::vector<float> y(static_cast<size_t>((t * k + (l.has_shared ? t : 0)) * d));
  if (tape) tape->experts.assign(static_cast<size_t>(e), ExpertTape{});
  for (int64_t ex = 0; ex < e; ++ex)
    if (!by_expert[ex].empty())
      run_expert(c, l.experts[ex], f, x, by_expert[ex], k, y.data(),
                 tape ? &tape->experts[ex] : nullptr, pool);
  const float* y_shared = y.data() + t * k * d;
  if (l.has_shared) {
    std::vector<int64_t> rows(static_cast<size_t>(t));
    std::iota(rows.begin(), rows.end(), 0);
    run_expert(c, l.shared, c.moe.n_shared_experts * f, x, rows, 1, y.data() + t * k * d,
               tape ? &tape->shared : nullptr, pool);
  }
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
    if (l.has_shared)  // routed + shared, as Glm4MoeMoE adds them
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = o[dd] + y_shared[i * d + dd];
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
