// `miles bench kernels`: GEMM GFLOP/s as a fraction of the FMA peak measured in the same run (one thread
// and all threads), and the model's forward tokens/s (prefill and decode).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/bench_gemm_shapes.h"
#include "cli/bench_peak.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/kernels.h"
#include "miles/model.h"
#include "miles/thread_pool.h"

namespace miles::kernels::detail {
float fma_loop_avx512(int64_t iters);
float fma_loop_avx2(int64_t iters);
}  // namespace miles::kernels::detail

namespace miles::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  int threads = 0;
  std::string model;
  double min_seconds = 0.5;
};

// One run of the ISA's FMA loop (independent chains, no loads), `iters` steps.
void fma_loop(kernels::Isa isa, int64_t iters) {
  volatile float sink = isa == kernels::Isa::kAvx512 ? kernels::detail::fma_loop_avx512(iters)
                                                     : kernels::detail::fma_loop_avx2(iters);
  (void)sink;
}

// The FLOPs of one run of fma_loop.
double fma_loop_flops(kernels::Isa isa, int64_t iters) {
  return (isa == kernels::Isa::kAvx512 ? 16 * 16 * 2 : 12 * 8 * 2) * static_cast<double>(iters);
}

}  // namespace

// GFLOP/s of independent fma chains on `threads` threads at once (bench_peak.h).
double fma_peak_gflops(kernels::Isa isa, int threads, double min_seconds) {
  const int64_t iters = 2'000'000;
  const double secs = time_per_call(
      [&] {
        std::vector<std::thread> ts;
        for (int i = 1; i < threads; ++i) ts.emplace_back([&] { fma_loop(isa, iters); });
        fma_loop(isa, iters);
        for (auto& t : ts) t.join();
      },
      min_seconds);
  return fma_loop_flops(isa, iters) * threads / secs / 1e9;
}

double fma_loop_on_pool(ThreadPool& pool, kernels::Isa isa, int64_t iters) {
  const int threads = pool.num_threads();
  pool.parallel_for(threads, [&](int64_t) { fma_loop(isa, iters); });
  return fma_loop_flops(isa, iters) * threads;
}

