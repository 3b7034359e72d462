// The GEMM micro-kernel seam: one K chunk of a tile of rows × one packed panel (kPanel columns).
//
// Every implementation computes, for each row r < rows and column j < kPanel,
//   part[r * kPanel + j] = fma(a[kc-1][r], b[kc-1][j], ... fma(a[1][r], b[1][j], a[0][r] *
//   b[0][j]))
// — an fma chain in ascending k from zero — so all instruction sets give identical bits. The rows
// come k-major (row r at k: a[k * lda + r]) so that one cache line feeds every row of a k step
// (row-major rows 8 KB apart alias in L1 and throttle the kernel): packed ([kc][tile_rows], lda =
// the ISA's tile height; the seam takes any lda >= rows, e.g. a transposed operand in place).
#pragma once

#include <cstdint>

namespace miles::kernels::detail {

// a: the tile at the chunk's first k (row r at k: a[k * lda + r]); b: the panel at the chunk's
// first k
// ([kc][kPanel]); part: [rows][kPanel]; rows <= tile_rows. With `left` (may equal part), part =
// left + chain element-wise instead: the reduction tree's merge of this chunk into its left
// sibling, done while the chain is still in registers.
using ChunkTileFn = void (*)(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                             const float* left, float* part);

void chunk_tile_scalar(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                       const float* left, float* part);
void chunk_tile_avx2(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                     const float* left, float* part);
void chunk_tile_avx512(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                       const float* left, float* part);

// Both vector tiles prefetch the panel's k row kPrefetchAhead steps ahead (4 KB) as they go.
// With the weights from memory (a decode step, a verify chunk) the hardware's prefetchers alone
// appear to keep too few lines in flight once a k step holds more than a few fmas: on an Intel Xeon
// (AVX-512) 8 rows cost 1.6-2.2x one row without it, 1.3-1.45x with it. From cache the prefetches
// cost nothing measurable. Prefetching past the panel's end is harmless (a hint, never a fault).
inline constexpr int64_t kPrefetchAhead = 32;

[[gnu::always_inline]] inline void prefetch_panel_row(const float* row) {
  __builtin_prefetch(row, 0, 3);
  __builtin_prefetch(row + 16, 0, 3);
}

inline constexpr int kTileRowsScalar = 4;
inline constexpr int kTileRowsAvx2 = 6;
inline constexpr int kTileRowsAvx512 = 12;

}  // namespace miles::kernels::detail
