// `miles bench rollout`: the rollout engine's throughput and latency under closed-loop load, and
// what GRPO prefix sharing saves.
//
// Why: the engine is what an RL step waits on. This runs the real Engine in-process on its own
// thread behind an EngineDriver, as `miles serve` does but without HTTP, so the numbers are the
// engine's. For each concurrency c, c client threads send requests back to back (random prompts
// from a fixed seed, temperature 1, EOS ignored) until N are done: output tokens/s (with its ratio
// to c = 1), request latency and time to first token. Then groups of `--group` samples of one
// prompt, sent as one request with n = group (prefill once, fork), as separate requests with the
// prefix cache, and with the cache off (the baseline of the ratios): prompt positions computed and
// wall time. Every measurement gets a fresh engine (an empty cache) after a warm-up request.
// scripts/bench_llamacpp.py runs the same workload through llama.cpp and reads --json.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_closed_loop.h"
#include "cli/bench_grpo.h"
#include "cli/bench_percentiles.h"
#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/serve_tp.h"
#include "miles/draft_head.h"
#include "miles/kernels.h"
#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"

namespace miles::cli {

namespace {

struct RolloutBenchOptions {
  std::string model, tokenizer, json;
  std::vector<int> concurrency{1, 8, 32, 64};
  int64_t requests = 0;  // per concurrency level; 0: 2 x c, at least 8
  int64_t prompt_tokens = 64, output_tokens = 32;
  int threads = 0;             // 0: all cores (per process with --tp)
  int tp = 1;                  // tensor-parallel processes of the engine (miles serve --tp)
  std::string device = "cpu";  // where forwards run (miles serve --device)
  int group = 8, groups = 4;
  int64_t num_blocks = 0;  // 0: enough for the largest level
  int64_t max_batch_tokens = 2048;
  uint64_t seed = 1234;
  bool concurrency_set = false;
  bool spec = false;  // speculative decoding off vs on instead (bench_spec.cc)
  SpecBenchOptions spec_options;
};

int64_t requests_at(const RolloutBenchOptions& o, int c) {
  return o.requests > 0 ? o.requests : std::max<int64_t>(8, 2 * c);
}

Status validate(const RolloutBenchOptions& o, const ModelConfig& config) {
  if (o.prompt_tokens < 1) return Status::Error("--prompt-tokens must be at least 1");
  if (o.output_tokens < 1) return Status::Error("--output-tokens must be at least 1");
  if (o.prompt_tokens + o.output_tokens > config.max_position_embeddings)
    return Status::Error(
        "--prompt-tokens + --output-tokens = " + std::to_string(o.prompt_tokens + o.output_tokens) +
        " exceeds the model's context of " + std::to_string(config.max_position_embeddings));
  if (o.concurrency.empty()) return Status::Error("--concurrency: give at least one level");
  for (int c : o.concurrency)
    if (c < 1 || c > 4096)
      return Status::Error("--concurrency: " + std::to_string(c) + " is not in [1, 4096]");
  if (o.requests < 0) return Status::Error("--requests must be >= 0");
  if (o.group < 1 || o.group > 1024) return Status::Error("--group must be in [1, 1024]");
  if (o.groups < 0) return Status::Error("--groups must be >= 0");
  if (o.num_blocks < 0 || o.max_batch_tokens < 1)
    return Status::Error("--num-blocks must be >= 0 and --max-batch-tokens >= 1");
  return Status::Ok();
}

// The engine's shape: the KV pool holds every concurrent sample at full length, plus slack.
EngineOptions engine_options(const RolloutBenchOptions& o, bool prefix_cache) {
  EngineOptions e;
  e.max_batch_tokens = o.max_batch_tokens;
  e.enable_prefix_cache = prefix_cache;
  const int max_c = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  const int64_t samples = std::max<int64_t>(max_c, static_cast<int64_t>(o.groups) * o.group);
  const int64_t per_sample =
      (o.prompt_tokens + o.output_tokens + e.block_tokens - 1) / e.block_tokens;
  e.num_blocks = o.num_blocks > 0 ? o.num_blocks : samples * (per_sample + 1) + 16;
  e.max_running = std::max<int64_t>(e.max_running, samples);
  return e;
}

struct BenchContext {
  std::string model_path;
  int tp = 1;
  Device device = Device::kCpu;
  std::shared_ptr<const ModelFiles> files;  // the weights a device runner loads
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // may be null
  ThreadPool* pool = nullptr;
  LoadSpec spec;
};

// An engine on its own thread, and with --tp its followers (stopped after the engine).
struct BenchEngine {
  ServeTpGroup tp;
  std::unique_ptr<rollout::EngineDriver> driver;
};

// A fresh engine, warmed up by one short request, with an empty prefix cache.
Result<std::unique_ptr<BenchEngine>> start_engine(const BenchContext& ctx,
                                                  const EngineOptions& options) {
  auto e = std::make_unique<BenchEngine>();
  std::unique_ptr<ModelRunner> runner;
  if (ctx.tp > 1) {
    ServeTpOptions to;
    to.tp = ctx.tp;
    to.threads = ctx.pool->num_threads();
    MILES_ASSIGN_OR_RETURN(e->tp, start_serve_tp(ctx.model_path, to, options, ctx.pool));
    runner = std::move(e->tp.runner);
  } else if (ctx.device != Device::kCpu) {
    MILES_ASSIGN_OR_RETURN(runner, make_device_model_runner(ctx.device, ctx.files->config,
                                                            ctx.files->weights, options, ctx.pool));
  } else {
    runner = make_model_runner(ctx.model, ctx.pool);
  }
  e->driver = std::make_unique<rollout::EngineDriver>(
      std::make_unique<Engine>(std::move(runner), options, ctx.tokenizer));
  LoadSpec warm = ctx.spec;
  warm.output_tokens = 2;
  const LoadResult r = run_closed_loop(*e->driver, warm, 1, 1, /*first_index=*/1u << 30);
  if (!r.status.ok()) return r.status.with_context("warm-up");
  MILES_RETURN_IF_ERROR(e->driver->call<Status>([](Engine& en) { return en.flush_cache(); }));
  return e;
}

struct LevelRow {
  int concurrency = 0;
  int64_t requests = 0;
  LoadResult load;
  double tokens_per_s() const { return load.output_tokens / load.wall_s; }
};

Result<std::vector<LevelRow>> run_sweep(const RolloutBenchOptions& o, const BenchContext& ctx) {
  std::printf(
      "closed loop: c clients each send the next request when theirs finishes; cores = CPU "
      "seconds / wall seconds (at most --threads)\n");
  const std::string vs_first = "x c=" + std::to_string(o.concurrency.front());
  std::printf("%5s %8s %10s %7s %9s %9s %9s %9s %9s %6s\n", "c", "requests", "out tok/s",
              vs_first.c_str(), "lat p50 s", "lat p90 s", "lat p99 s", "ttft p50", "ttft p99",
              "cores");
  std::vector<LevelRow> rows;
  for (int c : o.concurrency) {
    MILES_ASSIGN_OR_RETURN(auto engine, start_engine(ctx, engine_options(o, true)));
    LevelRow row{c, requests_at(o, c), {}};
    row.load = run_closed_loop(*engine->driver, ctx.spec, c, row.requests);
    if (!row.load.status.ok())
      return row.load.status.with_context("concurrency " + std::to_string(c));
    const double base = rows.empty() ? row.tokens_per_s() : rows.front().tokens_per_s();
    const auto& lat = row.load.latency_s;
    const auto& ttft = row.load.ttft_s;
    std::printf("%5d %8lld %10.1f %7.2f %9.3f %9.3f %9.3f %9.3f %9.3f %6.2f\n", c,
                static_cast<long long>(row.requests), row.tokens_per_s(), row.tokens_per_s() / base,
                percentile(lat, 0.5), percentile(lat, 0.9), percentile(lat, 0.99),
                percentile(ttft, 0.5), percentile(ttft, 0.99), row.load.cpu_s / row.load.wall_s);
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
  return rows;
}

struct GrpoRow {
  const char* name;
  GrpoMode mode;
  GrpoResult result;
};

Result<std::vector<GrpoRow>> run_grpo_table(const RolloutBenchOptions& o, const BenchContext& ctx) {
  std::vector<GrpoRow> rows = {
      {"(a) 1 request, n=group", GrpoMode::kForkN, {}},
      {"(b) separate, cache, burst", GrpoMode::kSeparateBurst, {}},
      {"(b') separate, cache, leader 1st", GrpoMode::kSeparateLeaderFirst, {}},
      {"(c) separate, no cache", GrpoMode::kSeparateNoCache, {}},
  };
  for (GrpoRow& row : rows) {
    const bool cache = row.mode != GrpoMode::kSeparateNoCache;
    MILES_ASSIGN_OR_RETURN(auto engine, start_engine(ctx, engine_options(o, cache)));
    row.result =
        run_grpo(*engine->driver, ctx.spec, o.groups, o.group, row.mode, /*first_index=*/1u << 20);
    if (!row.result.status.ok()) return row.result.status.with_context(row.name);
  }
  const GrpoResult& base = rows.back().result;
  std::printf("\nGRPO prefix sharing: %d groups x %d samples of one prompt, all groups at once\n",
              o.groups, o.group);
  std::printf("%-33s %9s %9s %8s %10s %9s %9s %6s\n", "variant", "prefill", "cached", "wall s",
              "out tok/s", "prefill/c", "wall/c", "cores");
  for (const GrpoRow& row : rows) {
    const GrpoResult& r = row.result;
    std::printf("%-33s %9llu %9llu %8.2f %10.1f %9.3f %9.3f %6.2f\n", row.name,
                static_cast<unsigned long long>(r.prefill_tokens),
                static_cast<unsigned long long>(r.cached_tokens), r.wall_s,
                r.output_tokens / r.wall_s,
                static_cast<double>(r.prefill_tokens) / static_cast<double>(base.prefill_tokens),
                r.wall_s / base.wall_s, r.cpu_s / r.wall_s);
  }
  return rows;
}

Status write_json(const std::string& path, const RolloutBenchOptions& o, int threads,
                  const std::vector<LevelRow>& levels, const std::vector<GrpoRow>& grpo) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return Status::Error("--json: cannot write " + path);
  std::fprintf(f,
               "{\"model\": \"%s\", \"threads\": %d, \"tp\": %d, \"prompt_tokens\": %lld, "
               "\"output_tokens\": %lld,\n",
               o.model.c_str(), threads, o.tp, static_cast<long long>(o.prompt_tokens),
               static_cast<long long>(o.output_tokens));
  std::fprintf(f, " \"levels\": [");
  for (size_t i = 0; i < levels.size(); ++i) {
    const LevelRow& r = levels[i];
    std::fprintf(f,
                 "%s\n  {\"concurrency\": %d, \"requests\": %lld, \"output_tokens_per_s\": %.3f, "
                 "\"latency_p50_s\": %.4f, \"latency_p99_s\": %.4f, \"ttft_p50_s\": %.4f, "
                 "\"ttft_p99_s\": %.4f, \"cores\": %.3f}",
                 i ? "," : "", r.concurrency, static_cast<long long>(r.requests), r.tokens_per_s(),
                 percentile(r.load.latency_s, 0.5), percentile(r.load.latency_s, 0.99),
                 percentile(r.load.ttft_s, 0.5), percentile(r.load.ttft_s, 0.99),
                 r.load.cpu_s / r.load.wall_s);
  }
  std::fprintf(f, "],\n \"grpo\": [");
  for (size_t i = 0; i < grpo.size(); ++i) {
    const GrpoResult& r = grpo[i].result;
    std::fprintf(f,
                 "%s\n  {\"variant\": \"%s\", \"prefill_tokens\": %llu, \"cached_tokens\": %llu, "
                 "\"wall_s\": %.4f, \"cores\": %.3f}",
                 i ? "," : "", grpo[i].name, static_cast<unsigned long long>(r.prefill_tokens),
                 static_cast<unsigned long long>(r.cached_tokens), r.wall_s, r.cpu_s / r.wall_s);
  }
  std::fprintf(f, "]}\n");
  return std::fclose(f) == 0 ? Status::Ok() : Status::Error("--json: error writing " + path);
}

int run_bench_rollout(const RolloutBenchOptions& o) {
  auto device = parse_device(o.device);
  if (!device.ok()) return fail("bench rollout", device.message());
  if (*device != Device::kCpu && o.tp > 1)
    return fail("bench rollout", "--device " + o.device + " with --tp > 1 is not supported");
  auto files = load_model_files(o.model);
  if (!files.ok()) return fail("bench rollout", files.message());
  auto model = Model::from_weights(files->config, files->weights);
  if (!model.ok()) return fail("bench rollout", model.message());
  BenchContext ctx;
  ctx.model_path = o.model;
  ctx.tp = o.tp;
  ctx.device = *device;
  ctx.files = std::make_shared<const ModelFiles>(std::move(files).value());
  ctx.model = std::shared_ptr<const Model>(std::move(model).value());
  const ModelConfig& config = ctx.model->config();
  if (Status s = validate(o, config); !s.ok()) return fail("bench rollout", s.message());
  auto tok = find_tokenizer(o.model, o.tokenizer, static_cast<int32_t>(config.vocab_size));
  if (tok.ok()) {
    ctx.tokenizer = std::move(tok).value();
  } else if (!o.tokenizer.empty() || o.spec) {
    return fail("bench rollout", tok.message());
  }
  if (o.spec) {
    if (o.tp > 1 || *device != Device::kCpu)
      return fail("bench rollout", "--spec runs in-process CPU engines (no --tp, --device)");
    ThreadPool pool(o.threads);
    SpecBenchOptions so = o.spec_options;
    so.model = o.model;
    so.json = o.json;
    if (!o.concurrency_set)
      so.concurrency = {1, 8, 32};
    else
      so.concurrency = o.concurrency;
    return run_spec_bench(so, ctx.model, ctx.tokenizer, pool);
  }
  const int threads =
      o.threads == 0 && o.tp > 1
          ? std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o.tp)
          : o.threads;
  ThreadPool pool(threads);
  ctx.pool = &pool;
  ctx.spec = {o.prompt_tokens, o.output_tokens, static_cast<int32_t>(config.vocab_size), o.seed};
  std::printf(
      "miles bench rollout: %s, %s%s%d threads (%s), prompt %lld + output %lld tokens, "
      "temperature 1, ignore_eos\n",
      std::filesystem::path(o.model).filename().c_str(),
      *device != Device::kCpu ? ("forwards on " + o.device + " (host: sampling), ").c_str() : "",
      o.tp > 1 ? ("tensor parallel over " + std::to_string(o.tp) +
                  " processes (cores: rank 0's only), each ")
                     .c_str()
               : "",
      pool.num_threads(), kernels::isa_name(kernels::detect_isa()),
      static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.output_tokens));
  auto levels = run_sweep(o, ctx);
  if (!levels.ok()) return fail("bench rollout", levels.message());
  std::vector<GrpoRow> grpo;
  if (o.groups > 0) {
    auto rows = run_grpo_table(o, ctx);
    if (!rows.ok()) return fail("bench rollout", rows.message());
    grpo = std::move(rows).value();
  }
  if (!o.json.empty()) {
    if (Status s = write_json(o.json, o, pool.num_threads(), *levels, grpo); !s.ok())
      return fail("bench rollout", s.message());
  }
  return 0;
}

}  // namespace

