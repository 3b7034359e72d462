// PackedMatrix: W [N, K] rearranged into k-major panels of kPanel output columns for the
// micro-kernels.
#include <algorithm>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "miles/kernels.h"
#include "miles/thread_pool.h"

namespace miles::kernels {

namespace {

#if defined(__AVX__)
// d[j * ldd + i] = s[i * lds + j] for i, j < 8: an 8 × 8 block transposed in registers.
inline void transpose8(const float* s, int64_t lds, float* d, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(d + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(d + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// Rows [n0, n0 + lanes) of a row-major f32 [rows, k] source into the packed layout (n0 a multiple
// of 8, lanes 8 or kPanel, inside one panel), 8 × 8 blocks at a time: for each block of 8 k, the
// lanes' blocks one after another, so that a whole panel's 8 × kPanel floats of that block are
// written together (one contiguous run of whole cache lines). Returns false (nothing written)
// where that does not apply.
bool scatter_lanes(LargeVector<float>& data, int64_t k, int64_t n0, int64_t lanes,
                   const float* src) {
#if defined(__AVX__)
  if (n0 % 8 != 0 || n0 % kPanel + lanes > kPanel) return false;
  float* panel = data.data() + (n0 / kPanel) * k * kPanel + (n0 % kPanel);
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8)
    for (int64_t g = 0; g < lanes; g += 8)
      transpose8(src + g * k + kk, k, panel + kk * kPanel + g, kPanel);
  for (; kk < k; ++kk)
    for (int64_t i = 0; i < lanes; ++i) panel[kk * kPanel + i] = src[i * k + kk];
  return true;
#else
  (void)data, (void)k, (void)n0, (void)lanes, (void)src;
  return false;
#endif
}

// Copies rows [row0, row0 + rows) of a row-major [rows, k] source into the packed layout at row
// `dst_row`.
template <typename Load>
void scatter_rows(LargeVector<float>& data, int64_t k, int64_t dst_row, int64_t rows, Load load) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = dst_row + r;
    float* panel = data.data() + (n / kPanel) * k * kPanel + (n % kPanel);
    for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanel] = load(r, kk);
  }
}

// Rows of a row-major f32 [rows, k] source: whole panels, then groups of eight lanes by transposed
// blocks, the rest row by row.
void scatter_f32(LargeVector<float>& data, int64_t k, int64_t dst_row, int64_t rows,
                 const float* p) {
  int64_t r = 0;
  while (r + kPanel <= rows && scatter_lanes(data, k, dst_row + r, kPanel, p + r * k)) r += kPanel;
  while (r + 8 <= rows && scatter_lanes(data, k, dst_row + r, 8, p + r * k)) r += 8;
  scatter_rows(data, k, dst_row + r, rows - r,
               [&](int64_t i, int64_t kk) { return p[(r + i) * k + kk]; });
}

void scatter_tensor(LargeVector<float>& data, int64_t k, int64_t dst_row, const Tensor& w) {
  const int64_t rows = w.dim(0);
  switch (w.dtype()) {
    case DType::kF32:
      scatter_f32(data, k, dst_row, rows, w.data<float>());
      break;
    case DType::kBF16: {
      const uint16_t* p = w.data<uint16_t>();
      scatter_rows(data, k, dst_row, rows,
                   [&](int64_t r, int64_t kk) { return bf16_to_f32(p[r * k + kk]); });
      break;
    }
    case DType::kF16: {
      const uint16_t* p = w.data<uint16_t>();
      scatter_rows(data, k, dst_row, rows,
                   [&](int64_t r, int64_t kk) { return f16_to_f32(p[r * k + kk]); });
      break;
    }
    default:
      MILES_CHECK(false, "PackedMatrix needs an f32, bf16 or f16 matrix");
  }
}
}  // namespace

void PackedMatrix::reshape(int64_t n, int64_t k) {
  n_ = n;
  k_ = k;
  chunk_ = 0;
  data_.resize(static_cast<size_t>(num_panels() * k_ * kPanel));
}

void PackedMatrix::reshape_for(const std::vector<const Tensor*>& parts) {
  MILES_CHECK(!parts.empty());
  const int64_t k = parts[0]->dim(1);
  int64_t n = 0;
  for (const Tensor* t : parts) {
    MILES_CHECK(t->ndim() == 2 && t->dim(1) == k, "stacked matrices must share K");
    n += t->dim(0);
  }
  reshape(n, k);
}

void PackedMatrix::assign_rows(const std::vector<const Tensor*>& parts) {
  // Every lane of rows < n_ is written by the scatter; only the last panel's lanes past n_ are
  // zeroed (no fill of the whole matrix before it is overwritten).
  reshape_for(parts);
  int64_t row = 0;
  for (const Tensor* t : parts) {
    scatter_tensor(data_, k_, row, *t);
    row += t->dim(0);
  }
  zero_padding_lanes();
}

