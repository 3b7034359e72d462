// GeGLU: gelu_tanh(gate) * up, and its backward. gelu_tanh is torch's gelu(approximate="tanh")
// (Gemma's gelu_pytorch_tanh), 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), its operations in
// torch's order, with tanh(u) = 1 − 2 / (exp(2u) + 1) from miles' exp (exp.h): the same bits on
// every ISA and thread count, within ~1e-7 of libm's tanh (the golden tests compare with torch).
// Scalar: the GEMMs around it dominate a GeGLU layer.
#include "kernels/exp.h"
#include "miles/backward_kernels.h"
#include "miles/kernels.h"

namespace miles::kernels {

namespace {

constexpr float kBeta = 0.7978845608028654f;  // √2 · (2/√π) · ½ = √(2/π)
constexpr float kKappa = 0.044715f;

float tanh_f32(float u) { return 1.0f - 2.0f / (detail::exp_f32(2.0f * u) + 1.0f); }

float gelu_tanh(float x) {
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return (0.5f * x) * (1.0f + tanh_f32(inner));
}

// d gelu_tanh / d x, as torch's GeluBackward (tanh) writes it.
float gelu_tanh_grad(float x) {
  const float x_sq = x * x;
  const float th = tanh_f32(kBeta * (x + kKappa * (x_sq * x)));
  const float left = 0.5f * x, right = 1.0f + th;
  const float inner_derivative = kBeta * (1.0f + 3.0f * kKappa * x_sq);
  return 0.5f * right + left * (1.0f - th * th) * inner_derivative;
}

}  // namespace

void geglu(const float* gate, const float* up, int64_t m, int64_t f, int64_t ld_in, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    float* o = out + r * f;
    for (int64_t i = 0; i < f; ++i) o[i] = gelu_tanh(g[i]) * u[i];
  }
}

void geglu_backward(const float* gate, const float* up, const float* da, int64_t m, int64_t f,
                    int64_t ld_in, float* d_gate, float* d_up, int64_t ld_out) {
  for (int64_t r = 0; r < m; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    const float* a = da + r * f;
    float* dg = d_gate + r * ld_out;
    float* du = d_up + r * ld_out;
    for (int64_t i = 0; i < f; ++i) {
      du[i] = a[i] * gelu_tanh(g[i]);
      dg[i] = (a[i] * u[i]) * gelu_tanh_grad(g[i]);
    }
  }
}

}  // namespace miles::kernels
