// The GEMM micro-kernel seam: one K chunk of a tile of rows × one packed panel (kPanel columns).
//
// Every implementation computes, for each row r < rows and column j < kPanel,
//   part[r * kPanel + j] = fma(x[r][kc-1], b[kc-1][j], ... fma(x[r][1], b[1][j], x[r][0] * b[0][j]))
// — an fma chain in ascending k from zero — so all instruction sets give identical bits.
#pragma once

#include <cstdint>

namespace miles::kernels::detail {

// x: rows starting at the chunk's first k, row stride lda; b: the panel at the chunk's first k
// ([kc][kPanel]); part: [rows][kPanel].
using ChunkTileFn = void (*)(const float* x, int64_t lda, int rows, const float* b, int64_t kc,
                             float* part);

void chunk_tile_scalar(const float* x, int64_t lda, int rows, const float* b, int64_t kc,
                       float* part);
void chunk_tile_avx2(const float* x, int64_t lda, int rows, const float* b, int64_t kc, float* part);
void chunk_tile_avx512(const float* x, int64_t lda, int rows, const float* b, int64_t kc,
                       float* part);

inline constexpr int kTileRowsScalar = 4;
inline constexpr int kTileRowsAvx2 = 6;
inline constexpr int kTileRowsAvx512 = 12;

}  // namespace miles::kernels::detail
