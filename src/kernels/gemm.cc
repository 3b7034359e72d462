// GEMM driver: y[M, N] = x[M, K] · Wᵀ with the chunked, tree-combined reduction of kernels.h.
//
// Work items are (block of rows) × (panel of kPanel columns); each item computes its outputs
// completely (all K chunks, then the tree), so neither the thread count nor M changes any output's
// bits.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/gemm_tile.h"
#include "kernels/reduce.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"

namespace miles::kernels {
namespace detail {

void chunk_tile_scalar(const float* a_tile, int64_t lda, int rows, const float* b, int64_t kc,
                       const float* left, float* part, const NextPanel&) {
  for (int r = 0; r < rows; ++r) {
    float acc[kPanel] = {};
    for (int64_t k = 0; k < kc; ++k) {
      const float a = a_tile[k * lda + r];
      for (int64_t j = 0; j < kPanel; ++j) acc[j] = std::fma(a, b[k * kPanel + j], acc[j]);
    }
    if (left)
      for (int64_t j = 0; j < kPanel; ++j) acc[j] = left[r * kPanel + j] + acc[j];
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
    case Isa::kAvx512:
      return {detail::chunk_tile_avx512, detail::kTileRowsAvx512};
    case Isa::kAvx2:
      return {detail::chunk_tile_avx2, detail::kTileRowsAvx2};
    case Isa::kScalar:
      break;
  }
  return {detail::chunk_tile_scalar, detail::kTileRowsScalar};
}

// The halving tree over `chunks` chunk partials as a post-order schedule: a leaf step pushes the
// next chunk's partial, a merge step pops the right and the left subtree and pushes left + right.
// Running it while the chunks are produced keeps at most ~log2(chunks) + 1 partials live (hot in
// L1) and gives exactly the bits of the recursive tree (split [lo, hi) at lo + ceil((hi - lo) /
// 2)).
// Steps: 0 leaf (push the next chunk), 1 merge (pop right and left, push left + right), 2 a leaf
// whose merge follows at once (the kernel adds the chunk into its left sibling in place).
enum : int8_t { kLeaf = 0, kMerge = 1, kLeafMerge = 2 };

void tree_schedule(int64_t lo, int64_t hi, std::vector<int8_t>& steps) {
  if (hi - lo == 1) {
    steps.push_back(kLeaf);
    return;
  }
  const int64_t mid = lo + (hi - lo + 1) / 2;
  tree_schedule(lo, mid, steps);
  tree_schedule(mid, hi, steps);
  if (hi - mid == 1) {  // the right subtree is the leaf just pushed: merge it as it is computed
    steps.back() = kLeafMerge;
  } else {
    steps.push_back(kMerge);
  }
}

// out row r = a row r + b row r (rows of kPanel floats in a and b, ldo apart in out; out may be
// a): element-wise, any vector width gives the same bits. The tree's merges in the stack, and the
// last merge of a tile whose output rows take the sum as it is (no trip through the stack).
void add_rows(float* out, int64_t ldo, const float* a, const float* b, int rows) {
  for (int r = 0; r < rows; ++r) {
    float* o = out + r * ldo;
    const float* x = a + r * kPanel;
    const float* z = b + r * kPanel;
    int64_t j = 0;
#if defined(__AVX__)
    for (; j + 8 <= kPanel; j += 8)
      _mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(z + j)));
#endif
    for (; j < kPanel; ++j) o[j] = x[j] + z[j];
  }
}

// Prefetches the cache lines of the cols floats at p into L1.
[[gnu::always_inline]] inline void prefetch_row(const float* p, int64_t cols) {
#if defined(__AVX__)
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = cols * static_cast<int64_t>(sizeof(float));
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(c + b, _MM_HINT_T0);
  _mm_prefetch(c + bytes - 1, _MM_HINT_T0);
#else
  (void)p, (void)cols;
#endif
}