namespace {

void bench_gemm(const BenchOptions& o, int all_threads) {
  const kernels::Isa isa = kernels::detect_isa();
  if (isa == kernels::Isa::kScalar) {
    std::printf("no AVX2/AVX-512: skipping the GEMM benchmark\n");
    return;
  }
  const double peak1 = fma_peak_gflops(isa, 1, o.min_seconds);
  const double peak_all = fma_peak_gflops(isa, all_threads, o.min_seconds);
  std::printf("isa %s; FMA peak measured: %.1f GFLOP/s (1 thread), %.1f GFLOP/s (%d threads)\n",
              kernels::isa_name(isa), peak1, peak_all, all_threads);
  const int64_t n = 2048, k = 2048;
  const std::vector<float> w = random_values(n * k, 1), x = random_values(512 * k, 2);
  std::vector<float> y(512 * n);
  const kernels::PackedMatrix pw = kernels::PackedMatrix::pack_f32(w.data(), n, k);
  std::printf("%-22s %8s %10s %8s\n", "gemm M x N x K", "threads", "GFLOP/s", "% peak");
  for (int threads : {1, all_threads}) {
    ThreadPool pool(threads);
    const double peak = threads == 1 ? peak1 : peak_all;
    for (int64_t m : {1, 8, 64, 96, 128, 256, 512}) {
      const double secs = time_per_call(
          [&] { kernels::gemm(x.data(), m, k, pw, y.data(), n, &pool, isa); }, o.min_seconds);
      const double gflops = 2.0 * m * n * k / secs / 1e9;
      std::printf("%4lld x %lld x %lld %9d %10.1f %7.1f%%\n", static_cast<long long>(m),
                  static_cast<long long>(n), static_cast<long long>(k), threads, gflops,
                  100.0 * gflops / peak);
    }
    if (all_threads == 1) break;
  }
  bench_train_gemm_shapes(all_threads, peak_all, o.min_seconds);
  bench_decode_gemm_rows(all_threads, peak_all, o.min_seconds);
}

std::string default_model() {
  const char* shared = std::getenv("MILES_SHARED_DIR");
  const std::string dir = shared ? shared : std::string(MILES_SOURCE_DIR) + "/../shared";
  return dir + "/models/stories260K/stories260K.bin";
}

// Prefill of one sequence, then decode steps of `batch` sequences at once (each step one token per
// sequence, all packed in one forward), as the rollout engine runs them.
int bench_forward(const BenchOptions& o, int threads) {
  const std::string path = o.model.empty() ? default_model() : o.model;
  auto model = Model::load(path);
  if (!model.ok()) return fail("bench kernels", model.message());
  const Model& m = **model;
  ThreadPool pool(threads);
  const int64_t prompt = std::min<int64_t>(128, m.config().max_position_embeddings / 2);
  const int64_t decode = std::min<int64_t>(32, m.config().max_position_embeddings - prompt);
  std::vector<int32_t> ids(prompt);
  for (int64_t i = 0; i < prompt; ++i) ids[i] = static_cast<int32_t>((i * 7919) % m.config().vocab_size);
  ForwardOptions fo;
  fo.all_logits = false;
  const std::string name = std::filesystem::path(path).filename().string();
  for (int64_t batch : {int64_t{1}, int64_t{32}}) {
    double prefill_s = 1e30, decode_s = 1e30;
    for (int rep = 0; rep < (batch == 1 ? 2 : 1); ++rep) {
      auto kv = m.make_kv_cache();
      auto t0 = Clock::now();
      for (int64_t b = 0; b < batch; ++b) {
        SeqSpan s{static_cast<int32_t>(b), 0, prompt};
        auto r = m.forward(ids, {&s, 1}, *kv, fo, &pool);
        if (!r.ok()) return fail("bench kernels", r.message());
        if (b == 0) prefill_s = std::min(prefill_s, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      auto t1 = Clock::now();
      for (int64_t i = 0; i < decode; ++i) {
        std::vector<int32_t> toks(batch, ids[i]);
        std::vector<SeqSpan> spans;
        for (int64_t b = 0; b < batch; ++b) spans.push_back({static_cast<int32_t>(b), prompt + i, 1});
        auto r = m.forward(toks, spans, *kv, fo, &pool);
        if (!r.ok()) return fail("bench kernels", r.message());
      }
      decode_s = std::min(decode_s, std::chrono::duration<double>(Clock::now() - t1).count());
    }
    if (batch == 1)
      std::printf("forward %s (%d threads): prefill %lld tokens: %.0f tokens/s\n", name.c_str(), threads,
                  static_cast<long long>(prompt), prompt / prefill_s);
    std::printf("forward %s (%d threads): decode batch %lld: %.1f tokens/s (%lld steps after a %lld-token "
                "prompt)\n",
                name.c_str(), threads, static_cast<long long>(batch), batch * decode / decode_s,
                static_cast<long long>(decode), static_cast<long long>(prompt));
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (ratios against measured limits)");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchOptions>();
  CLI::App* k = bench->add_subcommand("kernels", "GEMM vs FMA peak, model forward tokens/s");
  k->add_option("--threads", o->threads, "threads for the all-threads runs (0 = all cores)");
  k->add_option("--model", o->model, "model for the forward benchmark (default: stories260K)");
  k->add_option("--min-seconds", o->min_seconds, "time per measurement")->capture_default_str();
  k->callback([o] {
    const int all = o->threads > 0 ? o->threads
                                   : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    bench_gemm(*o, all);
    int rc = bench_forward(*o, 1);
    if (rc == 0 && all > 1) rc = bench_forward(*o, all);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
  register_bench_rollout(*bench);
  register_bench_train(*bench);
  register_bench_sync(*bench);
  register_bench_step(*bench);
}

}  // namespace miles::cli
