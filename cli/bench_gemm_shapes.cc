// The training step's GEMM shapes (bench_gemm_shapes.h).
#include "cli/bench_gemm_shapes.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "cli/bench_peak.h"
#include "miles/backward_kernels.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"

namespace miles::cli {

namespace {

struct Shape {
  const char* name;
  int64_t n, k;      // W [n, k]
  int64_t per_step;  // GEMMs of this shape per micro-batch (matrices of it in the model)
};

// SmolLM2-135M's matrices: fused q/k/v, o, fused gate/up, down in each of 30 layers, the LM head.
constexpr Shape kSmolLM2[] = {{"q/k/v", 960, 576, 30},
                              {"o", 576, 576, 30},
                              {"gate/up", 3072, 576, 30},
                              {"down", 576, 1536, 30},
                              {"lm head", 49152, 576, 1}};

// Seconds for one read of every matrix's packed floats, spread over the pool in 1 MiB slices: the
// memory's rate for the bytes a decode step's GEMMs stream, measured in the same run. (Words are
// xor-folded in eight lanes, a reduction the compiler may reorder and far faster than memory; each
// line is prefetched 4 KB ahead, as the GEMM tiles prefetch their panels: on an Intel Xeon VM the
// read without it ran at 19 GB/s where the one-row GEMMs streamed 25.)
double plain_read_seconds(const std::vector<kernels::PackedMatrix>& mats, ThreadPool& pool,
                          double min_seconds) {
  constexpr int64_t kSlice = int64_t{1} << 18;  // floats
  constexpr int64_t kReadAhead = 512;           // 8-byte words: 4 KB
  std::vector<std::pair<const float*, int64_t>> slices;
  for (const kernels::PackedMatrix& m : mats) {
    const int64_t n = m.num_panels() * m.k() * kernels::kPanel;
    for (int64_t at = 0; at < n; at += kSlice)
      slices.emplace_back(m.panel(0) + at, std::min(kSlice, n - at));
  }
  std::vector<uint64_t> folds(slices.size());
  return time_per_call(
      [&] {
        parallel_for(&pool, static_cast<int64_t>(slices.size()), [&](int64_t i) {
          const float* p = slices[i].first;
          const int64_t n = slices[i].second / 2;  // 8-byte words
          uint64_t lane[8] = {};
          for (int64_t w = 0; w + 8 <= n; w += 8) {  // a 64-byte line per step
            __builtin_prefetch(p + 2 * w + 2 * kReadAhead, 0, 3);
            for (int j = 0; j < 8; ++j) {
              uint64_t v;
              std::memcpy(&v, p + 2 * (w + j), sizeof v);
              lane[j] ^= v;
            }
          }
          uint64_t fold = 0;
          for (const uint64_t l : lane) fold ^= l;
          folds[i] = fold;
        });
      },
      min_seconds);
}

}  // namespace

void bench_train_gemm_shapes(int threads, double peak_gflops, double min_seconds) {
  constexpr int64_t kTokens = 255, kMicroBatches = 4;
  constexpr int64_t kColdBytes = int64_t{64} << 20;  // gradient buffers cycled past the L3
  ThreadPool pool(threads);
  const kernels::Isa isa = kernels::detect_isa();
  std::printf("\nSmolLM2-135M training GEMMs, %lld tokens, %d threads (%% of %.1f GFLOP/s):\n",
              static_cast<long long>(kTokens), threads, peak_gflops);
  std::printf(
      "%-8s %6s %5s %9s %9s %9s   ms: fwd / d-input / weight grad   %% of the peak beside it\n",
      "matrix", "N", "K", "forward", "d-input", "w-grad");
  // An FMA loop alternated with each GEMM: the peak of the same moment. 2M steps a thread (a few
  // ms) keep the pool's hand-out a negligible part of its time.
  constexpr int64_t kPeakIters = 2'000'000;
  double peak_flops = 0;
  const auto peak = [&] { peak_flops = fma_loop_on_pool(pool, isa, kPeakIters); };
  double step_s = 0, step_flops = 0, step_at_window_peak = 0;
  for (const Shape& s : kSmolLM2) {
    const auto w = random_values(s.n * s.k, 1), x = random_values(kTokens * s.k, 2);
    const auto dy = random_values(kTokens * s.n, 3);
    const kernels::PackedMatrix pw = kernels::PackedMatrix::pack_f32(w.data(), s.n, s.k);
    kernels::PackedMatrix pwt;
    pw.transpose_into(pwt);
    std::vector<float> y(kTokens * s.n), dx(kTokens * s.k);
    const int64_t buffers = std::max<int64_t>(2, kColdBytes / (s.n * s.k * 4) + 1);
    std::vector<std::vector<float>> grads;
    for (int64_t b = 0; b < buffers; ++b) grads.push_back(random_values(s.n * s.k, 4 + b));
    int64_t next = 0;
    const auto [fwd, fwd_peak] = time_with_peak(
        [&] { kernels::gemm(x.data(), kTokens, s.k, pw, y.data(), s.n, &pool, isa); }, peak,
        min_seconds);
    const auto [din, din_peak] = time_with_peak(
        [&] { kernels::gemm(dy.data(), kTokens, s.n, pwt, dx.data(), s.k, &pool, isa); }, peak,
        min_seconds);
    const auto [wgrad, wgrad_peak] = time_with_peak(
        [&] {
          float* g = grads[next++ % buffers].data();
          const float* left = g;
          const kernels::WeightGradPart part{0, s.n, g, {&left, 1}};
          kernels::gemm_weight_grad(dy.data(), s.n, x.data(), s.k, kTokens, {&part, 1}, s.k, &pool);
        },
        peak, min_seconds);
    const double flops = 2.0 * kTokens * s.n * s.k;
    const auto pct = [&](double secs) { return 100.0 * flops / secs / 1e9 / peak_gflops; };
    // Against the peak beside it: the GEMM's time over the FMA loop's time for the same FLOPs.
    const auto beside = [&](double secs, double peak_secs) {
      return 100.0 * (flops / peak_flops * peak_secs) / secs;
    };
    std::printf(
        "%-8s %6lld %5lld %8.1f%% %8.1f%% %8.1f%%   %.3f / %.3f / %.3f   %.1f / %.1f / %.1f\n",
        s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), pct(fwd), pct(din),
        pct(wgrad), fwd * 1e3, din * 1e3, wgrad * 1e3, beside(fwd, fwd_peak), beside(din, din_peak),
        beside(wgrad, wgrad_peak));
    step_s += kMicroBatches * s.per_step * (fwd + din + wgrad);
    step_flops += kMicroBatches * s.per_step * 3 * flops;
    step_at_window_peak +=
        kMicroBatches * s.per_step * flops / peak_flops * (fwd_peak + din_peak + wgrad_peak);
  }
  std::printf(
      "a step's GEMMs (%lld micro-batches): %.3f s, %.1f%% of the peak (%.3f s at the peak); "
      "%.1f%% of the peak beside each GEMM (%.3f s at it)\n",
      static_cast<long long>(kMicroBatches), step_s,
      100.0 * step_flops / step_s / 1e9 / peak_gflops, step_flops / 1e9 / peak_gflops,
      100.0 * step_at_window_peak / step_s, step_at_window_peak);
}

