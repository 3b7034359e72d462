// The weight gradient's GEMM (dW = dYᵀ · X, packed straight from dY's columns) and gemm_xt against
// the contract's scalar dot (over rows in chunks of kWeightGradChunk), bit for bit, at shapes that
// leave partial tiles, panels and chunks, with row strides past the width, on one thread and on
// pools.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "miles/backward_kernels.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"
#include "random_vec.h"

namespace miles::kernels {
namespace {

using test::random_vec;

struct Dims {
  int64_t m, n, k;  // dW [n, k] summed over m rows
};

TEST(GemmBackward, WeightGradientIsTheContractDotOverRows) {
  ThreadPool pool2(2), pool3(3);
  for (const Dims d : {Dims{255, 49, 33}, Dims{1, 7, 5}, Dims{130, 96, 64}, Dims{300, 13, 200},
                       Dims{64, 577, 31}}) {
    const int64_t ldy = d.n + 3, ldx = d.k + 5;
    const auto dy = random_vec(d.m * ldy, 1 + d.m), x = random_vec(d.m * ldx, 2 + d.n);
    std::vector<float> want(d.n * d.k), col_dy(d.m), col_x(d.m);
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t j = 0; j < d.k; ++j) {
        for (int64_t r = 0; r < d.m; ++r) {
          col_dy[r] = dy[r * ldy + i];
          col_x[r] = x[r * ldx + j];
        }
        want[i * d.k + j] = gemm_reference_dot(col_dy.data(), col_x.data(), d.m, kWeightGradChunk);
      }
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
      std::vector<float> got(d.n * d.k, 9.0f);
      gemm_weight_grad(dy.data(), ldy, x.data(), ldx, d.m, d.n, d.k, got.data(), pool);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
          << "m " << d.m << " n " << d.n << " k " << d.k;
    }
  }
}

TEST(GemmBackward, TransposedOperandGivesGemmsBitsOnEveryIsa) {
  // Each item packs its own rows (an LM head's vocabulary wide in the second shape; the third's
  // stride is 256 floats); the last reduction is long enough for the rows packed once up front
  // and the items of panel groups; a single row is not packed at all.
  for (const Dims d :
       {Dims{50, 70, 300}, Dims{8205, 40, 19}, Dims{250, 45, 70}, Dims{100, 70, 4500},
        Dims{1, 70, 300}, Dims{1, 40, 4500}}) {  // one row: read in place at its stride
    const int64_t m = d.m, k = d.k, n = d.n, ldt = m + 6;
    const auto xt = random_vec(k * ldt, 7), w = random_vec(n * k, 8);
    std::vector<float> x(m * k);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t kk = 0; kk < k; ++kk) x[i * k + kk] = xt[kk * ldt + i];
    const PackedMatrix pw = PackedMatrix::pack_f32(w.data(), n, k);
    ThreadPool pool(2);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (static_cast<int>(isa) > static_cast<int>(detect_isa())) continue;
      std::vector<float> want(m * n), got(m * n, 5.0f);
      gemm(x.data(), m, k, pw, want.data(), n, &pool, isa);
      gemm_xt(xt.data(), m, ldt, pw, got.data(), n, &pool, isa);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
          << isa_name(isa) << " m " << m;
    }
  }
}

}  // namespace
}  // namespace miles::kernels
