// Kernel tests: each kernel against a scalar reference of the numerics contract, every instruction
// set bit-identical, and batch invariance: a row alone, inside a batch of 64 at any position, and
// under any thread count gives identical bits.
#include "miles/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/exp.h"
#include "kernels/reduce.h"
#include "miles/backward_kernels.h"
#include "miles/comm.h"
#include "miles/logprob.h"
#include "miles/thread_pool.h"
#include "random_vec.h"

namespace miles::kernels {
namespace {

using test::normal_vec;

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

std::vector<Isa> available_isas() {
  std::vector<Isa> out = {Isa::kScalar};
  if (static_cast<int>(detect_isa()) >= static_cast<int>(Isa::kAvx2)) out.push_back(Isa::kAvx2);
  if (detect_isa() == Isa::kAvx512) out.push_back(Isa::kAvx512);
  return out;
}

// y = x·Wᵀ for x [m, k] and W [n, k], each element by gemm_reference_dot (the contract).
std::vector<float> reference_product(const std::vector<float>& x, int64_t m,
                                     const std::vector<float>& w, int64_t n, int64_t k) {
  std::vector<float> y(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      y[i * n + j] = gemm_reference_dot(x.data() + i * k, w.data() + j * k, k);
  return y;
}

// m = 1 and 2: the AVX2 kernel's full-width tiles (a decode step's GEMV); 13: full tiles and a tail
// on every ISA.
TEST(Gemm, MatchesReferenceDotBitwiseOnEveryIsa) {
  for (int64_t k : {1, 7, 64, 128, 129, 300, 1024}) {
    for (int64_t n : {1, 31, 32, 33, 100})
      for (const int64_t m : {1, 2, 13}) {
        auto x = normal_vec(m * k, 1 + k);
        auto w = normal_vec(n * k, 2 + n);
        PackedMatrix pw = PackedMatrix::pack_f32(w.data(), n, k);
        for (Isa isa : available_isas()) {
          std::vector<float> y(m * n);
          gemm(x.data(), m, k, pw, y.data(), n, nullptr, isa);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              const float ref = gemm_reference_dot(x.data() + i * k, w.data() + j * k, k);
              ASSERT_EQ(std::memcmp(&ref, &y[i * n + j], 4), 0)
                  << "isa " << isa_name(isa) << " rows " << m << ": m=" << i << " n=" << j
                  << " k=" << k;
            }
        }
      }
  }
}

// A reduction longer than a panel's share of L2 (an LM head's d-input over the vocabulary) runs
// items of several tiles × several panels in segments of chunks: every output keeps the contract's
// bits, with partial tiles, panel groups and row items, on one thread and on pools.
TEST(Gemm, LongReductionsInPanelGroupsMatchTheReferenceDotOnEveryIsa) {
  const int64_t k = 5000, m = 101, n = 133;  // 2 row items, 5 panels: groups of 3 and 2
  const auto x = normal_vec(m * k, 3), w = normal_vec(n * k, 4);
  const PackedMatrix pw = PackedMatrix::pack_f32(w.data(), n, k);
  const std::vector<float> want = reference_product(x, m, w, n, k);
  ThreadPool pool2(2), pool3(3);
  for (Isa isa : available_isas())
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
      std::vector<float> y(m * n, 7.0f);
      gemm(x.data(), m, k, pw, y.data(), n, pool, isa);
      EXPECT_TRUE(same_bits(y.data(), want.data(), want.size())) << isa_name(isa);
    }
}

// Rows in more than one tile, packed up front (a batch's decode step, a verify, a prefill) run as
// items of up to 192 rows × a run of panels, each panel's tiles prefetching the next panel: the
// contract's bits for every row count around the tile and item edges, several row items, a
// partial last panel, on one thread and on pools whose items split the panels unevenly.
TEST(Gemm, StreamingRowsInPanelRunsMatchTheReferenceDotOnEveryIsa) {
  const int64_t k = 300, n = 330;  // 11 panels, the last 10 columns wide
  const auto w = normal_vec(n * k, 21);
  const PackedMatrix pw = PackedMatrix::pack_f32(w.data(), n, k);
  ThreadPool pool2(2), pool3(3);
  for (const int64_t m : {5, 7, 13, 25, 48, 49, 100, 192, 193, 500}) {
    const auto x = normal_vec(m * k, 22 + m);
    const std::vector<float> want = reference_product(x, m, w, n, k);
    for (Isa isa : available_isas())
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
        std::vector<float> y(m * n, 7.0f);
        gemm(x.data(), m, k, pw, y.data(), n, pool, isa);
        EXPECT_TRUE(same_bits(y.data(), want.data(), want.size()))
            << isa_name(isa) << " rows " << m << " threads " << (pool ? pool->num_threads() : 1);
      }
  }
}

