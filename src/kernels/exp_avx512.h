// The AVX-512 forms of the row loops built on exp (exp_avx512.cc, compiled with -mavx512f): 16
// lanes at a time, every lane exp_f32x8's operations (and so exp_f32's), so the instruction set
// changes no bits. A 16-lane exp needs half the instructions of two 8-lane ones, whose integer
// steps AVX alone splits into SSE halves: SwiGLU 2.9x faster on a SmolLM2 row block.
//
// Each function does the whole 16-lane blocks of its row and returns how many elements that was
// (n rounded down to 16); the caller finishes the rest with its portable loop. The scalar code
// stays out of exp_avx512.cc: an inline function compiled for AVX-512 there could be the copy the
// linker keeps for every caller.
//
// Call only when detect_isa() == Isa::kAvx512 (exp_avx512()).
#pragma once

#include <cstdint>

namespace miles::kernels::detail {

// out[i] = exp_f32(x[i] - shift) (exp_shifted).
int64_t exp_shifted_avx512(const float* x, float shift, int64_t n, float* out);

// o[i] = (g[i] / (1 + exp_f32(-g[i]))) * u[i] (swiglu's row).
int64_t swiglu_avx512(const float* g, const float* u, int64_t n, float* o);

// swiglu_backward's row: den = 1 + exp_f32(-g), sig = 1 / den, silu = g / den;
// du = a * silu, dg = (a * u) * (sig * (1 + g * (1 - sig))).
int64_t swiglu_backward_avx512(const float* g, const float* u, const float* a, int64_t n, float* dg,
                               float* du);

// The log-probability gradient's row (logprob.cc): lp = (x - max) - log_sum, p = exp_f32(lp),
// out = -gl * p - (ge * p) * (lp + h).
int64_t logprob_gradient_avx512(const float* x, int64_t n, float max, float log_sum, float gl,
                                float ge, float h, float* out);

}  // namespace miles::kernels::detail
