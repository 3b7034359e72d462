// `miles bench train`: tokens/s of a whole training step (forward + backward + AdamW) on a fixed
// synthetic SFT batch, its model FLOPs and MFU against the FMA peak measured in the same run, and
// where the step's time goes.
//
// Why: the learner's throughput is half of an RL step. This runs Trainer::step exactly as training
// does (micro-batches, tree-summed gradients, clipping, AdamW, model rebuilt from the new weights)
// on `--batch` samples of `--seq-len` token ids drawn from a documented generator, so that
// scripts/bench_train_torch.py can feed the very same ids to PyTorch and compare.
//
// Token ids: a splitmix64 stream seeded with --seed, drawn sample by sample, position by position;
// id = next() mod vocab, except position 0, which is the model's BOS id when it has one. Every
// token after the first is trained (response_length = seq_len − 1, loss mask 1): the SFT token-mean
// NLL.
//
// --paced hands the pace to a driver on stdin, so that another framework's steps can alternate
// with these in one run (scripts/bench_train_torch.py --paired): the machine's speed drifts, and
// steps taken seconds apart see the same machine. Protocol: "paced: waiting" on stdout, then one
// line read from stdin before the FMA peak, before each step and before the breakdown; after each
// step "paced: step K SECONDS LOSS CORES" (K = 0 for warm-up steps). A closed stdin stops the run.
//
// Hidden --export-hf DIR writes the loaded model (e.g. a llama2.c file) as an HF Llama directory
// (config.json + model.safetensors) so that transformers trains the same weights.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_peak.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/checkpoint.h"
#include "miles/device_model.h"
#include "miles/flat_params.h"
#include "miles/kernels.h"
#include "miles/logprob.h"
#include "miles/model.h"
#include "miles/trainer/optimizer.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"

namespace miles::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct TrainBenchOptions {
  std::string model, json, export_hf;
  int64_t batch = 4, seq_len = 256, steps = 5, warmup = 1, micro_batch_size = 1;
  int threads = 0;  // 0: all cores
  uint64_t seed = 1234;
  double lr = 1e-5;
  double peak_seconds = 0.5;
  bool no_breakdown = false;
  bool paced = false;  // wait for a line on stdin before the peak, each step and the breakdown
  std::string device = "cpu";  // where forward and backward run (TrainerConfig::device)
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU seconds of every thread of this process (for "cores" = CPU seconds / wall seconds).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<TrainSample> make_batch(const TrainBenchOptions& o, const ModelConfig& c) {
  uint64_t state = o.seed;
  std::vector<TrainSample> batch(o.batch);
  for (TrainSample& s : batch) {
    s.tokens.resize(o.seq_len);
    for (int64_t i = 0; i < o.seq_len; ++i)
      s.tokens[i] = static_cast<int32_t>(splitmix64(state) % static_cast<uint64_t>(c.vocab_size));
    if (c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size)
      s.tokens[0] = static_cast<int32_t>(c.bos_token_id);
    s.response_length = o.seq_len - 1;
    s.loss_mask.assign(o.seq_len - 1, 1.0f);
  }
  return batch;
}

Status validate(const TrainBenchOptions& o, const ModelConfig& c) {
  if (o.batch < 1) return Status::Error("--batch must be at least 1");
  if (o.seq_len < 2) return Status::Error("--seq-len must be at least 2");
  if (o.seq_len - 1 > c.max_position_embeddings)
    return Status::Error(
        "--seq-len " + std::to_string(o.seq_len) + ": its " + std::to_string(o.seq_len - 1) +
        " input tokens exceed the model's context of " + std::to_string(c.max_position_embeddings));
  if (o.steps < 1) return Status::Error("--steps must be at least 1");
  if (o.warmup < 0) return Status::Error("--warmup must be >= 0");
  if (o.micro_batch_size < 1 || o.batch % o.micro_batch_size != 0)
    return Status::Error("--batch must be a multiple of --micro-batch-size (>= 1)");
  return Status::Ok();
}

// Parameters whose product with an activation is a GEMM (everything but norms and the embedding
// lookup; the LM head counts once, tied or not): per token, forward 2·N, backward 4·N flops.
struct FlopModel {
  int64_t params_total = 0;
  int64_t params_matmul = 0;  // active per token (MoE: top_k experts + router)
  double attention_per_token = 0;
  double per_token() const { return 6.0 * params_matmul + attention_per_token; }
};

FlopModel flop_model(const ModelConfig& c, const FlatTensors& params, int64_t seq_len) {
  FlopModel f;
  for (const ParamSpec& s : params.layout().specs()) f.params_total += s.numel;
  const int64_t d = c.hidden_size;
  int64_t per_layer_attn = d * c.q_dim() + 2 * d * c.kv_dim() + c.q_dim() * d;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    int64_t mlp = 3 * d * c.intermediate_size;
    if (c.is_moe_layer(l))
      mlp = c.moe.top_k * 3 * d * c.moe.moe_intermediate_size + d * c.moe.num_experts;
    f.params_matmul += per_layer_attn + mlp;
  }
  f.params_matmul += c.vocab_size * d;
  // Causal attention over an n = seq_len − 1 token input: QKᵀ and PV are 2·q_dim·ctx flops each per
  // token and layer, ctx averaging (n + 1) / 2; forward + backward = 3 × forward.
  const double n = static_cast<double>(seq_len - 1);
  f.attention_per_token = 3.0 * 4.0 * c.num_layers * c.q_dim() * (n + 1) / 2.0;
  return f;
}