TEST(Gemm, ChunkRuleGivesEqualChunksWhoseCountSplitsOverTwoFourEight) {
  EXPECT_EQ(gemm_chunk(2048), 128);    // 16 chunks
  EXPECT_EQ(gemm_chunk(1024), 128);    // 8
  EXPECT_EQ(gemm_chunk(576), 72);      // 8 (SmolLM2's hidden size)
  EXPECT_EQ(gemm_chunk(1536), 96);     // 16 (SmolLM2's intermediate size)
  EXPECT_EQ(gemm_chunk(172), 43);      // 4 (stories260K's hidden_dim: 172 = 4 × 43)
  EXPECT_EQ(gemm_chunk(64), 8);        // 8
  EXPECT_EQ(gemm_chunk(1), 128);       // one chunk
  EXPECT_EQ(gemm_chunk(151936), 128);  // no equal split: 1187 chunks, the last one shorter
  for (int64_t k = 1; k <= 5000; ++k) {
    const int64_t c = gemm_chunk(k);
    ASSERT_GE(c, 1);
    ASSERT_LE(c, kGemmChunk) << k;
  }
}

// A row-parallel product split over tp ranks on chunk boundaries: each rank's GEMM over its K slice
// with the full product's chunk, the partials summed by the halving tree over ranks, equals the
// single-process GEMM bit for bit (what tensor-parallel o_proj / down_proj rely on).
TEST(Gemm, RowParallelShardsWithTheFullChunkSumToTheSingleProcessBits) {
  struct Case {
    int64_t k;
    std::vector<int> tps;
  } cases[] = {{576, {2, 4, 8}}, {172, {2, 4}}, {64, {2, 4, 8}}, {1536, {2, 4, 8}}, {2048, {2, 8}}};
  const int64_t m = 5, n = 40;
  for (const Case& c : cases) {
    const int64_t k = c.k;
    auto x = normal_vec(m * k, 21 + k), w = normal_vec(n * k, 22 + k);
    std::vector<float> full(m * n);
    gemm(x.data(), m, k, PackedMatrix::pack_f32(w.data(), n, k), full.data(), n, nullptr);
    for (int tp : c.tps) {
      const int64_t kl = k / tp;
      std::vector<float> partials(tp * m * n);
      for (int r = 0; r < tp; ++r) {
        std::vector<float> ws(n * kl);
        for (int64_t j = 0; j < n; ++j)
          std::copy_n(w.data() + j * k + r * kl, kl, ws.data() + j * kl);
        PackedMatrix shard = PackedMatrix::pack_f32(ws.data(), n, kl);
        shard.set_chunk(gemm_chunk(k));
        gemm(x.data() + r * kl, m, k, shard, partials.data() + r * m * n, n, nullptr);
      }
      std::vector<float> summed(m * n);
      halving_tree_sum(partials.data(), tp, m * n, summed.data());  // the TP all-reduce's sum
      EXPECT_TRUE(same_bits(summed.data(), full.data(), m * n)) << "k=" << k << " tp=" << tp;
    }
  }
}

TEST(Gemm, ReferenceIsCloseToDoubleDot) {
  const int64_t k = 4096;
  auto x = normal_vec(k, 5), w = normal_vec(k, 6);
  double exact = 0;
  for (int64_t i = 0; i < k; ++i) exact += static_cast<double>(x[i]) * w[i];
  EXPECT_NEAR(gemm_reference_dot(x.data(), w.data(), k), exact, 1e-3);
}

TEST(Gemm, RowAloneEqualsRowInBatchOf64AnyThreadCount) {
  const int64_t k = 576, n = 200, m = 64;
  auto x = normal_vec(m * k, 11);
  auto w = normal_vec(n * k, 12);
  PackedMatrix pw = PackedMatrix::pack_f32(w.data(), n, k);
  ThreadPool pool2(2), pool3(3);
  for (Isa isa : available_isas()) {
    std::vector<float> batch(m * n), batch3(m * n);
    gemm(x.data(), m, k, pw, batch.data(), n, &pool2, isa);
    gemm(x.data(), m, k, pw, batch3.data(), n, &pool3, isa);
    ASSERT_TRUE(same_bits(batch.data(), batch3.data(), m * n));
    for (int64_t row : {0, 1, 17, 47, 48, 63}) {
      std::vector<float> alone(n);
      gemm(x.data() + row * k, 1, k, pw, alone.data(), n, nullptr, isa);
      ASSERT_TRUE(same_bits(alone.data(), batch.data() + row * n, n))
          << "row " << row << " isa " << isa_name(isa);
    }
  }
}

// A single row is read where it lies, not packed; written over itself (y = x, N = K) it is packed
// first, as any M is: the same bits either way.
TEST(Gemm, LoneRowInPlaceGivesTheSameBits) {
  const int64_t k = 576;
  const auto x = normal_vec(k, 31), w = normal_vec(k * k, 32);
  const PackedMatrix pw = PackedMatrix::pack_f32(w.data(), k, k);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    std::vector<float> out(k), inplace = x;
    gemm(x.data(), 1, k, pw, out.data(), k, &pool, isa);
    gemm(inplace.data(), 1, k, pw, inplace.data(), k, &pool, isa);
    ASSERT_TRUE(same_bits(out.data(), inplace.data(), k)) << isa_name(isa);
    for (int64_t j : {0, 31, 32, 575})
      ASSERT_EQ(out[j], gemm_reference_dot(x.data(), w.data() + j * k, k)) << isa_name(isa);
  }
}