// The rows a tile stores into (its output rows and the rows of the lefts it folds) are in memory,
// not cache: a micro-batch writes a whole gradient (538 MB for SmolLM2), and the LM head's logits
// are 50 MB. Rows [i0, i1) of the tile are prefetched (y's unless y is one of the lefts, and the
// lefts'), a few before each of the tile's chunks, so the lines arrive while it computes. (All of
// them at the tile's start, as demand loads, queues the misses behind each other: the weight
// gradients ran 5–10 % slower in the harness.) Always inlined: GCC finds a function of prefetches
// alone free of side effects and drops its calls. Never changes a result.
[[gnu::always_inline]] inline void prefetch_rows(const float* y, int64_t ldy, GemmLefts lefts,
                                                 int64_t row, int64_t i0, int64_t i1, int64_t col0,
                                                 int64_t cols) {
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t offset = (row + i) * ldy + col0;
    if (y) prefetch_row(y + offset, cols);
    for (const float* l : lefts) prefetch_row(l + offset, cols);
  }
}

// One output row of a panel (a library memmove call per 32 floats costs more than the copy),
// folded into the lefts at the same offset (gemm_xt's contract) when there are any.
void store_row(const float* src, int64_t cols, float* dst, GemmLefts lefts, int64_t offset) {
  if (lefts.empty()) {
#if defined(__AVX__)
    if (cols == kPanel) {
      static_assert(kPanel % 8 == 0);
      for (int64_t j = 0; j < kPanel; j += 8) _mm256_storeu_ps(dst + j, _mm256_loadu_ps(src + j));
      return;
    }
#endif
    std::copy_n(src, cols, dst);
    return;
  }
  int64_t j = 0;
#if defined(__AVX__)
  for (; j + 8 <= cols; j += 8) {  // element-wise adds: any vector width gives the same bits
    __m256 v = _mm256_loadu_ps(src + j);
    for (const float* l : lefts) v = _mm256_add_ps(_mm256_loadu_ps(l + offset + j), v);
    _mm256_storeu_ps(dst + j, v);
  }
#endif
  for (; j < cols; ++j) {
    float v = src[j];
    for (const float* l : lefts) v = l[offset + j] + v;
    dst[j] = v;
  }
}

// x packed as tiles of kern.rows rows: tile t holds [K][kern.rows] (rows past M are zero). Tiles
// [t0, t1) of them, tile t0 at out.
void pack_rows(const float* x, int64_t m, int64_t lda, int64_t k, int tile_rows, int64_t t0,
               int64_t t1, float* out) {
  for (int64_t t = t0; t < t1; ++t) {
    float* dst = out + (t - t0) * k * tile_rows;
    int r = 0;
#if defined(__AVX__)
    // The tile's whole groups of 4 rows: 4 × 4 blocks transposed in registers, every group for one
    // k block before the next k block, so that a k block's floats are written as one run.
    const int whole =
        static_cast<int>(std::clamp<int64_t>(m - t * tile_rows, 0, tile_rows)) / 4 * 4;
    const float* s0 = x + t * tile_rows * lda;
    int64_t k0 = 0;
    for (; k0 + 4 <= k && whole > 0; k0 += 4) {
      for (int g = 0; g < whole; g += 4) {
        const float* s = s0 + g * lda + k0;
        __m128 a = _mm_loadu_ps(s), b = _mm_loadu_ps(s + lda);
        __m128 c = _mm_loadu_ps(s + 2 * lda), d = _mm_loadu_ps(s + 3 * lda);
        _MM_TRANSPOSE4_PS(a, b, c, d);
        float* o = dst + k0 * tile_rows + g;
        _mm_storeu_ps(o, a);
        _mm_storeu_ps(o + tile_rows, b);
        _mm_storeu_ps(o + 2 * tile_rows, c);
        _mm_storeu_ps(o + 3 * tile_rows, d);
      }
    }
    for (; k0 < k; ++k0)
      for (int i = 0; i < whole; ++i) dst[k0 * tile_rows + i] = s0[i * lda + k0];
    r = whole;
#endif
    for (; r < tile_rows; ++r) {
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

// pack_rows for an x given transposed: element (row, kk) at xt[kk * ldt + row]. Every tile is a
// straight copy of tile_rows consecutive floats per kk (rows past M are zero). Tiles go 16 at a
// time, kk outermost: each kk reads the group's columns as one contiguous run of its row. (A tile
// at a time reads a few floats of each of k rows whose stride maps them to a few cache sets: the
// next tile finds none of those lines left.)
void pack_cols(const float* xt, int64_t m, int64_t ldt, int64_t k, int tile_rows, int64_t t0,
               int64_t t1, float* out) {
  constexpr int64_t group = 16;
  for (int64_t g0 = t0; g0 < t1; g0 += group) {
    const int64_t g1 = std::min(t1, g0 + group);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* row = xt + kk * ldt;
      for (int64_t t = g0; t < g1; ++t) {
        const int64_t row0 = t * tile_rows, w = std::min<int64_t>(tile_rows, m - row0);
        const float* src = row + row0;
        float* d = out + ((t - t0) * k + kk) * tile_rows;
        int64_t i = 0;  // a few floats per tile: inline copies, not a library call each
#if defined(__AVX__)
        for (; i + 8 <= w; i += 8) _mm256_storeu_ps(d + i, _mm256_loadu_ps(src + i));
        for (; i + 4 <= w; i += 4) _mm_storeu_ps(d + i, _mm_loadu_ps(src + i));
#endif
        for (; i < w; ++i) d[i] = src[i];
        for (; i < tile_rows; ++i) d[i] = 0.0f;
      }
    }
  }
}

// Where a tile's rows come from: packed k-major ([k][tile rows] per tile), tile t at
// packed + (t - tile0) * k * tile rows.
struct ATiles {
  const float* packed;
  int64_t tile0;
  int64_t lda;  // the tiles' k stride: the tile height, or a lone row's own stride (not packed)
};

// This core's L2 in bytes (512 KB, a Zen 2's, where the system does not say).
int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return b > 0 ? static_cast<int64_t>(b) : int64_t{512} << 10;
  }();
  return bytes;
}

