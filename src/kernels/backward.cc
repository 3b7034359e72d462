// Backward of RMSNorm, RoPE, SwiGLU, attention and the GEMM's weight gradient (backward.h).
#include "miles/backward_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "miles/thread_pool.h"

namespace miles::kernels {

namespace {
constexpr int64_t kNormRows = 16;  // rows per RMSNorm-backward work item
}  // namespace

void rmsnorm_backward(const float* x, const float* dy, int64_t m, int64_t d, const float* weight,
                      float eps, float* dx, float* dw, ThreadPool* pool) {
  // Rows are independent but dw sums over them in ascending order: the per-row scales first (in
  // parallel), then dw row by row, then dx (in parallel; it may overwrite dy).
  std::vector<float> inv(static_cast<size_t>(m));
  const int64_t blocks = (m + kNormRows - 1) / kNormRows;
  parallel_for(pool, blocks, [&](int64_t b) {
    const int64_t r0 = b * kNormRows, rows = std::min(m, r0 + kNormRows) - r0;
    float sum_sq[kNormRows];
    detail::dot_rows(x + r0 * d, d, x + r0 * d, d, rows, d, sum_sq);
    for (int64_t r = 0; r < rows; ++r)
      inv[r0 + r] = 1.0f / std::sqrt(sum_sq[r] / static_cast<float>(d) + eps);
  });
  if (dw) {
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * d;
      const float* dyr = dy + r * d;
      for (int64_t i = 0; i < d; ++i) dw[i] = dw[i] + dyr[i] * (xr[i] * inv[r]);
    }
  }
  parallel_for(pool, blocks, [&](int64_t b) {
    const int64_t r0 = b * kNormRows, rows = std::min(m, r0 + kNormRows) - r0;
    thread_local std::vector<float> gw;  // the block's rows of dy · weight
    if (gw.size() < static_cast<size_t>(kNormRows * d)) gw.resize(kNormRows * d);
    for (int64_t r = 0; r < rows; ++r) {
      const float* dyr = dy + (r0 + r) * d;
      for (int64_t i = 0; i < d; ++i) gw[r * d + i] = dyr[i] * weight[i];
    }
    float dot_gx[kNormRows];
    detail::dot_rows(gw.data(), d, x + r0 * d, d, rows, d, dot_gx);
    for (int64_t j = 0; j < rows; ++j) {
      // dx = inv · gw − x · inv³ / d · Σ gw·x
      const int64_t r = r0 + j;
      const float* xr = x + r * d;
      const float* g = gw.data() + j * d;
      const float coef = dot_gx[j] * inv[r] * inv[r] * inv[r] / static_cast<float>(d);
      float* dxr = dx + r * d;
      for (int64_t i = 0; i < d; ++i) dxr[i] = g[i] * inv[r] - xr[i] * coef;
    }
  });
}

void swiglu_backward(const float* gate, const float* up, const float* da, int64_t m, int64_t f,
                     int64_t ld_in, float* d_gate, float* d_up, int64_t ld_out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    const float* a = da + r * f;
    float* dg = d_gate + r * ld_out;
    float* du = d_up + r * ld_out;
    int64_t i = detail::exp_avx512() ? detail::swiglu_backward_avx512(g, u, a, f, dg, du) : 0;
#ifdef MILES_EXP_SIMD_AVX
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= f; i += 8) {  // the scalar loop's operations, 8 lanes at a time
      const __m256 gv = _mm256_loadu_ps(g + i), av = _mm256_loadu_ps(a + i);
      const __m256 den = _mm256_add_ps(one, detail::exp_f32x8(_mm256_xor_ps(gv, sign)));
      const __m256 sig = _mm256_div_ps(one, den), silu = _mm256_div_ps(gv, den);
      _mm256_storeu_ps(du + i, _mm256_mul_ps(av, silu));
      const __m256 t = _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sig)));
      _mm256_storeu_ps(
          dg + i, _mm256_mul_ps(_mm256_mul_ps(av, _mm256_loadu_ps(u + i)), _mm256_mul_ps(sig, t)));
    }
#endif
    for (; i < f; ++i) {
      const float den = 1.0f + detail::exp_f32(-g[i]);
      const float sig = 1.0f / den;
      const float silu = g[i] / den;
      du[i] = a[i] * silu;
      dg[i] = (a[i] * u[i]) * (sig * (1.0f + g[i] * (1.0f - sig)));
    }
  }
}

void gemm_weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m,
                      std::span<const WeightGradPart> parts, int64_t k, ThreadPool* pool) {
  if (m == 0) {  // an empty sum: zeros, folded like any product
    for (const WeightGradPart& p : parts)
      for (int64_t i = 0; i < p.rows * k; ++i) {
        float v = 0.0f;
        for (const float* l : p.lefts) v = l[i] + v;
        p.dw[i] = v;
      }
    return;
  }
  // dyᵀ [N, M] as the GEMM's rows (packed straight from dy's columns: gemm_xt), xᵀ [K, M] packed
  // once as its weight: dW[n, k] = Σ_m dy[m, n] x[m, k], in chunks of kWeightGradChunk rows.
  // Packing moves values only, and every output element keeps its chain whichever part (and so
  // whichever GEMM call) holds it.
  thread_local PackedMatrix xt;
  xt.assign_transposed(x, m, k, ldx, pool);
  xt.set_chunk(kWeightGradChunk);
  for (const WeightGradPart& p : parts)
    gemm_xt(dy + p.row0, p.rows, ldy, xt, p.dw, k, pool, detect_isa(), p.lefts);
}

void gemm_weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m,
                      int64_t n, int64_t k, float* dw, ThreadPool* pool) {
  const WeightGradPart whole{0, n, dw, {}};
  gemm_weight_grad(dy, ldy, x, ldx, m, std::span<const WeightGradPart>(&whole, 1), k, pool);
}

}  // namespace miles::kernels