TEST(Gemm, Bf16WeightsWidenExactly) {
  const int64_t n = 40, k = 70;
  auto w = normal_vec(n * k, 3);
  Tensor wb = Tensor::zeros(DType::kBF16, {n, k});
  std::vector<float> widened(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    wb.mutable_data<uint16_t>()[i] = f32_to_bf16(w[i]);
    widened[i] = bf16_to_f32(f32_to_bf16(w[i]));
  }
  PackedMatrix a = PackedMatrix::pack(wb), b = PackedMatrix::pack_f32(widened.data(), n, k);
  for (int64_t r = 0; r < n; ++r) ASSERT_EQ(a.unpack_row(r), b.unpack_row(r));
}

TEST(Gemm, FusedRowsEqualSeparateMatrices) {
  const int64_t k = 96;
  auto wa = normal_vec(40 * k, 21), wb = normal_vec(24 * k, 22), x = normal_vec(5 * k, 23);
  Tensor ta = Tensor::from_f32({40, k}, wa), tb = Tensor::from_f32({24, k}, wb);
  PackedMatrix fused = PackedMatrix::pack_rows({&ta, &tb});
  PackedMatrix pa = PackedMatrix::pack(ta), pb = PackedMatrix::pack(tb);
  std::vector<float> yf(5 * 64), ya(5 * 40), yb(5 * 24);
  gemm(x.data(), 5, k, fused, yf.data(), 64, nullptr);
  gemm(x.data(), 5, k, pa, ya.data(), 40, nullptr);
  gemm(x.data(), 5, k, pb, yb.data(), 24, nullptr);
  for (int r = 0; r < 5; ++r) {
    ASSERT_TRUE(same_bits(yf.data() + r * 64, ya.data() + r * 40, 40));
    ASSERT_TRUE(same_bits(yf.data() + r * 64 + 40, yb.data() + r * 24, 24));
  }
}

// Packing moves values only: stacked parts whose rows do not start on a lane group, K not a
// multiple of 8, and a reused matrix repacked with other values (its padding lanes zeroed), each
// element where unpack_row says; the transposed pack is the pack of the explicit transpose.
TEST(PackedMatrix, PacksAndTransposesExactly) {
  for (const int64_t k : {64, 70, 5}) {
    auto wa = normal_vec(40 * k, 51), wb = normal_vec(27 * k, 52), wc = normal_vec(9 * k, 53);
    Tensor ta = Tensor::from_f32({40, k}, wa), tb = Tensor::from_f32({27, k}, wb),
           tc = Tensor::from_f32({9, k}, wc);
    PackedMatrix m = PackedMatrix::pack_rows({&tb, &ta});  // a bigger matrix first: reuse below
    m.assign_rows({&ta, &tb, &tc});
    ASSERT_EQ(m.n(), 76);
    for (int64_t r = 0; r < 76; ++r) {
      const float* src = r < 40 ? wa.data() + r * k
                                : (r < 67 ? wb.data() + (r - 40) * k : wc.data() + (r - 67) * k);
      ASSERT_EQ(m.unpack_row(r), std::vector<float>(src, src + k)) << "row " << r << " k " << k;
    }
    const float* last = m.panel(m.num_panels() - 1);
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t lane = 76 % kPanel; lane < kPanel; ++lane)
        ASSERT_EQ(last[kk * kPanel + lane], 0.0f) << "padding lane " << lane;
    std::vector<float> all(76 * k), allt(k * 76);
    for (int64_t r = 0; r < 76; ++r) {
      const std::vector<float> row = m.unpack_row(r);
      for (int64_t kk = 0; kk < k; ++kk) allt[kk * 76 + r] = row[kk];
    }
    PackedMatrix t, want = PackedMatrix::pack_f32(allt.data(), k, 76);
    m.transpose_into(t);
    ASSERT_EQ(t.n(), k);
    for (int64_t r = 0; r < k; ++r) ASSERT_EQ(t.unpack_row(r), want.unpack_row(r)) << "row " << r;
  }
}