// How an item walks its (tile, panel) pairs. Each pair runs the whole schedule on a stack of its
// own, so any interleaving of the pairs gives the same bits; the interleaving only decides what
// stays in cache. The schedule is cut into segments of `leaves` chunks (with the merges that
// follow the last): a segment runs for every pair, panel by panel and tile by tile, before the next
// segment starts. One segment of all the chunks is the plain order (each tile finishes its panel
// before the next: its stack stays in L1); short segments keep one panel's chunk in L1 for all the
// item's tiles and one tile's chunk for all its panels (long K: a whole panel, or the rows of all
// the panels, would stream from memory once per tile and per panel).
struct ItemPlan {
  int64_t rows;    // rows per item (a multiple of every tile height)
  int64_t panels;  // panels per item
  int64_t leaves;  // chunks per segment
  bool prefetch_next = false;  // the plain order, the next panel's lines prefetched (NextPanel)
};

struct ItemScratch {
  std::vector<float> stack;  // [pair][depth][tile rows][kPanel]
  std::vector<int64_t> top;  // per pair: stack height
};

void gemm_item(const ATiles& a, int64_t row0, int64_t rows, const PackedMatrix& w, int64_t panel0,
               int64_t panels, const ItemPlan& plan, float* y, int64_t ldy, GemmLefts lefts,
               TileKernel kern, ItemScratch& scratch) {
  const int64_t k = w.k(), chunk = w.chunk();
  const int64_t chunks = std::max<int64_t>(1, (k + chunk - 1) / chunk);
  thread_local std::vector<int8_t> steps;
  thread_local int64_t steps_for = -1;
  if (steps_for != chunks) {
    steps.clear();
    tree_schedule(0, chunks, steps);
    steps_for = chunks;
  }
  const int64_t slot = kern.rows * kPanel;  // one partial: [tile rows][kPanel]
  int64_t depth = 2;  // the schedule never holds more than ceil(log2(chunks)) + 1 partials
  for (int64_t x = 1; x < chunks; x <<= 1) ++depth;
  const int64_t tiles = (rows + kern.rows - 1) / kern.rows;
  // In the plain order each pair runs its whole schedule before the next starts: one stack serves
  // them all (a stack per pair would walk megabytes for an LM head's item of many panels).
  const int64_t leaves = plan.leaves;
  const bool plain = leaves >= chunks;
  const int64_t stacks = plain ? 1 : tiles * panels;
  if (scratch.stack.size() < static_cast<size_t>(stacks * depth * slot))  // grows only
    scratch.stack.resize(stacks * depth * slot);
  scratch.top.assign(stacks, 0);
  // The next panel's lines over the k steps of all the tiles of this one (NextPanel): only in the
  // plain order, where tile ti's chunks are its k steps ti·K .. ti·K + K − 1 of the panel.
  const bool prefetch_next = plan.prefetch_next && plain && tiles > 1;
  // A segment's chunks of a panel that fit in half of L2 are there for the item's later tiles of
  // the panel (its first tile just read them): only the first prefetches the panel's k rows.
  const bool later_tiles_cached =
      std::min(leaves, chunks) * chunk * kPanel * static_cast<int64_t>(sizeof(float)) <=
      l2_bytes() / 2;
  constexpr int64_t kLinesPerK = kPanel * static_cast<int64_t>(sizeof(float)) / 64;
  // Rows whose lines prefetch_rows fetches: y's, unless y is one of the lefts (the fold's last).
  const float* const y_fetch =
      std::find(lefts.begin(), lefts.end(), y) == lefts.end() ? y : nullptr;
  const bool tree_ends_in_merge = steps.back() == kMerge;
  // Steps [s0, s1) of the schedule for tile ti of panel panel0 + pi; c0: the chunk of step s0.
  const auto run = [&](int64_t ti, int64_t pi, size_t s0, size_t s1, int64_t c0) {
    const int64_t panel = panel0 + pi, r = ti * kern.rows;
    const int tr = static_cast<int>(std::min<int64_t>(kern.rows, rows - r));
    const int64_t t = (row0 + r) / kern.rows;
    const float* a_tile = a.packed + (t - a.tile0) * k * a.lda;
    const int64_t lda = a.lda;
    const float* b = w.panel(panel);
    const int64_t col0 = panel * kPanel;
    const int64_t cols = std::min(kPanel, w.n() - col0);
    const int64_t pair = plain ? 0 : ti * panels + pi;
    float* const stack = scratch.stack.data() + pair * depth * slot;
    int64_t& top = scratch.top[pair];
    if (plain) top = 0;
    detail::NextPanel np;
    np.ahead = ti == 0 || !later_tiles_cached;
    if (prefetch_next && panel + 1 < w.num_panels()) {
      np.next = reinterpret_cast<const char*>(w.panel(panel + 1));
      np.rate = (kLinesPerK << 16) / tiles;
    }
    // A whole panel with nothing to fold whose tree ends in a merge: that merge writes the output
    // rows. (A last merge inside the kernel writing them measured slower than the copy from the
    // stack, in the weight gradients: there the stack stays.)
    const bool to_output = lefts.empty() && cols == kPanel && tree_ends_in_merge;
    const int64_t per_chunk = (tr + chunks - 1) / chunks;  // rows prefetched before each chunk
    int64_t c = c0;
    for (size_t s = s0; s < s1; ++s) {
      if (steps[s] != kMerge) {
        if (c * per_chunk < tr)
          prefetch_rows(y_fetch, ldy, lefts, row0 + r, c * per_chunk,
                        std::min<int64_t>(tr, (c + 1) * per_chunk), col0, cols);
        const int64_t k0 = c * chunk;
        float* left = steps[s] == kLeafMerge ? stack + (top - 1) * slot : nullptr;
        np.step0 = ti * k + k0;
        kern.fn(a_tile + k0 * lda, lda, tr, b + k0 * kPanel, std::min(chunk, k - k0), left,
                left ? left : stack + top * slot, np);
        if (!left) ++top;
        ++c;
      } else {
        --top;
        float* left = stack + (top - 1) * slot;
        const bool out = to_output && s + 1 == steps.size();
        add_rows(out ? y + (row0 + r) * ldy + col0 : left, out ? ldy : kPanel, left,
                 stack + top * slot, tr);
      }
    }
    if (s1 < steps.size() || to_output) return;
    for (int i = 0; i < tr; ++i) {
      const int64_t offset = (row0 + r + i) * ldy + col0;
      store_row(stack + i * kPanel, cols, y + offset, lefts, offset);
    }
  };
  size_t s0 = 0;
  int64_t c0 = 0;
  while (s0 < steps.size()) {
    size_t s1 = s0;
    int64_t n = 0;  // leaves in the segment
    while (s1 < steps.size() && (n < leaves || steps[s1] == kMerge)) {
      if (steps[s1] != kMerge) ++n;
      ++s1;
    }
    for (int64_t pi = 0; pi < panels; ++pi)
      for (int64_t ti = 0; ti < tiles; ++ti) run(ti, pi, s0, s1, c0);
    s0 = s1;
    c0 += n;
  }
}