void register_bench_rollout(CLI::App& bench) {
  auto o = std::make_shared<RolloutBenchOptions>();
  CLI::App* r =
      bench.add_subcommand("rollout", "Engine throughput, latency and GRPO prefix sharing");
  r->add_option("--model", o->model, "HF model directory or llama2.c checkpoint")->required();
  r->add_option("--tokenizer", o->tokenizer,
                "tokenizer (default: found beside the model, optional)");
  r->add_option("--concurrency", o->concurrency, "client counts, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  r->add_option("--requests", o->requests, "requests per level (0: 2 x concurrency, at least 8)")
      ->capture_default_str();
  r->add_option("--prompt-tokens", o->prompt_tokens, "prompt length P (random ids)")
      ->capture_default_str();
  r->add_option("--output-tokens", o->output_tokens, "new tokens O per request")
      ->capture_default_str();
  r->add_option("--threads", o->threads, "compute threads (0 = all cores)")->capture_default_str();
  r->add_option("--tp", o->tp, "tensor-parallel processes of the engine (as miles serve --tp)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  r->add_option("--device", o->device, "where forwards run: cpu, cuda or emulated")
      ->capture_default_str()
      ->check(CLI::IsMember(device_names()));
  r->add_option("--group", o->group, "GRPO group size")->capture_default_str();
  r->add_option("--groups", o->groups, "GRPO groups sent at once (0: skip the GRPO comparison)")
      ->capture_default_str();
  r->add_option("--num-blocks", o->num_blocks, "KV blocks (0: enough for the largest level)")
      ->capture_default_str();
  r->add_option("--max-batch-tokens", o->max_batch_tokens, "token budget per iteration")
      ->capture_default_str();
  r->add_option("--seed", o->seed, "seed of prompts and sampling")->capture_default_str();
  r->add_option("--json", o->json, "also write the results as JSON to this file");
  CLI::Option* spec =
      r->add_flag("--spec", o->spec,
                  "speculative decoding off vs on (model-free drafter, co-trained draft head) on "
                  "GRPO workloads of arithmetic and story prompts (concurrency default 1,8,32)");
  r->add_option("--spec-prompts", o->spec_options.prompts, "--spec: prompts per task and epoch")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->needs(spec);
  r->add_option("--spec-max-draft-tokens", o->spec_options.max_draft_tokens,
                "--spec: drafted tokens verified per sample and iteration")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->needs(spec);
  r->add_option("--spec-temperature", o->spec_options.temperature,
                "--spec: sampling temperature (1: RL's; 0: greedy, an evaluation's)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0))
      ->needs(spec);
  r->add_option("--spec-arithmetic-data", o->spec_options.arithmetic_data,
                "--spec: JSONL with a \"prompt\" per line")
      ->capture_default_str()
      ->needs(spec);
  r->add_flag("!--spec-no-head", o->spec_options.head,
              "--spec: leave out the co-trained draft head's column")
      ->needs(spec);
  r->add_flag("!--spec-verify-all", o->spec_options.adaptive,
              "--spec: verify every proposal (no adaptive policy: its choices follow timings)")
      ->needs(spec);
  r->add_option("--spec-head-epochs", o->spec_options.head_epochs,
                "--spec: plain epochs of each task's prompts the draft head is fitted on")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->needs(spec);
  r->add_option("--spec-head-passes", o->spec_options.head_passes,
                "--spec: the draft head's passes over them")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000))
      ->needs(spec);
  r->add_option("--spec-tasks", o->spec_options.tasks, "--spec: the workloads to run")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::IsMember({"arithmetic", "story"}))
      ->needs(spec);
  r->add_option("--spec-head-layers", o->spec_options.head_layers,
                "--spec: the policy layers whose outputs the draft head reads (ascending; "
                "default: the last; several: EAGLE-3's features)")
      ->delimiter(',')
      ->needs(spec);
  r->add_option("--spec-head-ttt-length", o->spec_options.head_ttt_length,
                "--spec: the draft head's training passes per sample (> 1: also trained on its "
                "own drafts, EAGLE-3's training-time test)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, DraftHead::kMaxPasses))
      ->needs(spec);
  r->add_option("--spec-head-batch", o->spec_options.head_batch,
                "--spec: samples per AdamW step of the draft head")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000))
      ->needs(spec);
  r->add_option("--spec-head-lr", o->spec_options.head_lr, "--spec: the draft head's AdamW lr")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(spec);
  r->callback([o, r] {
    o->concurrency_set = r->count("--concurrency") > 0;
    if (int rc = run_bench_rollout(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