// assign_rows with the transposed pack made in the same pass (the trainer's per-step repack) gives
// exactly assign_rows + transpose_into: stacked parts starting inside a panel, K a multiple of
// kPanel (the fused path) or not, a bf16 part (both fall back), and reused matrices holding other
// shapes first. Padding lanes included.
TEST(PackedMatrix, FusedTransposedPackIsTheTwoPasses) {
  const auto panels_equal = [](const PackedMatrix& a, const PackedMatrix& b) {
    if (a.n() != b.n() || a.k() != b.k() || a.chunk() != b.chunk()) return false;
    for (int64_t p = 0; p < a.num_panels(); ++p)
      if (!same_bits(a.panel(p), b.panel(p), a.k() * kPanel)) return false;
    return true;
  };
  for (const int64_t k : {64, 96, 70, 5}) {
    for (const bool with_bf16 : {false, true}) {
      auto wa = normal_vec(40 * k, 61), wb = normal_vec(27 * k, 62), wc = normal_vec(9 * k, 63);
      Tensor ta = Tensor::from_f32({40, k}, wa), tb = Tensor::from_f32({27, k}, wb),
             tc = Tensor::from_f32({9, k}, wc);
      if (with_bf16) {
        tb = Tensor::zeros(DType::kBF16, {27, k});
        for (int64_t i = 0; i < 27 * k; ++i) tb.mutable_data<uint16_t>()[i] = f32_to_bf16(wb[i]);
      }
      const std::vector<const Tensor*> parts = {&ta, &tb, &tc};
      PackedMatrix want = PackedMatrix::pack_rows(parts), want_t;
      want.transpose_into(want_t);
      PackedMatrix got = PackedMatrix::pack_rows({&tc}), got_t = PackedMatrix::pack_rows({&ta});
      got.assign_rows(parts, got_t);
      EXPECT_TRUE(panels_equal(got, want)) << "k " << k << " bf16 " << with_bf16;
      EXPECT_TRUE(panels_equal(got_t, want_t)) << "k " << k << " bf16 " << with_bf16;
    }
  }
}

// dot_rows (eight rows' chains side by side) gives every row dot's bits: full groups and the rest,
// one chunk or many, a ragged last chunk, strides past the width, and rows with more chunks than
// its side-by-side buffer (the per-row fallback).
TEST(Reduce, DotRowsIsDotPerRow) {
  for (const int64_t n : {0, 1, 127, 128, 300, 576, 64 * 128 + 5}) {
    const int64_t rows = 19, lda = n + 3, ldb = n + 7;
    const auto a = normal_vec(rows * lda + 1, 41 + n), b = normal_vec(rows * ldb + 1, 42 + n);
    std::vector<float> got(rows);
    detail::dot_rows(a.data(), lda, b.data(), ldb, rows, n, got.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float want = detail::dot(a.data() + r * lda, b.data() + r * ldb, n);
      EXPECT_TRUE(same_bits(&want, &got[r], 1)) << "n " << n << " row " << r;
    }
  }
}

// max_of's lanes (from 16 values on) against std::max from -inf in ascending order, on rows where
// the largest value is +0 and -0 in either order, NaNs, -inf and ordinary values.
TEST(Reduce, MaxOfIsTheAscendingScan) {
  std::mt19937 gen(7);
  const float kinds[] = {0.0f, -0.0f, NAN, -INFINITY, -1.5f, -3.0f};
  for (int64_t n = 1; n <= 100; ++n)
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (float& v : x)
        v = trial < 10 ? kinds[gen() % 6] : std::ldexp(float(gen() % 2001) - 1000.0f, -4);
      float want = -INFINITY;
      for (const float v : x) want = std::max(want, v);
      const float got = detail::max_of(x.data(), n);
      EXPECT_TRUE(same_bits(&want, &got, 1)) << "n " << n << " trial " << trial << ": " << got;
    }
}

TEST(RmsNorm, MatchesDoubleAndIsRowInvariant) {
  const int64_t d = 300, m = 64;
  auto x = normal_vec(m * d, 31), w = normal_vec(d, 32);
  std::vector<float> y(m * d);
  rmsnorm(x.data(), m, d, w.data(), 1e-6f, y.data());
  for (int64_t r : {0, 9, 63}) {
    std::vector<float> alone(d);
    rmsnorm(x.data() + r * d, 1, d, w.data(), 1e-6f, alone.data());
    ASSERT_TRUE(same_bits(alone.data(), y.data() + r * d, d));
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(y[r * d + i], x[r * d + i] * inv * w[i], 1e-5);
  }
}

TEST(Softmax, LogSoftmaxMatchesDoubleAndSumsToOne) {
  auto x = normal_vec(1000, 41, 3.0f);
  std::vector<float> ls(1000), p = x;
  log_softmax_row(x.data(), 1000, ls.data());
  softmax_row(p.data(), 1000);
  double mx = -1e30, s = 0, total = 0;
  for (float v : x) mx = std::max<double>(mx, v);
  for (float v : x) s += std::exp(double(v) - mx);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_NEAR(ls[i], double(x[i]) - mx - std::log(s), 1e-5);
    total += p[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_NEAR(logsumexp_row(x.data(), 1000), mx + std::log(s), 1e-5);
}

// Distance in units in the last place between two finite non-negative floats.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - ib);
}

