// GEMM driver: y[M, N] = x[M, K] · Wᵀ with the chunked, tree-combined reduction of kernels.h.
//
// Work items are (block of rows) × (panel of kPanel columns); each item computes its outputs completely
// (all K chunks, then the tree), so neither the thread count nor M changes any output's bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/gemm_tile.h"
#include "kernels/reduce.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"

namespace miles::kernels {
namespace detail {

void chunk_tile_scalar(const float* a_tile, int rows, const float* b, int64_t kc, float* part) {
  for (int r = 0; r < rows; ++r) {
    float acc[kPanel] = {};
    for (int64_t k = 0; k < kc; ++k) {
      const float a = a_tile[k * kTileRowsScalar + r];
      for (int64_t j = 0; j < kPanel; ++j) acc[j] = std::fma(a, b[k * kPanel + j], acc[j]);
    }
    std::copy(acc, acc + kPanel, part + r * kPanel);
  }
}

}  // namespace detail

namespace {

constexpr int64_t kRowBlock = 48;  // rows per work item (a multiple of every tile height)

struct TileKernel {
  detail::ChunkTileFn fn;
  int rows;
};

TileKernel tile_kernel(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return {detail::chunk_tile_avx512, detail::kTileRowsAvx512};
    case Isa::kAvx2: return {detail::chunk_tile_avx2, detail::kTileRowsAvx2};
    case Isa::kScalar: break;
  }
  return {detail::chunk_tile_scalar, detail::kTileRowsScalar};
}

// Balanced halving tree over chunk partials p[lo..hi) (each a row of `width` floats); result in p[lo].
void tree_combine(float* p, int64_t stride, int64_t width, int64_t lo, int64_t hi) {
  if (hi - lo <= 1) return;
  const int64_t mid = lo + (hi - lo + 1) / 2;
  tree_combine(p, stride, width, lo, mid);
  tree_combine(p, stride, width, mid, hi);
  float* a = p + lo * stride;
  const float* b = p + mid * stride;
  for (int64_t j = 0; j < width; ++j) a[j] = a[j] + b[j];
}

// x packed as tiles of kern.rows rows: tile t holds [K][kern.rows] (rows past M are zero).
void pack_rows(const float* x, int64_t m, int64_t lda, int64_t k, int tile_rows, float* out) {
  const int64_t tiles = (m + tile_rows - 1) / tile_rows;
  for (int64_t t = 0; t < tiles; ++t) {
    float* dst = out + t * k * tile_rows;
    for (int r = 0; r < tile_rows; ++r) {
      const int64_t row = t * tile_rows + r;
      if (row < m) {
        const float* src = x + row * lda;
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * tile_rows + r] = src[kk];
      } else {
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * tile_rows + r] = 0.0f;
      }
    }
  }
}

void gemm_item(const float* a_packed, int64_t row0, int64_t rows, const PackedMatrix& w,
               int64_t panel, float* y, int64_t ldy, TileKernel kern, std::vector<float>& parts) {
  const int64_t k = w.k(), chunk = w.chunk();
  const int64_t chunks = std::max<int64_t>(1, (k + chunk - 1) / chunk);
  const int64_t chunk_stride = rows * kPanel;  // parts: [chunks][rows][kPanel]
  parts.resize(static_cast<size_t>(chunks * chunk_stride));
  const float* b = w.panel(panel);
  for (int64_t r = 0; r < rows; r += kern.rows) {
    const int tr = static_cast<int>(std::min<int64_t>(kern.rows, rows - r));
    const float* a_tile = a_packed + ((row0 + r) / kern.rows) * k * kern.rows;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k0 = c * chunk;
      const int64_t kc = std::min(chunk, k - k0);
      kern.fn(a_tile + k0 * kern.rows, tr, b + k0 * kPanel, kc,
              parts.data() + c * chunk_stride + r * kPanel);
    }
  }
  const int64_t col0 = panel * kPanel;
  const int64_t cols = std::min(kPanel, w.n() - col0);
  for (int64_t r = 0; r < rows; ++r) {
    float* row_parts = parts.data() + r * kPanel;
    tree_combine(row_parts, chunk_stride, kPanel, 0, chunks);
    std::copy(row_parts, row_parts + cols, y + (row0 + r) * ldy + col0);
  }
}

}  // namespace

void gemm(const float* x, int64_t m, int64_t lda, const PackedMatrix& w, float* y, int64_t ldy,
          ThreadPool* pool, Isa isa) {
  if (m <= 0 || w.n() == 0) return;
  MILES_CHECK(lda >= w.k() && ldy >= w.n());
  const TileKernel kern = tile_kernel(isa);
  const int64_t row_blocks = (m + kRowBlock - 1) / kRowBlock;
  const int64_t panels = w.num_panels();
  static_assert(kRowBlock % detail::kTileRowsAvx512 == 0 && kRowBlock % detail::kTileRowsAvx2 == 0 &&
                kRowBlock % detail::kTileRowsScalar == 0);
  // Packing only moves values: every output element keeps its fma chain.
  thread_local std::vector<float> a_packed;
  const int64_t tiles = (m + kern.rows - 1) / kern.rows;
  a_packed.resize(static_cast<size_t>(tiles * w.k() * kern.rows));
  pack_rows(x, m, lda, w.k(), kern.rows, a_packed.data());
  const float* ap = a_packed.data();
  // Small products run on the calling thread: waking workers costs more than they save. (Threads never
  // change results, so this is purely a speed choice.)
  constexpr double kMinParallelFlops = 1 << 21;
  ThreadPool* use = 2.0 * m * w.n() * w.k() >= kMinParallelFlops ? pool : nullptr;
  parallel_for(use, row_blocks * panels, [&](int64_t item) {
    thread_local std::vector<float> parts;
    const int64_t rb = item / panels;
    const int64_t row0 = rb * kRowBlock;
    gemm_item(ap, row0, std::min(kRowBlock, m - row0), w, item % panels, y, ldy, kern, parts);
  });
}

int64_t gemm_chunk(int64_t k) {
  if (k <= 0) return kGemmChunk;
  for (const int64_t parts : {8, 4, 2}) {
    const int64_t span = parts * kGemmChunk;
    const int64_t n = parts * ((k + span - 1) / span);  // fewest chunks of <= kGemmChunk, a multiple
    if (k % n == 0) return k / n;
  }
  return kGemmChunk;
}

float gemm_reference_dot(const float* x, const float* w_row, int64_t k, int64_t chunk) {
  return detail::chunked_sum_by(k, chunk > 0 ? chunk : gemm_chunk(k),
                                [&](int64_t i, float acc) { return std::fma(x[i], w_row[i], acc); });
}

}  // namespace miles::kernels
