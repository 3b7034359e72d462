// AdamW, the global gradient norm and clipping (optimizer.h).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "miles/check.h"
#include "miles/trainer/optimizer.h"
#include "miles/thread_pool.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace miles {

Status AdamWConfig::validate() const {
  if (!(beta1 >= 0 && beta1 < 1)) return Status::Error("optimizer.beta1 must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) return Status::Error("optimizer.beta2 must be in [0, 1)");
  if (!(eps > 0)) return Status::Error("optimizer.eps must be > 0");
  if (!(weight_decay >= 0)) return Status::Error("optimizer.weight_decay must be >= 0");
  if (!std::isfinite(clip_grad_norm))
    return Status::Error("optimizer.clip_grad_norm must be finite");
  return Status::Ok();
}

double squared_norm_slice(const float* g, int64_t n) {
  MILES_CHECK(n >= 0 && n <= kNormSlice, "a norm slice holds at most kNormSlice elements");
  constexpr int kLanes = 16;
  double lane[kLanes] = {};
  int64_t i = 0;
#if defined(__AVX__)
  // Four lanes per register, the scalar loop's operations (widen, multiply, add) on each.
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  for (; i + kLanes <= n; i += kLanes)
    for (int r = 0; r < 4; ++r) {
      const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(g + i + 4 * r));
      acc[r] = _mm256_add_pd(acc[r], _mm256_mul_pd(x, x));
    }
  for (int r = 0; r < 4; ++r) _mm256_storeu_pd(lane + 4 * r, acc[r]);
#endif
  for (; i < n; ++i) {
    const double x = g[i];
    lane[i % kLanes] = lane[i % kLanes] + x * x;
  }
  for (int half = kLanes / 2; half >= 1; half /= 2)  // lane j += lane j + half, halving
    for (int j = 0; j < half; ++j) lane[j] = lane[j] + lane[j + half];
  return lane[0];
}

double squared_norm(const float* g, int64_t n) {
  double s = 0.0;
  for (int64_t b = 0; b < n; b += kNormSlice)
    s = s + squared_norm_slice(g + b, std::min(kNormSlice, n - b));
  return s;
}

double global_grad_norm(const FlatTensors& grads) {
  double total = 0.0;
  for (const ParamSpec& s : grads.layout().specs())
    total += squared_norm(grads.all().data() + s.offset, s.numel);
  return std::sqrt(total);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

double clip_grad_norm(FlatTensors& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  const float c = clip_scale(norm, max_norm);
  if (c != 1.0f)
    for (float& g : grads.all()) g = g * c;
  return norm;
}

AdamW::AdamW(std::shared_ptr<const ParamLayout> layout, AdamWConfig config)
    : config_(config), m_(layout), v_(layout) {}

void AdamW::step(FlatTensors& params, const FlatTensors& grads, double lr,
                 const std::vector<bool>* only, ThreadPool* pool, float grad_scale) {
  const bool scaled = grad_scale != 1.0f;
  ++step_;
  const double bc1 = 1.0 - std::pow(config_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(config_.beta2, static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(config_.eps);
  const float one_minus_b1 = static_cast<float>(1.0 - config_.beta1);
  const float b2 = static_cast<float>(config_.beta2),
              one_minus_b2 = static_cast<float>(1.0 - config_.beta2);
  const std::vector<ParamSpec>& specs = params.layout().specs();
  // Element-wise: work items are slices of kSlice elements of one tensor (disjoint writes).
  constexpr int64_t kSlice = int64_t{1} << 16;
  std::vector<std::pair<size_t, int64_t>> items;  // (tensor, first element)
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    if ((only && !(*only)[ti]) || !specs[ti].trainable) continue;
    for (int64_t b = 0; b < specs[ti].numel; b += kSlice) items.emplace_back(ti, b);
  }
  parallel_for(pool, items.size(), [&](int64_t item) {
    const auto [ti, begin] = items[item];
    const ParamSpec& s = specs[ti];
    const int64_t end = std::min(s.numel, begin + kSlice);
    const double wd = s.shape.size() >= 2 ? config_.weight_decay : 0.0;
    const float decay = static_cast<float>(1.0 - lr * wd);
    float* p = params.all().data() + s.offset;
    const float* g = grads.all().data() + s.offset;
    float* m = m_.all().data() + s.offset;
    float* v = v_.all().data() + s.offset;
    int64_t i = begin;
#if defined(__AVX__)
    // Eight elements at a time with the very same IEEE operations in the same order (no fma: the
    // build keeps a*b+c as two roundings), so the bits equal the scalar loop's.
    const __m256 vdecay = _mm256_set1_ps(decay), vb1 = _mm256_set1_ps(one_minus_b1),
                 vb2 = _mm256_set1_ps(b2), v1b2 = _mm256_set1_ps(one_minus_b2),
                 vbc2 = _mm256_set1_ps(bc2_sqrt), veps = _mm256_set1_ps(eps),
                 vstep = _mm256_set1_ps(step_size), vscale = _mm256_set1_ps(grad_scale);
    for (; i + 8 <= end; i += 8) {
      __m256 pi = _mm256_loadu_ps(p + i);
      __m256 gi = _mm256_loadu_ps(g + i);
      if (scaled) gi = _mm256_mul_ps(gi, vscale);
      if (wd != 0.0) pi = _mm256_mul_ps(pi, vdecay);
      __m256 mi = _mm256_loadu_ps(m + i);
      mi = _mm256_add_ps(mi, _mm256_mul_ps(vb1, _mm256_sub_ps(gi, mi)));
      __m256 vi = _mm256_loadu_ps(v + i);
      vi = _mm256_add_ps(_mm256_mul_ps(vi, vb2), _mm256_mul_ps(v1b2, _mm256_mul_ps(gi, gi)));
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc2), veps);
      pi = _mm256_sub_ps(pi, _mm256_mul_ps(vstep, _mm256_div_ps(mi, denom)));
      _mm256_storeu_ps(m + i, mi);
      _mm256_storeu_ps(v + i, vi);
      _mm256_storeu_ps(p + i, pi);
    }
#endif
    for (; i < end; ++i) {
      const float gi = scaled ? g[i] * grad_scale : g[i];
      if (wd != 0.0) p[i] = p[i] * decay;
      m[i] = m[i] + one_minus_b1 * (gi - m[i]);
      v[i] = v[i] * b2 + one_minus_b2 * (gi * gi);
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] = p[i] - step_size * (m[i] / denom);
    }
  });
}

}  // namespace miles