// miles' exp (kernels/exp.h): within 2 ulp of the correctly rounded exp over the whole float range
// (subnormal results included), the 8-lane form bit-identical to the scalar one, and the edges.
TEST(Exp, WithinTwoUlpAndTheVectorFormHasTheScalarBits) {
  std::vector<float> xs;
  for (float x = -110.0f; x < 95.0f; x += 0.000731f) xs.push_back(x);
  auto r = normal_vec(100000, 77, 3.0f);
  xs.insert(xs.end(), r.begin(), r.end());
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72f, 88.73f, 89.0f, -87.33f, -103.97f, -104.0f,
                  INFINITY, -INFINITY, std::nanf("")})
    xs.push_back(x);
  while (xs.size() % 8) xs.push_back(1.0f);
  std::vector<float> vec(xs.size());
  detail::exp_shifted(xs.data(), 0.0f, static_cast<int64_t>(xs.size()), vec.data());
  int64_t worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float got = detail::exp_f32(xs[i]);
    ASSERT_EQ(std::memcmp(&got, &vec[i], 4), 0) << "x " << xs[i];
    if (std::isnan(xs[i])) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    const float want = static_cast<float>(std::exp(static_cast<double>(xs[i])));
    if (std::isinf(want)) {
      EXPECT_TRUE(std::isinf(got) || ulps(got, want) <= 2) << "x " << xs[i];
      continue;
    }
    worst = std::max(worst, ulps(got, want));
    ASSERT_LE(ulps(got, want), 2) << "x " << xs[i] << " got " << got << " want " << want;
  }
  EXPECT_EQ(detail::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(detail::exp_f32(INFINITY), INFINITY);
  std::printf("exp_f32: worst %lld ulp over %zu arguments\n", static_cast<long long>(worst),
              xs.size());
}

// The row reductions as the contract states them, one term after another: the max by std::max
// from -inf in ascending order, Σ exp_f32(x - max) in chunks of kGemmChunk combined by the halving
// tree.
float contract_max(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}
float contract_tree(const std::vector<float>& p, size_t lo, size_t hi) {
  if (hi - lo == 1) return p[lo];
  const size_t mid = lo + (hi - lo + 1) / 2;
  const float a = contract_tree(p, lo, mid);
  return a + contract_tree(p, mid, hi);
}
float contract_exp_sum(const float* x, int64_t n, float m) {
  std::vector<float> parts;
  for (int64_t c = 0; c < std::max<int64_t>(1, (n + kGemmChunk - 1) / kGemmChunk); ++c) {
    float acc = 0.0f;
    for (int64_t i = c * kGemmChunk; i < std::min(n, (c + 1) * kGemmChunk); ++i)
      acc = acc + detail::exp_f32(x[i] - m);
    parts.push_back(acc);
  }
  return contract_tree(parts, 0, parts.size());
}

// The fast row paths (vector max, interleaved chunk sums, softmax and log-softmax in one pass, one
// log-probability without the row) give the contract's bits, at vocabulary-like lengths, with the
// maximum a signed zero (-0 first, +0 later).
TEST(Softmax, FastRowPathsEqualTheContractBitForBit) {
  for (int64_t n : {7, 64, 1000, 1024, 2100, 9000, 49152, 151936, 300000}) {
    auto x = normal_vec(n, 43 + n, 4.0f);
    const float m = contract_max(x.data(), n);
    const float log_s = std::log(contract_exp_sum(x.data(), n, m));
    std::vector<float> ls(n), probs(n), logp(n), sm = x;
    log_softmax_row(x.data(), n, ls.data());
    softmax_row(sm.data(), n);
    softmax_log_softmax_row(x.data(), n, probs.data(), logp.data());
    for (int64_t i = 0; i < n; ++i) {
      const float want = (x[i] - m) - log_s;
      ASSERT_EQ(std::memcmp(&ls[i], &want, 4), 0) << "n " << n << " i " << i;
    }
    ASSERT_TRUE(same_bits(logp.data(), ls.data(), n)) << n;
    ASSERT_TRUE(same_bits(probs.data(), sm.data(), n)) << n;
    for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
      const float at = log_softmax_at(x.data(), n, i);
      ASSERT_EQ(std::memcmp(&at, &ls[i], 4), 0) << "n " << n << " i " << i;
    }
  }
  // A maximum of ±0: -0 comes first, so the contract's max is -0 (the vector lanes cannot tell).
  std::vector<float> z = normal_vec(300, 44, 1.0f);
  for (float& v : z) v = -std::fabs(v) - 1.0f;
  z[10] = -0.0f;
  z[200] = 0.0f;
  z[201] = -0.0f;
  const float m = contract_max(z.data(), 300);
  ASSERT_TRUE(std::signbit(m));
  const float log_s = std::log(contract_exp_sum(z.data(), 300, m));
  std::vector<float> ls(300);
  log_softmax_row(z.data(), 300, ls.data());
  for (int64_t i = 0; i < 300; ++i) {
    const float want = (z[i] - m) - log_s;
    ASSERT_EQ(std::memcmp(&ls[i], &want, 4), 0) << i;
  }
}

