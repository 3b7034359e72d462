// A tiled GEMM for the device with the contract's bits: a block of kThreads threads computes a tile
// of kTileRows rows × kPanel columns (one weight panel), each thread kSubRows × kSubCols outputs.
// Per K chunk the block stages the chunk of its x rows and of the panel in shared memory; each
// output's chunk partial is the same fma chain from 0 in ascending k as kernels::gemm's, kept per
// thread; after the last chunk each output combines its partials by the halving tree. So the bits
// are GemmKernel's (and the CPU's), with far fewer global loads per FMA.
//
// A block kernel is written as barrier-separated phases: run(phase, block, thread, state, shared)
// for phase 0 .. phases() - 1, all threads of a block finishing a phase before any starts the next.
// The CUDA backend runs the phases in one kernel with __syncthreads() between them; the emulated
// backend runs them block by block, phase by phase, thread by thread — the same semantics, so the
// host suite checks the tiling (staging, indexing, padding) bit for bit.
#pragma once

#include "device/device_math.h"

namespace miles::device {

struct TiledGemmKernel {
  static constexpr int kThreads = 128;
  static constexpr int64_t kPanel = kernels::kPanel;
  static constexpr int64_t kSubRows = 4, kSubCols = 4;
  static constexpr int64_t kColGroups = kPanel / kSubCols;                // 8
  static constexpr int64_t kTileRows = kThreads / kColGroups * kSubRows;  // 64
  static constexpr int64_t kMaxChunk = 128;                               // kGemmChunk
  static constexpr int64_t kMaxChunks = 16;  // longer reductions take GemmKernel

  struct Shared {
    float x[kTileRows][kMaxChunk];
    float w[kMaxChunk][kPanel];
  };
  struct State {
    float parts[kMaxChunks][kSubRows * kSubCols];
  };

  const float* x;
  int64_t lda;
  const float* w;  // packed: num_panels × [K][kPanel]
  int64_t m, n, k, chunk;
  float* y;
  int64_t ldy;

  // Whether a product of this reduction length fits the tiled kernel.
  static bool fits(int64_t k, int64_t chunk) {
    return chunk <= kMaxChunk && (k + chunk - 1) / chunk <= kMaxChunks;
  }
  MILES_HD int64_t chunks() const { return k <= 0 ? 1 : (k + chunk - 1) / chunk; }
  MILES_HD int64_t row_tiles() const { return (m + kTileRows - 1) / kTileRows; }
  int64_t blocks() const { return (n + kPanel - 1) / kPanel * row_tiles(); }
  MILES_HD int phases() const { return static_cast<int>(2 * chunks() + 1); }

  MILES_HD void run(int phase, int64_t block, int t, State& st, Shared& sh) const {
    const int64_t panel = block / row_tiles(), row0 = (block % row_tiles()) * kTileRows;
    const int64_t c = phase / 2;
    if (phase == 2 * chunks()) return finish(panel, row0, t, st);
    const int64_t k0 = c * chunk, len = k0 + chunk < k ? chunk : k - k0;
    if (phase % 2 == 0) {  // stage chunk c: x rows [row0, row0 + kTileRows), the panel's rows
      for (int64_t i = t; i < kTileRows * len; i += kThreads) {
        const int64_t r = i / len, kk = i % len;
        sh.x[r][kk] = row0 + r < m ? x[(row0 + r) * lda + k0 + kk] : 0.0f;
      }
      const float* wp = w + panel * k * kPanel + k0 * kPanel;
      for (int64_t i = t; i < len * kPanel; i += kThreads) sh.w[i / kPanel][i % kPanel] = wp[i];
      return;
    }
    // chunk c's partial of each of this thread's outputs: fma from 0, ascending k
    const int64_t rb = (t / kColGroups) * kSubRows, cb = (t % kColGroups) * kSubCols;
    float acc[kSubRows * kSubCols];
    for (int64_t o = 0; o < kSubRows * kSubCols; ++o) acc[o] = 0.0f;
    for (int64_t kk = 0; kk < len; ++kk) {
      float wv[kSubCols];
      for (int64_t j = 0; j < kSubCols; ++j) wv[j] = sh.w[kk][cb + j];
      for (int64_t r = 0; r < kSubRows; ++r) {
        const float xv = sh.x[rb + r][kk];
        for (int64_t j = 0; j < kSubCols; ++j)
          acc[r * kSubCols + j] = fma_f(xv, wv[j], acc[r * kSubCols + j]);
      }
    }
    for (int64_t o = 0; o < kSubRows * kSubCols; ++o) st.parts[c][o] = acc[o];
  }

 private:
  MILES_HD void finish(int64_t panel, int64_t row0, int t, const State& st) const {
    const int64_t rb = (t / kColGroups) * kSubRows, cb = (t % kColGroups) * kSubCols;
    for (int64_t r = 0; r < kSubRows; ++r)
      for (int64_t j = 0; j < kSubCols; ++j) {
        const int64_t row = row0 + rb + r, col = panel * kPanel + cb + j;
        if (row >= m || col >= n) continue;
        const int64_t o = r * kSubCols + j;
        y[row * ldy + col] = tree_reduce(chunks(), [&st, o](int64_t c) { return st.parts[c][o]; });
      }
  }
};

}  // namespace miles::device