struct Breakdown {
  double forward = 0, loss_head = 0, backward = 0, optimizer = 0, rebuild = 0;
  double total() const { return forward + loss_head + backward + optimizer + rebuild; }
};

// One step through the public pieces Trainer::step is made of, timing each: the forward with its
// tape (buffers reused across micro-batches, as the trainer's), the loss head (logprobs, SFT
// objective, their backward, over the pool and in place as the trainer's), Model::backward with
// the micro-batch sum folded in, clip + AdamW, and Trainer::reload_model (every weight repacked
// from the new parameters, the backward's transposed packs in the same pass).
Result<Breakdown> measure_breakdown(Trainer& tr, std::span<const TrainSample> batch, int64_t mbs,
                                    double lr, ThreadPool* pool) {
  Breakdown b;
  const ModelConfig& c = tr.model_config();
  const int64_t v = c.vocab_size;
  const double total_tokens = static_cast<double>(batch.size()) * (batch[0].tokens.size() - 1);
  const TokenObjective objective = sft_objective(batch, total_tokens);
  FlatTensors acc(tr.params().layout_ptr()), scratch(tr.params().layout_ptr());
  ForwardTape tape;  // reused by every micro-batch, as the trainer does, and so are the logits
  std::vector<float> logits_storage;
  for (int64_t first = 0; first < static_cast<int64_t>(batch.size()); first += mbs) {
    std::vector<int32_t> tokens;
    std::vector<SeqSpan> seqs;
    std::vector<int32_t> targets;
    std::vector<int64_t> samples, offsets{0};
    for (int64_t s = first; s < first + mbs; ++s) {
      const std::vector<int32_t>& t = batch[s].tokens;
      seqs.push_back({static_cast<int32_t>(s - first), 0, static_cast<int64_t>(t.size()) - 1});
      tokens.insert(tokens.end(), t.begin(), t.end() - 1);
      targets.insert(targets.end(), t.begin() + 1, t.end());
      samples.push_back(s);
      offsets.push_back(static_cast<int64_t>(targets.size()));
    }
    const Model& m = tr.model();
    ForwardOptions fo;
    fo.tape = &tape;
    fo.logits_storage = &logits_storage;
    if (first == 0) {  // the trainer reuses its tapes' buffers: fill this one once, untimed
      auto kv = m.make_kv_cache();
      MILES_RETURN_IF_ERROR(m.forward(tokens, seqs, *kv, fo, pool).status());
    }
    auto t0 = Clock::now();
    auto kv = m.make_kv_cache();
    MILES_ASSIGN_OR_RETURN(ForwardOutput out, m.forward(tokens, seqs, *kv, fo, pool));
    b.forward += seconds_since(t0);

    t0 = Clock::now();
    // As the trainer's loss head does it: rows spread over the pool, d logits written over the
    // logits in place (each row's kernel reads its logits whole first). Every row is trained here.
    const int64_t n = static_cast<int64_t>(targets.size());
    MILES_CHECK(static_cast<int64_t>(out.logits.size()) == n * v);
    std::vector<float> logp(n);
    std::vector<kernels::LogSoftmaxStats> stats(n);
    parallel_ranges(pool, n, 4 * v, [&](int64_t r0, int64_t r1) {
      token_logprobs(out.logits.data() + r0 * v, r1 - r0, v, targets.data() + r0, logp.data() + r0,
                     nullptr, stats.data() + r0);
    });
    MILES_ASSIGN_OR_RETURN(TokenLoss loss, objective(TokenView{samples, offsets, logp, {}}));
    std::vector<float> dlogits = std::move(out.logits);
    parallel_ranges(pool, n, 8 * v, [&](int64_t r0, int64_t r1) {
      token_logprobs_backward(dlogits.data() + r0 * v, r1 - r0, v, targets.data() + r0,
                              loss.dlogp.data() + r0, nullptr, dlogits.data() + r0 * v,
                              stats.data() + r0);
    });
    b.loss_head += seconds_since(t0);

    // The sum over micro-batches is folded into the backward as its GEMMs store the weight
    // gradients (BackwardIo::fold; a running sum here, the trainer's tree folds the same way).
    BackwardIo io;
    if (first > 0) io.fold = {&acc};
    t0 = Clock::now();
    MILES_RETURN_IF_ERROR(m.backward(tape, dlogits, first > 0 ? scratch : acc, pool, io));
    b.backward += seconds_since(t0);
    logits_storage = std::move(dlogits);
  }
  auto t0 = Clock::now();
  const float clip = clip_scale(global_grad_norm(acc), tr.config().optimizer.clip_grad_norm);
  tr.optimizer().step(tr.mutable_params(), acc, lr, nullptr, pool, clip);  // as Trainer::step
  b.optimizer = seconds_since(t0);
  t0 = Clock::now();
  MILES_RETURN_IF_ERROR(tr.reload_model());
  b.rebuild = seconds_since(t0);
  return b;
}