// The row loops built on exp (16 lanes with AVX-512, 8 with AVX, then scalar tails) give, element
// by element, the bits of the scalar formulas: SwiGLU, its backward and the log-probability
// gradient, at lengths that leave every kind of tail, on arguments that reach exp's edges (±0,
// ±inf, NaN, beyond the clamps, subnormal results).
TEST(ExpRows, EveryLaneWidthGivesTheScalarFormulasBits) {
  auto args = [](int64_t n, uint64_t seed) {
    std::vector<float> v = normal_vec(n, seed, 6.0f);
    const float edges[] = {0.0f,   -0.0f,  INFINITY, -INFINITY, std::nanf(""),
                           88.9f,  -88.9f, 104.5f,   -104.5f,   87.5f,
                           -87.5f, 1e-30f, -1e-30f,  30.0f,     -30.0f};
    for (int64_t i = 0; i < n; i += 3) v[i] = edges[(i / 3) % std::size(edges)];
    return v;
  };
  for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 100, 1541}) {
    const auto g = args(n, 61 + n), u = normal_vec(n, 62 + n, 2.0f), a = normal_vec(n, 63 + n);
    std::vector<float> o(n), dg(n), du(n);
    swiglu(g.data(), u.data(), 1, n, n, o.data());
    swiglu_backward(g.data(), u.data(), a.data(), 1, n, n, dg.data(), du.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float den = 1.0f + detail::exp_f32(-g[i]);
      const float sig = 1.0f / den, silu = g[i] / den;
      const float want_o = (g[i] / (1.0f + detail::exp_f32(-g[i]))) * u[i];
      const float want_du = a[i] * silu;
      const float want_dg = (a[i] * u[i]) * (sig * (1.0f + g[i] * (1.0f - sig)));
      ASSERT_TRUE(same_bits(&o[i], &want_o, 1)) << "n " << n << " g " << g[i];
      ASSERT_TRUE(same_bits(&du[i], &want_du, 1)) << "n " << n << " g " << g[i];
      ASSERT_TRUE(same_bits(&dg[i], &want_dg, 1)) << "n " << n << " g " << g[i];
    }
    // The gradient of a row's log-probability (and of its entropy) as token_logprobs_backward
    // writes it, against the scalar formula with the same statistics.
    const auto x = normal_vec(n, 64 + n, 8.0f);
    const int32_t target = static_cast<int32_t>(n / 2);
    const float dlogp = 0.75f, dent = -0.3f;
    LogSoftmaxStats st{};
    float logp = 0.0f, ent = 0.0f;
    token_logprobs(x.data(), 1, n, &target, &logp, &ent, &st);
    std::vector<float> grad(n);
    token_logprobs_backward(x.data(), 1, n, &target, &dlogp, &dent, grad.data(), &st);
    std::vector<float> lp(n);
    log_softmax_row(x.data(), n, st, lp.data());
    std::vector<float> pe(n);
    for (int64_t i = 0; i < n; ++i) pe[i] = detail::exp_f32(lp[i]);
    const float h =
        -detail::chunked_sum(n, [&](int64_t i, float acc) { return std::fma(pe[i], lp[i], acc); });
    for (int64_t i = 0; i < n; ++i) {
      const float l = (x[i] - st.max) - st.log_sum, p = detail::exp_f32(l);
      float want = -dlogp * p - dent * p * (l + h);
      if (i == target) want = want + dlogp;
      ASSERT_TRUE(same_bits(&grad[i], &want, 1)) << "n " << n << " i " << i;
    }
  }
}

TEST(Swiglu, MatchesDefinition) {
  auto g = normal_vec(64, 51, 3.0f), u = normal_vec(64, 52);
  std::vector<float> o(64);
  swiglu(g.data(), u.data(), 1, 64, 64, o.data());
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-6);
}

TEST(Rope, DefaultRotatesHalfSplitPairsAndLeavesPartialTail) {
  RopeConfig cfg;
  cfg.theta = 10000;
  cfg.partial_rotary_factor = 0.5;
  auto table = make_rope_table(cfg, 16);
  ASSERT_TRUE(table.ok());
  ASSERT_EQ(table->rotary_dim, 8);
  auto x = normal_vec(2 * 16, 61);
  auto y = x;
  int32_t pos[2] = {0, 5};
  rope_apply(y.data(), 1, 2, 16, pos + 1, *table);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      const double f = 1.0 / std::pow(10000.0, 2.0 * j / 8.0), a = 5 * f;
      const double e0 = x[h * 16 + j] * std::cos(a) - x[h * 16 + j + 4] * std::sin(a);
      const double e1 = x[h * 16 + j + 4] * std::cos(a) + x[h * 16 + j] * std::sin(a);
      EXPECT_NEAR(y[h * 16 + j], e0, 1e-5);
      EXPECT_NEAR(y[h * 16 + j + 4], e1, 1e-5);
    }
    for (int j = 8; j < 16; ++j) EXPECT_EQ(y[h * 16 + j], x[h * 16 + j]);
  }
  auto z = x;
  rope_apply(z.data(), 1, 2, 16, pos, *table);  // position 0: identity
  EXPECT_TRUE(same_bits(z.data(), x.data(), 32));
}