constexpr int64_t kLongK = 4096;  // K past which a panel (K × 32 floats) outgrows a Zen 2 L2
constexpr int64_t kStreamRows = 4 * kRowBlock;  // the most rows an item streaming panels takes

// Rows per item when the items stream panels: as many as keep the item's packed rows (rows × K
// floats) within half of L2, beside the panel they read, in whole row blocks, at most kStreamRows.
int64_t stream_rows(int64_t k) {
  const int64_t fit = l2_bytes() / 2 / (k * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(fit / kRowBlock * kRowBlock, kRowBlock, kStreamRows);
}

// The work of the thread that finishes last when busy.size() threads claim the items of `rows` rows
// × `run` panels in order, each taking the next as it finishes one (the pool's order, at one
// speed), in row × panel units. Items in the driver's order (panel_major: gemm_driver's).
// busy: one slot per thread (overwritten).
int64_t claimed_span(int64_t m, int64_t rows, int64_t panels, int64_t run, bool panel_major,
                     std::vector<int64_t>& busy) {
  std::fill(busy.begin(), busy.end(), 0);
  const int64_t row_items = (m + rows - 1) / rows, panel_items = (panels + run - 1) / run;
  for (int64_t item = 0; item < row_items * panel_items; ++item) {
    const int64_t rb = panel_major ? item % row_items : item / panel_items;
    const int64_t pb = panel_major ? item / row_items : item % panel_items;
    *std::min_element(busy.begin(), busy.end()) +=
        std::min(rows, m - rb * rows) * std::min(run, panels - pb * run);
  }
  return *std::max_element(busy.begin(), busy.end());
}

// Panels per item, at most `most`: the longest run whose items the threads finish together as
// early as any run's. The longest run alone can leave a thread a whole item behind: 18 panels in
// items of 4 are 10 for one thread and 8 for the other, in items of 3 nine each (a decode step of
// 32 rows, a 64-token prefill: `o` and `down`).
int64_t balanced_run(int64_t m, int64_t rows, int64_t panels, int64_t most, int threads,
                     bool panel_major) {
  std::vector<int64_t> busy(static_cast<size_t>(threads));
  int64_t best = most, span = claimed_span(m, rows, panels, most, panel_major, busy);
  for (int64_t run = most - 1; run >= 1; --run) {
    const int64_t s = claimed_span(m, rows, panels, run, panel_major, busy);
    if (s < span) best = run, span = s;
  }
  return best;
}

// Short K (a panel fits L2), packed up front, one tile of rows: items of one panel in the plain
// order. Packed up front, more rows than one tile (a decode step of a batch, a verify, a prefill, a
// training forward): the panels stream from memory, and each panel's tiles prefetch the next one
// (NextPanel). Items of up to stream_rows(K) rows × a run of panels, about two items per thread
// and row block (one per thread ran best on an idle VM, but leaves a thread that the machine holds
// up with no one to take its share). Against items of 48 rows × one panel (AVX-512, 2 threads):
// 32 rows × 576 × 576 124 → 107 µs, 255 rows 728 → 639 µs, the LM head's 255 rows 60 → 51 ms.
// Long K (an LM head's d-input reduces over the 49,152-token vocabulary: a 6 MB panel per 32
// columns): items of 96 rows × 3 panels in segments of 4 chunks, so that a panel's chunk serves 16
// AVX2 tiles from L1 and a tile's chunk 3 panels, instead of every tile streaming its panel and
// every panel the whole packed d logits from memory (Zen 2, 255 rows: 58 → 68 % of the FMA peak on
// 2 threads, 61 → 71 % on one). Operands packed per item (gemm_xt): a row block × as many panels
// as leave about four items per thread.
ItemPlan item_plan(const PackedMatrix& w, int64_t m, int tile_rows, int threads,
                   bool pack_per_item) {
  const int64_t chunks = std::max<int64_t>(1, (w.k() + w.chunk() - 1) / w.chunk());
  if (w.k() > kLongK) return {2 * kRowBlock, 3, 4};
  if (!pack_per_item && m > tile_rows) {
    const int64_t rows = std::min(stream_rows(w.k()), (m + kRowBlock - 1) / kRowBlock * kRowBlock);
    const int64_t row_items = (m + rows - 1) / rows;
    const int64_t most = std::max<int64_t>(1, w.num_panels() / (2 * threads * row_items));
    return {rows, balanced_run(m, rows, w.num_panels(), most, threads, m < w.n()), chunks,
            /*prefetch_next=*/true};
  }
  if (!pack_per_item) return {kRowBlock, 1, chunks};
  const int64_t panels = w.num_panels(), row_items = (m + kRowBlock - 1) / kRowBlock;
  const int64_t groups = std::clamp<int64_t>((4 * threads + row_items - 1) / row_items, 1, panels);
  return {kRowBlock, (panels + groups - 1) / groups, chunks};
}

// The driver after the operand's layout is known: pack(t0, t1, out) writes tiles [t0, t1) of the
// M rows (pack_rows or pack_cols) at out, then the (row block, panel group) items run. The rows
// are packed once up front, or with pack_per_item (and a short K) by each item for itself into
// its thread's buffer: a weight gradient's d yᵀ packed up front by both threads and read by both
// ran its 2-thread GEMMs at 110-120 GFLOP/s against 135-155 packed per item (Zen 2; one thread:
// 71-78 against 76-83).
// One row (a decode step's GEMV) is not packed: the kernels read row r at k from a[k * lda + r],
// so the row itself, at its k stride `lone_lda` (1 for x, ldt for a transposed x), is its tile.
template <typename Pack>
void gemm_driver(int64_t m, const PackedMatrix& w, float* y, int64_t ldy, GemmLefts lefts,
                 ThreadPool* pool, Isa isa, Pack pack, bool pack_per_item, const float* lone_row,
                 int64_t lone_lda) {
  const TileKernel kern = tile_kernel(isa);
  const int64_t panels = w.num_panels();
  static_assert(kRowBlock % detail::kTileRowsAvx512 == 0 &&
                kRowBlock % detail::kTileRowsAvx2 == 0 && kRowBlock % detail::kTileRowsScalar == 0);
  const int64_t tiles = (m + kern.rows - 1) / kern.rows;
  // Small products run on the calling thread: waking workers costs more than they save — unless the
  // weights are large enough that streaming them from memory (a decode step's GEMV) is what takes
  // the time. (Threads never change results, so this is purely a speed choice.)
  constexpr double kMinParallelFlops = 1 << 21;
  constexpr int64_t kMinParallelWeights = 1 << 17;  // floats: 512 KB
  const bool big =
      2.0 * m * w.n() * w.k() >= kMinParallelFlops || w.n() * w.k() >= kMinParallelWeights;
  ThreadPool* use = big ? pool : nullptr;
  const int threads = use ? use->num_threads() : 1;
  // (Packed, as before, when y overlaps the row: an in-place product reads the row as it was.)
  const auto at = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
  const bool lone = m == 1 && (at(lone_row + (w.k() - 1) * lone_lda + 1) <= at(y) ||
                               at(y + w.n()) <= at(lone_row));
  const bool per_item = pack_per_item && w.k() <= kLongK && !lone;
  // Packing only moves values: every output element keeps its fma chain. Buffers grow only:
  // shrinking and growing back would zero-fill what packing overwrites anyway.
  thread_local std::vector<float> a_packed;
  if (!per_item && !lone) {
    if (a_packed.size() < static_cast<size_t>(tiles * w.k() * kern.rows))
      a_packed.resize(tiles * w.k() * kern.rows);
    float* const packed = a_packed.data();  // this thread's buffer (a_packed is thread_local)
    parallel_ranges(use, tiles, w.k() * kern.rows, [&](int64_t t0, int64_t t1) {
      pack(kern.rows, t0, t1, packed + t0 * w.k() * kern.rows);
    });
  }
  const float* const packed_all = a_packed.data();
  // Consecutive items share an operand that stays in cache while the other one streams past:
  // the row block (row-major order) or the weight panel (panel-major). Re-reading the smaller
  // operand is cheaper: panel-major when x has fewer rows than W (a training micro-batch against
  // the LM head: 256 rows against 49152). Items are independent, so the order never changes bits.
  const bool panel_major = m < w.n() && !per_item;
  const ItemPlan plan = item_plan(w, m, kern.rows, threads, per_item);
  const int64_t row_items = (m + plan.rows - 1) / plan.rows;
  const int64_t panel_items = (panels + plan.panels - 1) / plan.panels;
  parallel_for(use, row_items * panel_items, [&](int64_t item) {
    thread_local ItemScratch scratch;
    thread_local std::vector<float> own;  // the item's tiles, packed per item
    const int64_t rb = panel_major ? item % row_items : item / panel_items;
    const int64_t pb = panel_major ? item / row_items : item % panel_items;
    const int64_t row0 = rb * plan.rows, panel0 = pb * plan.panels;
    const int64_t rows = std::min(plan.rows, m - row0);
    ATiles a = lone ? ATiles{lone_row, 0, lone_lda} : ATiles{packed_all, 0, kern.rows};
    if (per_item) {
      const int64_t t0 = row0 / kern.rows, t1 = (row0 + rows + kern.rows - 1) / kern.rows;
      if (own.size() < static_cast<size_t>((t1 - t0) * w.k() * kern.rows))
        own.resize((t1 - t0) * w.k() * kern.rows);
      pack(kern.rows, t0, t1, own.data());
      a = {own.data(), t0, kern.rows};
    }
    gemm_item(a, row0, rows, w, panel0, std::min(plan.panels, panels - panel0), plan, y, ldy, lefts,
              kern, scratch);
  });
}

}  // namespace