void bench_decode_gemm_rows(int threads, double peak_gflops, double min_seconds) {
  constexpr int kRows[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64};
  constexpr int kMaxRows = kRows[std::size(kRows) - 1];
  ThreadPool pool(threads);
  const kernels::Isa isa = kernels::detect_isa();
  std::vector<kernels::PackedMatrix> mats;
  std::vector<int64_t> n_of, k_of;
  double bytes = 0, flops_per_row = 0;
  for (const Shape& s : kSmolLM2)
    for (int64_t i = 0; i < s.per_step; ++i) {  // each matrix of its own, as the model's layers
      const auto w = random_values(s.n * s.k, 100 + static_cast<uint32_t>(mats.size()));
      mats.push_back(kernels::PackedMatrix::pack_f32(w.data(), s.n, s.k));
      n_of.push_back(s.n);
      k_of.push_back(s.k);
      bytes += 4.0 * s.n * s.k;
      flops_per_row += 2.0 * s.n * s.k;
    }
  const auto x = random_values(kMaxRows * 1536, 5);
  std::vector<float> y(kMaxRows * 49152);
  const double read_secs = plain_read_seconds(mats, pool, min_seconds);
  std::printf(
      "\nSmolLM2-135M decode GEMMs from memory (30 layers + LM head, %.0f MB), %d threads; a plain "
      "read of the same bytes on the pool: %.2f ms, %.1f GB/s (the limit):\n",
      bytes / 1e6, threads, read_secs * 1e3, bytes / read_secs / 1e9);
  std::printf("%4s %9s %9s %11s %9s %9s\n", "rows", "ms", "x 1 row", "GB/s read", "x limit",
              "% peak");
  double one = 0;
  for (const int m : kRows) {
    const double secs = time_per_call(
        [&] {
          for (size_t i = 0; i < mats.size(); ++i)
            kernels::gemm(x.data(), m, k_of[i], mats[i], y.data(), n_of[i], &pool, isa);
        },
        min_seconds);
    if (m == 1) one = secs;
    std::printf("%4d %9.2f %9.2f %11.1f %9.2f %8.1f%%\n", m, secs * 1e3, secs / one,
                bytes / secs / 1e9, secs / read_secs,
                100.0 * m * flops_per_row / secs / 1e9 / peak_gflops);
  }
}

}  // namespace miles::cli