// The table's cached cos / sin (the first positions) are the values rotate computes for the others:
// a table with its cache dropped rotates every position, forward and backward, to the same bits,
// with yarn's scaling too.
TEST(Rope, CachedPositionsRotateAsComputedOnes) {
  for (const bool yarn : {false, true}) {
    RopeConfig cfg;
    cfg.theta = 100000;
    if (yarn) {
      cfg.type = RopeConfig::Type::kYarn;
      cfg.factor = 4.0;
      cfg.original_max_position_embeddings = 2048;
    }
    auto table = make_rope_table(cfg, 64);
    ASSERT_TRUE(table.ok());
    ASSERT_GT(table->cached_positions, 4000);
    RopeTable uncached = *table;
    uncached.cos_sin.clear();
    uncached.cached_positions = 0;
    const std::vector<int32_t> pos = {0, 1, 7, 255, 1000, 4095, 4096, 9000, 123456};
    const int64_t t = static_cast<int64_t>(pos.size()), heads = 3;
    const auto x = normal_vec(t * heads * 64, 91, 2.0f);
    for (const bool backward : {false, true}) {
      auto a = x, b = x;
      if (backward) {
        rope_backward(a.data(), t, heads, 64, pos.data(), *table);
        rope_backward(b.data(), t, heads, 64, pos.data(), uncached);
      } else {
        rope_apply(a.data(), t, heads, 64, pos.data(), *table);
        rope_apply(b.data(), t, heads, 64, pos.data(), uncached);
      }
      EXPECT_TRUE(same_bits(a.data(), b.data(), a.size())) << "yarn " << yarn;
      EXPECT_FALSE(same_bits(a.data(), x.data(), a.size()));
    }
  }
}

TEST(Rope, DynamicIsRefusedWithAReason) {
  RopeConfig cfg;
  cfg.type = RopeConfig::Type::kDynamic;
  auto t = make_rope_table(cfg, 16);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("dynamic"), std::string::npos);
}

// A sequence's keys and values ([len][kvh * hd] rows) stored in cache blocks of bt positions
// (kv_block_store); the slots past len hold NaN, which attention must never let through.
struct CacheBlocks {
  std::vector<std::vector<float>> k, v;
  std::vector<const float*> kp, vp;
  CacheBlocks(const std::vector<float>& keys, const std::vector<float>& vals, int64_t len,
              int64_t kvh, int64_t hd, int64_t bt) {
    const int64_t nb = (len + bt - 1) / bt;
    k.assign(nb, std::vector<float>(bt * kvh * hd, std::nanf("")));
    v = k;
    for (int64_t p = 0; p < len; ++p)
      kv_block_store(keys.data() + p * kvh * hd, vals.data() + p * kvh * hd, p % bt, bt, kvh, hd,
                     k[p / bt].data(), v[p / bt].data());
    for (int64_t b = 0; b < nb; ++b) {
      kp.push_back(k[b].data());
      vp.push_back(v[b].data());
    }
  }
};

// Attention against a direct double-precision softmax, and invariance of a query's bits under how
// many queries and keys are around it.
TEST(Attention, MatchesDirectSoftmaxAndIsInvariant) {
  const int64_t hd = 16, heads = 4, kvh = 2, len = 77, bt = 16;
  auto q = normal_vec(len * heads * hd, 71), k = normal_vec(len * kvh * hd, 72),
       v = normal_vec(len * kvh * hd, 73);
  CacheBlocks cache(k, v, len, kvh, hd, bt);
  KvSpan span{cache.kp, cache.vp, bt};
  std::vector<int32_t> pos(len);
  for (int i = 0; i < len; ++i) pos[i] = i;
  std::vector<float> out(len * heads * hd);
  const float scale = 1.0f / 4.0f;
  attention(q.data(), len, heads, kvh, hd, pos.data(), span, scale, out.data());
  for (int64_t t : {0, 31, 32, 76}) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / 2;
      std::vector<double> s(t + 1);
      double mx = -1e30, den = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t e = 0; e < hd; ++e)
          d += double(q[(t * heads + h) * hd + e]) * k[(j * kvh + g) * hd + e];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      for (auto& x : s) den += (x = std::exp(x - mx));
      for (int64_t e = 0; e < hd; ++e) {
        double o = 0;
        for (int64_t j = 0; j <= t; ++j) o += s[j] / den * v[(j * kvh + g) * hd + e];
        EXPECT_NEAR(out[(t * heads + h) * hd + e], o, 1e-5);
      }
    }
    std::vector<float> alone(heads * hd);
    attention(q.data() + t * heads * hd, 1, heads, kvh, hd, &pos[t], span, scale, alone.data());
    ASSERT_TRUE(same_bits(alone.data(), out.data() + t * heads * hd, heads * hd));
  }
}