void PackedMatrix::assign_rows(const std::vector<const Tensor*>& parts, PackedMatrix& t) {
  MILES_CHECK(&t != this && !parts.empty());
  const bool f32 = std::all_of(parts.begin(), parts.end(),
                               [](const Tensor* p) { return p->dtype() == DType::kF32; });
  if (!f32 || parts[0]->dim(1) % kPanel != 0) {
    assign_rows(parts);
    transpose_into(t);
    return;
  }
  reshape_for(parts);
  t.reshape(k_, n_);  // K % kPanel == 0: every lane of t is written below
  // Blocks of rows up to the next panel boundary: each block is scattered into this matrix, then,
  // still in cache, copied into t, where row n of W is t's row n in every panel (panel op holds
  // W[n, op·kPanel …] at n·kPanel).
  int64_t row = 0;
  for (const Tensor* part : parts) {
    const float* src = part->data<float>();
    const int64_t rows = part->dim(0);
    for (int64_t r = 0; r < rows;) {
      const int64_t block = std::min(rows - r, kPanel - (row + r) % kPanel);
      scatter_f32(data_, k_, row + r, block, src + r * k_);
      for (int64_t i = r; i < r + block; ++i) {
        float* dst = t.data_.data() + (row + i) * kPanel;
        for (int64_t op = 0; op < t.num_panels(); ++op)
          std::memcpy(dst + op * t.k_ * kPanel, src + i * k_ + op * kPanel, kPanel * sizeof(float));
      }
      r += block;
    }
    row += rows;
  }
  zero_padding_lanes();
}

void PackedMatrix::zero_padding_lanes() {
  const int64_t used = n_ - (num_panels() - 1) * kPanel;  // lanes of the last panel in use
  if (n_ == 0 || used == kPanel) return;
  float* last = data_.data() + (num_panels() - 1) * k_ * kPanel;
  for (int64_t kk = 0; kk < k_; ++kk)
    std::fill(last + kk * kPanel + used, last + (kk + 1) * kPanel, 0.0f);
}

PackedMatrix PackedMatrix::pack_rows(const std::vector<const Tensor*>& parts) {
  PackedMatrix m;
  m.assign_rows(parts);
  return m;
}

PackedMatrix PackedMatrix::pack(const Tensor& w) { return pack_rows({&w}); }

PackedMatrix PackedMatrix::pack_f32(const float* w, int64_t n, int64_t k) {
  return pack(Tensor::view(DType::kF32, {n, k}, w, nullptr));
}

void PackedMatrix::set_chunk(int64_t chunk) {
  MILES_CHECK(chunk > 0, "a GEMM chunk is at least one K position");
  chunk_ = chunk;
}

std::vector<float> PackedMatrix::unpack_row(int64_t row) const {
  MILES_CHECK(row >= 0 && row < n_);
  std::vector<float> out(static_cast<size_t>(k_));
  const float* p = panel(row / kPanel) + (row % kPanel);
  for (int64_t kk = 0; kk < k_; ++kk) out[kk] = p[kk * kPanel];
  return out;
}

void PackedMatrix::transpose_into(PackedMatrix& t) const {
  MILES_CHECK(&t != this);
  t.reshape(k_, n_);  // all lanes < t.n_ written
  // kPanel × kPanel tiles: input panel ip holds columns n = ip·kPanel + a, output panel op holds
  // rows kk = op·kPanel + b; element (n, kk) goes to t's panel op, row n, lane b.
  for (int64_t ip = 0; ip < num_panels(); ++ip) {
    const int64_t nw = std::min(kPanel, n_ - ip * kPanel);
    const float* src = panel(ip);
    for (int64_t op = 0; op < t.num_panels(); ++op) {
      const int64_t kw = std::min(kPanel, k_ - op * kPanel);
      float* dst = t.data_.data() + op * t.k_ * kPanel + ip * kPanel * kPanel;
#if defined(__AVX__)
      if (nw == kPanel && kw == kPanel) {  // a whole tile: 8 × 8 blocks in registers
        for (int64_t b = 0; b < kPanel; b += 8)
          for (int64_t a = 0; a < kPanel; a += 8)
            transpose8(src + (op * kPanel + b) * kPanel + a, kPanel, dst + a * kPanel + b, kPanel);
        continue;
      }
#endif
      for (int64_t a = 0; a < nw; ++a)
        for (int64_t b = 0; b < kw; ++b) dst[a * kPanel + b] = src[(op * kPanel + b) * kPanel + a];
    }
  }
  t.zero_padding_lanes();
}

void PackedMatrix::assign_transposed(const float* a, int64_t rows, int64_t cols, int64_t lda,
                                     ThreadPool* pool) {
  n_ = cols;
  k_ = rows;
  chunk_ = 0;
  // Every element is written below; the buffer only grows (a growth would zero-fill first).
  const size_t need = static_cast<size_t>(num_panels() * k_ * kPanel);
  if (data_.size() < need) data_.resize(need);
  parallel_for(pool, num_panels(), [&](int64_t p) {
    const int64_t c0 = p * kPanel, width = std::min(kPanel, cols - c0);
    float* dst = data_.data() + p * rows * kPanel;
    if (width == kPanel) {  // a fixed-size copy the compiler inlines, not a library call per row
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * kPanel, a + r * lda + c0, kPanel * sizeof(float));
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(a + r * lda + c0, width, dst + r * kPanel);
      std::fill(dst + r * kPanel + width, dst + (r + 1) * kPanel, 0.0f);
    }
  });
}

}  // namespace miles::kernels