void gemm(const float* x, int64_t m, int64_t lda, const PackedMatrix& w, float* y, int64_t ldy,
          ThreadPool* pool, Isa isa) {
  if (m <= 0 || w.n() == 0) return;
  MILES_CHECK(lda >= w.k() && ldy >= w.n());
  gemm_driver(
      m, w, y, ldy, {}, pool, isa,
      [&](int rows, int64_t t0, int64_t t1, float* out) {
        pack_rows(x, m, lda, w.k(), rows, t0, t1, out);
      },
      /*pack_per_item=*/false, x, 1);
}

void gemm_xt(const float* xt, int64_t m, int64_t ldt, const PackedMatrix& w, float* y, int64_t ldy,
             ThreadPool* pool, Isa isa, GemmLefts lefts) {
  if (m <= 0 || w.n() == 0) return;
  MILES_CHECK(ldt >= m && ldy >= w.n());
  gemm_driver(
      m, w, y, ldy, lefts, pool, isa,
      [&](int rows, int64_t t0, int64_t t1, float* out) {
        pack_cols(xt, m, ldt, w.k(), rows, t0, t1, out);
      },
      /*pack_per_item=*/true, xt, ldt);
}

int64_t gemm_chunk(int64_t k) {
  if (k <= 0) return kGemmChunk;
  for (const int64_t parts : {8, 4, 2}) {
    const int64_t span = parts * kGemmChunk;
    const int64_t n =
        parts * ((k + span - 1) / span);  // fewest chunks of <= kGemmChunk, a multiple
    if (k % n == 0) return k / n;
  }
  return kGemmChunk;
}

float gemm_reference_dot(const float* x, const float* w_row, int64_t k, int64_t chunk) {
  return detail::chunked_sum_by(k, chunk > 0 ? chunk : gemm_chunk(k), [&](int64_t i, float acc) {
    return std::fma(x[i], w_row[i], acc);
  });
}

}  // namespace miles::kernels
