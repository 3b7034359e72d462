// Backward of RMSNorm, RoPE, SwiGLU, attention and the GEMM's weight gradient (backward.h).
#include "kernels/backward.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/reduce.h"
#include "miles/thread_pool.h"

namespace miles::kernels {

void rmsnorm_backward(const float* x, const float* dy, int64_t m, int64_t d, const float* weight,
                      float eps, float* dx, float* dw) {
  std::vector<float> gw(static_cast<size_t>(d));
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    const float inv = 1.0f / std::sqrt(detail::dot(xr, xr, d) / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) {
      gw[i] = dyr[i] * weight[i];
      if (dw) dw[i] = dw[i] + dyr[i] * (xr[i] * inv);
    }
    // dx = inv · gw − x · inv³ / d · Σ gw·x
    const float dot_gx = detail::dot(gw.data(), xr, d);
    const float coef = dot_gx * inv * inv * inv / static_cast<float>(d);
    float* dxr = dx + r * d;
    for (int64_t i = 0; i < d; ++i) dxr[i] = gw[i] * inv - xr[i] * coef;
  }
}

void rope_backward(float* dx, int64_t t, int64_t heads, int64_t head_dim, const int32_t* positions,
                   const RopeTable& table) {
  const int64_t half = table.rotary_dim / 2;
  const float s = table.attention_scaling;
  for (int64_t i = 0; i < t; ++i) {
    const float pos = static_cast<float>(positions[i]);
    for (int64_t j = 0; j < half; ++j) {
      const float angle = pos * table.inv_freq[j];
      const float c = std::cos(angle) * s;
      const float sn = std::sin(angle) * s;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = dx + (i * heads + h) * head_dim;
        const float a = v[j], b = v[j + half];
        v[j] = a * c + b * sn;
        v[j + half] = b * c - a * sn;
      }
    }
  }
}

void swiglu_backward(const float* gate, const float* up, const float* da, int64_t m, int64_t f,
                     int64_t ld_in, float* d_gate, float* d_up, int64_t ld_out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    const float* a = da + r * f;
    float* dg = d_gate + r * ld_out;
    float* du = d_up + r * ld_out;
    for (int64_t i = 0; i < f; ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-g[i]));
      const float silu = g[i] / (1.0f + std::exp(-g[i]));
      du[i] = a[i] * silu;
      dg[i] = (a[i] * u[i]) * (sig * (1.0f + g[i] * (1.0f - sig)));
    }
  }
}

void attention_backward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldkv,
                        const float* d_out, int64_t t, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, float scale, float* dq, float* dk, float* dv) {
  MILES_CHECK(heads % kv_heads == 0);
  const int64_t group = heads / kv_heads, hd = head_dim;
  for (int64_t i = 0; i < t; ++i) {
    std::fill(dk + i * ldkv, dk + i * ldkv + kv_heads * hd, 0.0f);
    std::fill(dv + i * ldkv, dv + i * ldkv + kv_heads * hd, 0.0f);
  }
  std::vector<float> p(static_cast<size_t>(t)), dp(static_cast<size_t>(t));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kh = h / group;
    for (int64_t i = 0; i < t; ++i) {
      const float* qi = q + i * ldq + h * hd;
      const float* doi = d_out + (i * heads + h) * hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = detail::dot(qi, k + j * ldkv + kh * hd, hd) * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum = sum + p[j];
      }
      // D = Σ p·dp, with dp_j = d_out · v_j.
      float dsum = 0.0f;
      for (int64_t j = 0; j <= i; ++j) {
        p[j] = p[j] / sum;
        dp[j] = detail::dot(doi, v + j * ldkv + kh * hd, hd);
        dsum = std::fma(p[j], dp[j], dsum);
      }
      float* dqi = dq + i * ldq + h * hd;
      std::fill(dqi, dqi + hd, 0.0f);
      for (int64_t j = 0; j <= i; ++j) {
        const float ds = p[j] * (dp[j] - dsum) * scale;
        const float* kj = k + j * ldkv + kh * hd;
        float* dkj = dk + j * ldkv + kh * hd;
        float* dvj = dv + j * ldkv + kh * hd;
        for (int64_t e = 0; e < hd; ++e) {
          dqi[e] = std::fma(ds, kj[e], dqi[e]);
          dkj[e] = std::fma(ds, qi[e], dkj[e]);
          dvj[e] = std::fma(p[j], doi[e], dvj[e]);
        }
      }
    }
  }
}

void gemm_weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m,
                      int64_t n, int64_t k, float* dw, ThreadPool* pool) {
  if (m == 0) {
    std::fill(dw, dw + n * k, 0.0f);
    return;
  }
  // dyᵀ [N, M] as the GEMM's rows; xᵀ [K, M] packed as its weight: dW[n, k] = Σ_m dy[m, n] x[m, k].
  std::vector<float> dyt(static_cast<size_t>(n * m));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) dyt[c * m + r] = dy[r * ldy + c];
  const PackedMatrix xt = PackedMatrix::pack_transposed(x, m, k, ldx);
  gemm(dyt.data(), n, m, xt, dw, k, pool);
}

}  // namespace miles::kernels
