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
#include <type_traits>
#include <utility>

namespace miles::kernels::detail {

// Another panel's lines to bring into L2 while a tile computes from cache. A decode step's or a
// verify's few rows stream each panel from memory once, in its first tile, while the item's later
// tiles compute from L2 with the memory idle: single-threaded, 32 rows × a 576 × 576 matrix took
// 131 µs with the weights in cache, 97 µs for the read alone, and 219 µs from memory. Spreading the
// next panel's lines over the k steps of all the panel's tiles keeps the memory busy at about the
// rate the item consumes it (161–168 µs). At k step k a tile prefetches line
// ((step0 + k) · rate) >> 16 of `next` (step0: the call's first k step counted over the item's
// tiles of this panel; rate: lines per k step in 16.16 fixed point). A hint: never changes a
// result.
// `ahead`: the tile also prefetches its own panel's k rows kPrefetchAhead steps ahead, as a tile
// does that streams the panel from memory. An item's later tiles of a panel read what its first
// tile just brought into L2, where the hardware prefetchers keep up and the extra instructions
// cost the AVX2 tile (12 fmas a k step) 7-15 % (Zen 4, one thread, the panel in L2).
struct NextPanel {
  const char* next = nullptr;  // null: nothing to prefetch
  int64_t step0 = 0;
  int64_t rate = 0;
  bool ahead = true;
};

[[gnu::always_inline]] inline void prefetch_next_panel(const NextPanel& np, int64_t k) {
  if (np.next) __builtin_prefetch(np.next + (((np.step0 + k) * np.rate) >> 16) * 64, 0, 2);
}

// a: the tile at the chunk's first k (row r at k: a[k * lda + r]); b: the panel at the chunk's
// first k ([kc][kPanel]); part: [rows][kPanel]; rows <= tile_rows. With `left` (may equal part),
// part = left + chain element-wise instead: the reduction tree's merge of this chunk into its left
// sibling, done while the chain is still in registers. np: lines to prefetch as it goes.
using ChunkTileFn = void (*)(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                             const float* left, float* part, const NextPanel& np);

void chunk_tile_scalar(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                       const float* left, float* part, const NextPanel& np);
void chunk_tile_avx2(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                     const float* left, float* part, const NextPanel& np);
void chunk_tile_avx512(const float* a, int64_t lda, int rows, const float* b, int64_t kc,
                       const float* left, float* part, const NextPanel& np);

inline constexpr int64_t kPrefetchAhead = 32;

[[gnu::always_inline]] inline void prefetch_panel_row(const float* row) {
  __builtin_prefetch(row, 0, 3);
  __builtin_prefetch(row + 16, 0, 3);
}

// Calls f(std::integral_constant<int, rows>{}) for 1 <= rows <= N: a run-time row count to the
// tile compiled for it (rows outside do nothing).
template <int N, typename F>
[[gnu::always_inline]] inline void with_tile_rows(int rows, F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((rows == I + 1 && (f(std::integral_constant<int, I + 1>{}), true)) || ...);
  }
  (std::make_integer_sequence<int, N>{});
}

// Calls f(std::true_type{}) or f(std::false_type{}) as `ahead` says: NextPanel::ahead to the tile
// compiled with or without the panel-row prefetches.
template <typename F>
[[gnu::always_inline]] inline void with_ahead(bool ahead, F&& f) {
  if (ahead) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

inline constexpr int kTileRowsScalar = 4;
inline constexpr int kTileRowsAvx2 = 6;
inline constexpr int kTileRowsAvx512 = 12;

}  // namespace miles::kernels::detail
