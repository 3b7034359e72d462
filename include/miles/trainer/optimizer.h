// AdamW with fp32 master weights, global grad-norm clipping and the learning-rate schedule.
//
// Why: the learner's update must be exactly reproducible (a resumed run continues bit for bit) and
// comparable with torch.optim.AdamW (tests/adamw_test.cc runs 10 steps against torch's).
// Parameters, gradients and both moments share one ParamLayout (flat_params.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "miles/flat_params.h"
#include "miles/status.h"

namespace miles {

class ThreadPool;

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled; applied to matrices (ndim >= 2) only, not norms / biases
  double clip_grad_norm = 1.0;  // <= 0: no clipping
  Status validate() const;
};

// Warm-up then constant or cosine decay (Megatron's shape), for optimizer step k = 0, 1, …:
// k < warmup: lr · (k + 1) / warmup; then constant lr, or
// min_lr + (lr − min_lr) · ½ (1 + cos(π · (k − warmup) / (total − warmup))), held at min_lr past
// total.
struct LrSchedule {
  enum class Decay { kConstant, kCosine };
  double lr = 1e-5;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine: where it reaches min_lr
  Decay decay = Decay::kConstant;
  double at(int64_t step) const;
  Status validate() const;
};

// Σ g² of one tensor in double, in a fixed order that vectorises and spreads over threads: slices
// of kNormSlice elements in ascending order, each slice in 16 interleaved lanes (lane l adds the
// squares of its elements ≡ l mod 16 in ascending order) combined by a fixed pairwise tree. A pure
// function of the values: any thread count, instruction set or pipeline split gives its bits.
inline constexpr int64_t kNormSlice = int64_t{1} << 16;
double squared_norm_slice(const float* g, int64_t n);  // one slice: n <= kNormSlice
double squared_norm(const float* g, int64_t n);        // Σ of its slices' squared_norm_slice
// √(Σ g²) over every gradient: each tensor's squared_norm, tensors summed in layout order (torch's
// norm of per-tensor norms, in double).
double global_grad_norm(const FlatTensors& grads);
// Scales grads by max_norm / (norm + 1e-6) when that is below 1 (torch's clip_grad_norm_). Returns
// the norm before clipping.
double clip_grad_norm(FlatTensors& grads, double max_norm);
// The factor clip_grad_norm multiplies every gradient by (1 when max_norm <= 0 or the norm is
// within it): what the trainer hands AdamW as grad_scale instead of scaling the gradients.
float clip_scale(double norm, double max_norm);

class AdamW {
 public:
  AdamW(std::shared_ptr<const ParamLayout> layout, AdamWConfig config);
  // One update of params from grads at learning rate lr (torch.optim.AdamW's single-tensor formula:
  // p ← p(1 − lr·wd); m ← lerp(m, g, 1 − β1); v ← β2 v + (1 − β2) g²;
  // p ← p − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + eps)).
  // `only` (optional, per tensor in layout order): update just those tensors (a pipeline stage's).
  // Element-wise, so slices run across `pool` (optional) with identical results.
  // grad_scale ≠ 1 (gradient clipping): every g is read as g · grad_scale (one float multiply), the
  // bits of scaling the gradients first without the pass over them.
  void step(FlatTensors& params, const FlatTensors& grads, double lr,
            const std::vector<bool>* only = nullptr, ThreadPool* pool = nullptr,
            float grad_scale = 1.0f);
  int64_t steps() const { return step_; }
  const AdamWConfig& config() const { return config_; }
  // State for checkpoints.
  FlatTensors& exp_avg() { return m_; }
  FlatTensors& exp_avg_sq() { return v_; }
  const FlatTensors& exp_avg() const { return m_; }
  const FlatTensors& exp_avg_sq() const { return v_; }
  void set_steps(int64_t s) { step_ = s; }

 private:
  AdamWConfig config_;
  FlatTensors m_, v_;
  int64_t step_ = 0;
};

}  // namespace miles
