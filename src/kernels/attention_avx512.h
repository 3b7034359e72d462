// The AVX-512 forms of attention's row sums (attention_avx512.cc, compiled with -mavx512f): a few
// keys' dk (or dv) rows summed over a query block's (head, query) rows (phase 2 of the backward,
// attention_backward.cc), and a few heads' rows of coefficients times rows (p · v, dS · k). Each
// holds whole head rows (16–64 floats) in zmm registers; every element keeps the fma chain of the
// portable loops, so the instruction set changes no bits.
#pragma once

#include <cstdint>

namespace miles::kernels::detail {

// The rows a query block's dk (q rows, coefficients dS) or dv (d_out rows, coefficients P) sum
// over: row (g, i) = base + g * head_stride + i * row_stride for the group's heads g and queries
// i in [i0, i1); coefficient (g, i, key j) = coef[(g * qb + i - i0) * t + j].
struct BlockRows {
  const float* base;
  int64_t head_stride, row_stride, group, qb, t, i0, i1;
  const float* row(int64_t g, int64_t i) const { return base + g * head_stride + i * row_stride; }
  int64_t coef_at(int64_t g, int64_t i) const { return (g * qb + i - i0) * t; }
};

// Whether these kernels take this head dimension: a multiple of 16 up to 64 (whole zmm rows
// held in registers for four keys).
inline bool attention_avx512_fits(int64_t hd) { return hd % 16 == 0 && hd >= 16 && hd <= 64; }

// acc of keys j0 .. j0 + keys - 1 (keys in [1, 4]; rows acc + l * ld_acc): acc_l[e] =
// fma(coef(g, i, j0 + l), row(g, i)[e], acc_l[e]) over g ascending, then i ascending from
// max(i0, j0 + l). The whole head dimension in registers, so each coefficient is broadcast once.
// Needs AVX-512F and attention_avx512_fits(hd).
void key_lanes_avx512(int keys, const float* coef, const BlockRows& b, int64_t j0, int64_t hd,
                      float* acc, int64_t ld_acc);

// fma_rows_lanes (attention_lanes.h) for `lanes` in [1, 4]: acc[l][e] = fma(p[l][j], rows[j][e],
// acc[l][e]) for j ascending from 0 to n - 1. Needs AVX-512F and attention_avx512_fits(hd).
void fma_rows_avx512(int lanes, const float* const* p, const float* const* rows, int64_t n,
                     int64_t hd, float* const* acc);

}  // namespace miles::kernels::detail