// config.json (model_config_to_hf_json) + model.safetensors: the same weights for the torch side.
Status export_hf(const ModelFiles& files, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error("--export-hf: cannot create " + dir + ": " + ec.message());
  std::ofstream config(dir + "/config.json");
  config << model_config_to_hf_json(files.config);
  if (!config.flush()) return Status::Error("--export-hf: cannot write " + dir + "/config.json");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : files.weights.names())
    tensors.emplace_back(name, *files.weights.find(name));
  return write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

// --paced: says it waits, then blocks until the driver sends a line; false once stdin is closed.
bool wait_for_driver(bool paced) {
  if (!paced) return true;
  std::printf("paced: waiting\n");
  std::fflush(stdout);
  std::string line;
  return static_cast<bool>(std::getline(std::cin, line));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// What the timed steps measured, and the figures derived from them.
struct TrainBenchRun {
  std::string name;  // the model directory's name
  int threads = 0;
  kernels::Isa isa = kernels::Isa::kScalar;
  int64_t tokens_per_step = 0;
  FlopModel fm;
  double peak = 0;  // GFLOP/s, measured now (0 on the scalar path)
  double initial_loss = 0;
  std::vector<double> times, cores;  // per timed step: seconds, CPU s / wall s
  bool breakdown = false;            // b was measured
  Breakdown b;
  double t_med() const { return median(times); }
  double t_best() const { return *std::min_element(times.begin(), times.end()); }
  double tokens_per_s() const { return tokens_per_step / t_med(); }
  double gflops() const { return fm.per_token() * tokens_per_s() / 1e9; }
  double mfu() const { return peak > 0 ? gflops() / peak : 0.0; }
};

void print_header(const TrainBenchOptions& o, const TrainBenchRun& run, Device device) {
  std::printf(
      "miles bench train: %s, %d threads (%s), batch %lld x seq-len %lld = %lld trained tokens per "
      "step, micro-batch %lld, SFT token-mean NLL, AdamW (lr %g, betas 0.9/0.95, wd 0, clip 1.0)\n",
      run.name.c_str(), run.threads, kernels::isa_name(run.isa), static_cast<long long>(o.batch),
      static_cast<long long>(o.seq_len), static_cast<long long>(run.tokens_per_step),
      static_cast<long long>(o.micro_batch_size), o.lr);
  std::printf("FMA peak measured now on %d threads: %.1f GFLOP/s\n", run.threads, run.peak);
  if (device != Device::kCpu)
    std::printf(
        "forward and backward on %s (the loss head and AdamW on the host): MFU below is "
        "against the CPU's peak, for scale only; no piece-by-piece breakdown\n",
        o.device.c_str());
  std::printf("%5s %10s %10s %12s %6s\n", "step", "time s", "tokens/s", "loss", "cores");
}

// The warm-up and timed steps, a line each (and a `paced:` line under --paced); the timed ones'
// seconds and cores into `run`. False once a paced driver closed stdin.
Result<bool> time_steps(const TrainBenchOptions& o, Trainer& tr,
                        const std::vector<TrainSample>& batch, const TokenObjective& objective,
                        TrainBenchRun& run) {
  for (int64_t k = 0; k < o.warmup + o.steps; ++k) {
    if (!wait_for_driver(o.paced)) return false;
    const double c0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    MILES_ASSIGN_OR_RETURN(const auto r, tr.step(batch, objective));
    const double secs = seconds_since(t0), cpu = process_cpu_seconds() - c0;
    if (k == 0) run.initial_loss = r.loss;
    const bool warm = k < o.warmup;
    std::printf("%5s %10.3f %10.1f %12.6f %6.2f\n",
                warm ? "warm" : std::to_string(k - o.warmup + 1).c_str(), secs,
                run.tokens_per_step / secs, r.loss, cpu / secs);
    if (o.paced)
      std::printf("paced: step %lld %.6f %.6f %.4f\n",
                  static_cast<long long>(warm ? 0 : k - o.warmup + 1), secs, r.loss, cpu / secs);
    std::fflush(stdout);
    if (!warm) {
      run.times.push_back(secs);
      run.cores.push_back(cpu / secs);
    }
  }
  return true;
}

void print_summary(const TrainBenchOptions& o, const TrainBenchRun& run) {
  const FlopModel& fm = run.fm;
  std::printf("\n| %-40s | %s |\n|---|---|\n", "miles bench train", run.name.c_str());
  std::printf("| %-40s | %.1f (best step %.1f) |\n", "tokens/s (median step)", run.tokens_per_s(),
              run.tokens_per_step / run.t_best());
  std::printf("| %-40s | %.4f s (best %.4f s, %lld steps) |\n", "step time (median)", run.t_med(),
              run.t_best(), static_cast<long long>(o.steps));
  std::printf("| %-40s | %lld total, %lld in GEMMs |\n", "parameters",
              static_cast<long long>(fm.params_total), static_cast<long long>(fm.params_matmul));
  std::printf("| %-40s | %.4g = 6 x %lld + %.4g attention |\n", "model FLOPs / token",
              fm.per_token(), static_cast<long long>(fm.params_matmul), fm.attention_per_token);
  std::printf("| %-40s | %.2f |\n", "achieved GFLOP/s", run.gflops());
  std::printf("| %-40s | %.1f %% of %.1f GFLOP/s |\n", "MFU (vs FMA peak measured now)",
              100.0 * run.mfu(), run.peak);
  std::printf("| %-40s | %.2f |\n", "cores (CPU s / wall s, median)", median(run.cores));
  std::printf("| %-40s | %.6f |\n", "initial loss", run.initial_loss);
  std::printf(
      "FLOPs/token = 6 x GEMM parameters (q,k,v,o, MLP, LM head once; embedding lookup and norms "
      "excluded) + 12 x layers x q_dim x (seq_len) / 2 (causal attention QK^T and PV, forward + "
      "backward)\n");
}

void print_breakdown(const Breakdown& b) {
  const double tot = b.total();
  std::printf("\nbreakdown of one more step, timed piece by piece (%.3f s in all):\n", tot);
  auto row = [&](const char* what, double s) {
    std::printf("  %-58s %8.4f s %5.1f %%\n", what, s, 100.0 * s / tot);
  };
  row("forward (with tape, all-position logits)", b.forward);
  row("loss head (logprobs, objective, their backward)", b.loss_head);
  row("backward (Model::backward, the micro-batch sum folded in)", b.backward);
  row("clip + AdamW", b.optimizer);
  row("model rebuild (Trainer::reload_model: both weight packs)", b.rebuild);
}

// --json: the run's settings, every timed step, the derived figures and the batch's token ids.
Status write_json(const TrainBenchOptions& o, const TrainBenchRun& run,
                  const std::vector<TrainSample>& batch) {
  nlohmann::ordered_json j;
  j["model"] = o.model;
  j["threads"] = run.threads;
  j["isa"] = kernels::isa_name(run.isa);
  j["batch"] = o.batch;
  j["seq_len"] = o.seq_len;
  j["micro_batch_size"] = o.micro_batch_size;
  j["seed"] = o.seed;
  j["tokens_per_step"] = run.tokens_per_step;
  j["step_times_s"] = run.times;
  j["cores"] = run.cores;
  j["tokens_per_s"] = run.tokens_per_s();
  j["tokens_per_s_best"] = run.tokens_per_step / run.t_best();
  j["flops_per_token"] = run.fm.per_token();
  j["params_total"] = run.fm.params_total;
  j["params_matmul"] = run.fm.params_matmul;
  j["gflops"] = run.gflops();
  j["peak_gflops"] = run.peak;
  j["mfu"] = run.mfu();
  j["initial_loss"] = run.initial_loss;
  j["device"] = o.device;
  if (run.breakdown)
    j["breakdown_s"] = {{"forward", run.b.forward},
                        {"loss_head", run.b.loss_head},
                        {"backward", run.b.backward},
                        {"optimizer", run.b.optimizer},
                        {"rebuild", run.b.rebuild}};
  std::vector<std::vector<int32_t>> ids;
  for (const TrainSample& s : batch) ids.push_back(s.tokens);
  j["tokens"] = ids;
  std::ofstream f(o.json);
  f << j.dump() << "\n";
  if (!f) return Status::Error("--json: cannot write " + o.json);
  return Status::Ok();
}

int run_bench_train(const TrainBenchOptions& o) {
  auto files = load_model_files(o.model);
  if (!files.ok()) return fail("bench train", files.message());
  if (!o.export_hf.empty()) {
    if (Status s = export_hf(*files, o.export_hf); !s.ok()) return fail("bench train", s.message());
    std::printf("wrote %s/config.json and model.safetensors\n", o.export_hf.c_str());
    return 0;
  }
  const ModelConfig& config = files->config;
  if (Status s = validate(o, config); !s.ok()) return fail("bench train", s.message());
  const std::vector<TrainSample> batch = make_batch(o, config);
  TrainBenchRun run;
  run.name = std::filesystem::path(o.model).filename().string();
  run.tokens_per_step = o.batch * (o.seq_len - 1);
  ThreadPool pool(o.threads);
  run.threads = pool.num_threads();
  run.isa = kernels::detect_isa();

  TrainerConfig tc;
  tc.lr.lr = o.lr;
  tc.micro_batch_size = o.micro_batch_size;
  auto device = parse_device(o.device);
  if (!device.ok()) return fail("bench train", device.message());
  tc.device = *device;
  auto trainer = Trainer::create(config, files->weights, tc, &pool);
  if (!trainer.ok()) return fail("bench train", trainer.message());
  Trainer& tr = **trainer;
  run.fm = flop_model(config, tr.params(), o.seq_len);
  const TokenObjective objective = sft_objective(batch, static_cast<double>(run.tokens_per_step));
  const auto driver_gone = [] { return fail("bench train", "--paced: stdin closed"); };
  if (!wait_for_driver(o.paced)) return driver_gone();
  run.peak = run.isa == kernels::Isa::kScalar
                 ? 0.0
                 : fma_peak_gflops(run.isa, run.threads, o.peak_seconds);
  print_header(o, run, tc.device);
  auto stepped = time_steps(o, tr, batch, objective, run);
  if (!stepped.ok()) return fail("bench train", stepped.message());
  if (!*stepped) return driver_gone();
  print_summary(o, run);
  if (!o.no_breakdown && tc.device == Device::kCpu) {
    if (!wait_for_driver(o.paced)) return driver_gone();
    auto b = measure_breakdown(tr, batch, o.micro_batch_size, o.lr, &pool);
    if (!b.ok()) return fail("bench train", b.message());
    run.breakdown = true;
    run.b = *b;
    print_breakdown(run.b);
  }
  if (!o.json.empty())
    if (Status s = write_json(o, run, batch); !s.ok()) return fail("bench train", s.message());
  return 0;
}

}  // namespace