// Attention backward against the analytic gradient in double precision, over several query blocks
// (t = 150), for head dimensions inside one chunk (SIMD) and past it (scalar dot).
TEST(AttentionBackward, MatchesTheDoublePrecisionGradient) {
  for (int64_t hd : {16, 64, 160}) {
    const int64_t t = 150, heads = 6, kvh = 2, group = heads / kvh;
    const int64_t ldq = heads * hd, ldkv = kvh * hd;
    auto q = normal_vec(t * ldq, 301 + hd), k = normal_vec(t * ldkv, 302 + hd),
         v = normal_vec(t * ldkv, 303 + hd), d_out = normal_vec(t * ldq, 304 + hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> dq(t * ldq), dk(t * ldkv), dv(t * ldkv);
    attention_backward(q.data(), k.data(), v.data(), ldq, ldkv, d_out.data(), t, heads, kvh, hd,
                       scale, dq.data(), dk.data(), dv.data());
    std::vector<double> rq(t * ldq, 0.0), rk(t * ldkv, 0.0), rv(t * ldkv, 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double mx = -1e300, sum = 0.0, dsum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double sc = 0.0, d = 0.0;
          for (int64_t e = 0; e < hd; ++e) {
            sc += double(q[i * ldq + h * hd + e]) * k[j * ldkv + g * hd + e];
            d += double(d_out[i * ldq + h * hd + e]) * v[j * ldkv + g * hd + e];
          }
          p[j] = sc * scale;
          dp[j] = d;
          mx = std::max(mx, p[j]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j <= i; ++j) dsum += (p[j] /= sum) * dp[j];
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - dsum) * scale;
          for (int64_t e = 0; e < hd; ++e) {
            rq[i * ldq + h * hd + e] += ds * k[j * ldkv + g * hd + e];
            rk[j * ldkv + g * hd + e] += ds * q[i * ldq + h * hd + e];
            rv[j * ldkv + g * hd + e] += p[j] * d_out[i * ldq + h * hd + e];
          }
        }
      }
    }
    auto close = [](const std::vector<float>& got, const std::vector<double>& want) {
      double worst = 0.0, scale_ref = 1e-30;
      for (double w : want) scale_ref = std::max(scale_ref, std::fabs(w));
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      return worst / scale_ref;
    };
    EXPECT_LT(close(dq, rq), 2e-6) << "hd " << hd;
    EXPECT_LT(close(dk, rk), 2e-6) << "hd " << hd;
    EXPECT_LT(close(dv, rv), 2e-6) << "hd " << hd;
  }
}

// The row-wise kernels on a batch of 64 rows against each row alone.
TEST(RowKernels, RowAloneEqualsRowInBatchOf64) {
  const int64_t m = 64, d = 200, heads = 4, hd = 50;
  auto x = normal_vec(m * d, 91, 2.0f), u = normal_vec(m * d, 92);
  RopeConfig cfg;
  auto table = make_rope_table(cfg, hd);
  ASSERT_TRUE(table.ok());
  std::vector<int32_t> pos(m);
  for (int64_t i = 0; i < m; ++i) pos[i] = static_cast<int32_t>(i * 3);
  std::vector<float> rope_b = x, sw_b(m * d), ls_b(m * d), sm_b = x;
  rope_apply(rope_b.data(), m, heads, hd, pos.data(), *table);
  swiglu(x.data(), u.data(), m, d, d, sw_b.data());
  for (int64_t r = 0; r < m; ++r) {
    log_softmax_row(x.data() + r * d, d, ls_b.data() + r * d);
    softmax_row(sm_b.data() + r * d, d);
  }
  for (int64_t r : {0, 5, 63}) {
    std::vector<float> row(x.begin() + r * d, x.begin() + (r + 1) * d), sw(d), ls(d), sm = row;
    rope_apply(row.data(), 1, heads, hd, &pos[r], *table);
    ASSERT_TRUE(same_bits(row.data(), rope_b.data() + r * d, d));
    swiglu(x.data() + r * d, u.data() + r * d, 1, d, d, sw.data());
    ASSERT_TRUE(same_bits(sw.data(), sw_b.data() + r * d, d));
    log_softmax_row(x.data() + r * d, d, ls.data());
    ASSERT_TRUE(same_bits(ls.data(), ls_b.data() + r * d, d));
    softmax_row(sm.data(), d);
    ASSERT_TRUE(same_bits(sm.data(), sm_b.data() + r * d, d));
  }
}

TEST(TopK, DescendingWithLowerIndexOnTies) {
  float x[6] = {0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 0.5f};
  int32_t idx[4];
  float val[4];
  topk(x, 6, 4, idx, val);
  EXPECT_EQ(idx[0], 4);
  EXPECT_EQ(idx[1], 1);
  EXPECT_EQ(idx[2], 2);
  EXPECT_EQ(idx[3], 0);
  EXPECT_EQ(val[3], 0.5f);
}

TEST(Embedding, CopiesRows) {
  auto table = normal_vec(10 * 8, 81);
  int32_t ids[3] = {9, 0, 9};
  std::vector<float> out(24);
  embedding(table.data(), 8, ids, 3, out.data());
  EXPECT_TRUE(same_bits(out.data(), table.data() + 72, 8));
  EXPECT_TRUE(same_bits(out.data() + 8, table.data(), 8));
}

}  // namespace
}  // namespace miles::kernels
