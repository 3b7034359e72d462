// The numerics contract (include/miles/kernels.h) as functions that compile for the host and for
// CUDA devices alike: the same IEEE operations in the same order as the CPU kernels' scalar code,
// so a device kernel built from them gives the CPU kernels' bits.
//
// Why: a GPU rollout engine and a CPU trainer (or a GPU trainer) must agree bit for bit. fma,
// +, ·, / and sqrt are correctly rounded on both sides (nvcc with --fmad=false, -prec-div and
// -prec-sqrt on; the host with -ffp-contract=off), so following the contract's order is enough.
// Transcendentals other than exp (RoPE's cos and sin) are computed on the host and uploaded.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/exp_constants.h"
#include "miles/kernels.h"

#if defined(__CUDACC__)
#define MILES_HD __host__ __device__
#else
#define MILES_HD
#endif

namespace miles::device {

inline constexpr int64_t kChunk = kernels::kGemmChunk;
inline constexpr int64_t kAttnBlock = kernels::kAttnBlock;
inline constexpr int64_t kMaxHeadDim = 256;

MILES_HD inline float bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

MILES_HD inline float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

MILES_HD inline float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Round to nearest, ties to even (std::nearbyint in the default rounding mode).
MILES_HD inline float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

MILES_HD inline bool is_nan(float x) { return x != x; }

// mla.cc's rope_source: the source of position j of MLA's rotated block of r values (interleaved
// pairs laid out as [x0, x2, …, x1, x3, …] where `interleave`).
MILES_HD inline int64_t mla_rope_source(int64_t j, int64_t r, bool interleave) {
  if (!interleave) return j;
  return j < r / 2 ? 2 * j : 2 * (j - r / 2) + 1;
}
MILES_HD inline float inf_f() { return bits_to_float(0x7f800000u); }
MILES_HD inline bool is_inf(float x) { return x == inf_f() || x == -inf_f(); }
// std::max(a, b): b when a < b, else a.
MILES_HD inline float max_f(float a, float b) { return a < b ? b : a; }

// kernels::detail::exp_f32, operation for operation (src/kernels/exp.h).
MILES_HD inline float exp_f32(float x) {
  using namespace kernels::detail::exp_constants;
  if (is_nan(x)) return x;
  x = x < kLo ? kLo : x;
  x = x > kHi ? kHi : x;
  const float kf = round_even(x * kLog2e);
  float r = fma_f(-kf, kC1, x);
  r = fma_f(-kf, kC2, r);
  const float z = r * r;
  float p = kP5;
  p = fma_f(p, r, kP4);
  p = fma_f(p, r, kP3);
  p = fma_f(p, r, kP2);
  p = fma_f(p, r, kP1);
  p = fma_f(p, r, kP0);
  const float y = fma_f(p, z, r) + 1.0f;
  const int32_t n = static_cast<int32_t>(kf);
  const int32_t n1 = n >> 1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(n - n1 + 127) << 23);
  return (y * s1) * s2;
}

// kernels::geglu's gelu_tanh and its derivative (src/kernels/geglu.cc), operation for operation:
// tanh(u) = 1 − 2 / (exp(2u) + 1).
MILES_HD inline float tanh_via_exp_f(float u) { return 1.0f - 2.0f / (exp_f32(2.0f * u) + 1.0f); }
MILES_HD inline float gelu_tanh_f(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * (x * x * x));
  return (0.5f * x) * (1.0f + tanh_via_exp_f(inner));
}
MILES_HD inline float gelu_tanh_grad_f(float x) {
  const float x_sq = x * x;
  const float th = tanh_via_exp_f(0.7978845608028654f * (x + 0.044715f * (x_sq * x)));
  const float left = 0.5f * x, right = 1.0f + th;
  const float inner_derivative = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x_sq);
  return 0.5f * right + left * (1.0f - th * th) * inner_derivative;
}

// The contract's balanced halving tree over leaves 0 .. n - 1 (split [lo, hi) at
// lo + ceil((hi - lo) / 2), left + right), with leaf(i) evaluated once each, in ascending i, as the
// traversal reaches it: an explicit stack of O(log n) frames and no array of partials, so any n
// fits (n >= 1).
template <typename Leaf>
MILES_HD inline float tree_reduce(int64_t n, const Leaf& leaf) {
  struct Frame {  // 16 bytes; the depth is at most ceil(log2 n) + 1 (n < 2^31)
    int32_t lo, hi, state;
    float left;
  };
  Frame st[33];
  int top = 0;
  st[0] = {0, static_cast<int32_t>(n), 0, 0.0f};
  float ret = 0.0f;
  while (top >= 0) {
    Frame& f = st[top];
    if (f.hi - f.lo == 1) {
      ret = leaf(f.lo);
      --top;
    } else if (f.state == 0) {
      f.state = 1;
      st[top + 1] = {f.lo, f.lo + (f.hi - f.lo + 1) / 2, 0, 0.0f};
      ++top;
    } else if (f.state == 1) {
      f.left = ret;
      f.state = 2;
      st[top + 1] = {f.lo + (f.hi - f.lo + 1) / 2, f.hi, 0, 0.0f};
      ++top;
    } else {
      ret = f.left + ret;
      --top;
    }
  }
  return ret;
}

// Σ_k a(k) · b(k) by the contract: chunks of `chunk` accumulated with fma in ascending k from 0,
// the chunk partials combined by the halving tree. `a` and `b` are index → value callables.
template <typename A, typename B>
MILES_HD inline float chunked_dot(int64_t k, int64_t chunk, const A& a, const B& b) {
  const int64_t chunks = k <= 0 ? 1 : (k + chunk - 1) / chunk;
  return tree_reduce(chunks, [&](int64_t c) {
    float acc = 0.0f;
    const int64_t end = (c + 1) * chunk < k ? (c + 1) * chunk : k;
    for (int64_t i = c * chunk; i < end; ++i) acc = fma_f(a(i), b(i), acc);
    return acc;
  });
}

// Σ_i term(i) by the row-reduction rule (kernels::detail::chunked_sum): chunks of `chunk` added
// (not fma) in ascending i from 0, partials by the halving tree.
template <typename T>
MILES_HD inline float chunked_sum(int64_t n, int64_t chunk, const T& term) {
  const int64_t chunks = n <= 0 ? 1 : (n + chunk - 1) / chunk;
  return tree_reduce(chunks, [&](int64_t c) {
    float acc = 0.0f;
    const int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    for (int64_t i = c * chunk; i < end; ++i) acc = acc + term(i);
    return acc;
  });
}

}  // namespace miles::device