void register_bench_train(CLI::App& bench) {
  auto o = std::make_shared<TrainBenchOptions>();
  CLI::App* t = bench.add_subcommand(
      "train", "Training step tokens/s (forward + backward + AdamW), FLOPs and MFU");
  t->add_option("--model", o->model, "HF model directory or llama2.c checkpoint")->required();
  t->add_option("--batch", o->batch, "samples per step")->capture_default_str();
  t->add_option("--seq-len", o->seq_len, "tokens per sample (all but the first are trained)")
      ->capture_default_str();
  t->add_option("--threads", o->threads, "compute threads (0 = all cores)")->capture_default_str();
  t->add_option("--steps", o->steps, "measured steps")->capture_default_str();
  t->add_option("--warmup", o->warmup, "unmeasured steps first")->capture_default_str();
  t->add_option("--micro-batch-size", o->micro_batch_size, "samples per forward + backward")
      ->capture_default_str();
  t->add_option("--seed", o->seed, "seed of the token ids (splitmix64)")->capture_default_str();
  t->add_option("--lr", o->lr, "AdamW learning rate (constant)")->capture_default_str();
  t->add_option("--peak-seconds", o->peak_seconds, "time for the FMA peak measurement")
      ->capture_default_str();
  t->add_flag("--no-breakdown", o->no_breakdown, "skip the timed piece-by-piece step");
  t->add_flag("--paced", o->paced,
              "wait for a line on stdin before the peak, each step and the breakdown (for a driver "
              "that alternates another framework's steps with these)");
  t->add_option("--device", o->device, "where forward and backward run: cpu, cuda or emulated")
      ->capture_default_str()
      ->check(CLI::IsMember(device_names()));
  t->add_option("--json", o->json, "also write the results (and the token ids) as JSON");
  t->add_option("--export-hf", o->export_hf,
                "write the model as an HF Llama directory (config.json + safetensors) and exit")
      ->group("");
  t->callback([o] {
    if (int rc = run_bench_train(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
