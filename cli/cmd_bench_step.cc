// `miles bench step [CONFIG] [section.key=value ...]`: the same RL job in the three schedules —
// sync, one_step_off, async — each as its own `miles run` (fresh engines), and its mean step time
// split into generate / train / sync / idle, as ratios against the synchronous schedule.
//
// Why: overlapping generation with training is the reason for the asynchronous schedules; this
// measures what it buys on this machine for a given job (on two cores the engine and the trainer
// compete for the same cores, so the gain is bounded by how much each side leaves idle).
#include <spdlog/spdlog.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/worker_launch.h"
#include "miles/controller/child_process.h"
#include "miles/json_text.h"

namespace miles::cli {

namespace {

struct BenchStepOptions {
  std::string config = "configs/quickstart.yaml";
  std::vector<std::string> overrides;
  std::string run_dir = "runs/bench_step", out;
  int64_t steps = 12;
  // Speculative decoding off vs on (rollout.speculative) in one schedule instead of the three.
  bool spec = false;
  std::string schedule = "sync";
  // The co-trained head's run only: rollout.speculative_draft_ttt_length.
  int64_t spec_head_ttt_length = 1;
};

struct ModeResult {
  std::string mode;
  double step = 0, generate = 0, train = 0, sync = 0, idle = 0, samples_per_s = 0, reward = 0;
  int64_t steps = 0;
  double spec_accept_rate = 0, spec_tokens_per_verify = 0;  // with rollout.speculative
  // Every step's reward and response length, to compare two runs' samples.
  std::vector<std::pair<double, double>> per_step;
};

// Means over every step but the first (engine warm-up, the first batch that nothing overlaps).
Result<ModeResult> read_metrics(const std::string& path, const std::string& mode) {
  std::ifstream in(path);
  if (!in) return Status::Error("no metrics at " + path);
  ModeResult r;
  r.mode = mode;
  std::string line;
  int64_t k = 0;
  while (std::getline(in, line)) {
    auto j = parse_json_or_discarded(line);
    if (j.is_discarded() || ++k == 1) continue;
    r.step += j["time_step_s"].get<double>();
    r.generate += j["time_generate_s"].get<double>();
    r.train += j["time_train_s"].get<double>();
    r.sync += j["time_sync_s"].get<double>();
    r.idle += j["time_idle_s"].get<double>();
    r.samples_per_s += j["samples_per_s"].get<double>();
    r.reward += j["reward_mean"].get<double>();
    r.spec_accept_rate += j.value("spec_accept_rate", 0.0);
    r.spec_tokens_per_verify += j.value("spec_tokens_per_verify", 0.0);
    r.per_step.emplace_back(j["reward_mean"].get<double>(),
                            j["response_length_mean"].get<double>());
    ++r.steps;
  }
  if (r.steps == 0) return Status::Error(path + " has fewer than 2 steps");
  for (double* v : {&r.step, &r.generate, &r.train, &r.sync, &r.idle, &r.samples_per_s, &r.reward,
                    &r.spec_accept_rate, &r.spec_tokens_per_verify})
    *v /= static_cast<double>(r.steps);
  return r;
}

int run_bench_step(const BenchStepOptions& o) {
  // (label, schedule, extra overrides) of each run.
  struct Run {
    std::string label, schedule;
    std::vector<std::string> extra;
  };
  std::vector<Run> runs;
  if (o.spec) {
    runs = {{"spec_off", o.schedule, {"rollout.speculative=false"}},
            {"spec_suffix", o.schedule, {"rollout.speculative=true"}},
            {"spec_head",
             o.schedule,
             {"rollout.speculative=true", "rollout.speculative_draft_head=true",
              "rollout.speculative_draft_ttt_length=" + std::to_string(o.spec_head_ttt_length)}}};
  } else {
    for (const char* mode : {"sync", "one_step_off", "async"}) runs.push_back({mode, mode, {}});
  }
  std::vector<ModeResult> results;
  for (const auto& [label, schedule, extra] : runs) {
    const std::string& mode = label;
    const std::string dir = o.run_dir + "/" + mode;
    std::vector<std::string> argv = {controller::miles_executable(), "run", o.config};
    for (const std::string& ov : o.overrides) argv.push_back(ov);
    for (const std::string& ov : std::vector<std::string>{
             "async.mode=" + schedule, "rollout.num_rollouts=" + std::to_string(o.steps),
             "logging.progress=none", "checkpoint.save_every=0", "checkpoint.resume=false"})
      argv.push_back(ov);
    for (const std::string& e : extra) argv.push_back(e);
    argv.push_back("--run-dir");
    argv.push_back(dir);
    spdlog::info("bench step: {} ...", mode);
    if (Status s = run_local_workers(1, {argv}); !s.ok())
      return fail("bench step", mode + ": " + s.message());
    auto r = read_metrics(dir + "/metrics.jsonl", mode);
    if (!r.ok()) return fail("bench step", r.message());
    results.push_back(*r);
  }
  const ModeResult& base = results.front();
  std::printf("%-13s %8s %7s %9s %8s %8s %8s %10s %8s\n", "mode", "step_s", "vs_sync", "generate",
              "train", "sync", "idle", "samples/s", "reward");
  nlohmann::json out = nlohmann::json::array();
  for (const ModeResult& r : results) {
    std::printf("%-13s %8.3f %7.2f %9.3f %8.3f %8.3f %8.3f %10.1f %8.3f\n", r.mode.c_str(), r.step,
                r.step / base.step, r.generate, r.train, r.sync, r.idle, r.samples_per_s, r.reward);
    out.push_back({{"mode", r.mode},
                   {"steps_averaged", r.steps},
                   {"step_s", r.step},
                   {"step_vs_sync", r.step / base.step},
                   {"generate_s", r.generate},
                   {"train_s", r.train},
                   {"sync_s", r.sync},
                   {"idle_s", r.idle},
                   {"samples_per_s", r.samples_per_s},
                   {"reward_mean", r.reward}});
  }
  std::printf(
      "(means over steps 2..%lld of `miles run %s`; generate in async = mean group latency)\n",
      static_cast<long long>(o.steps), o.config.c_str());
  if (o.spec) {
    for (size_t i = 1; i < results.size(); ++i) {
      const ModeResult& on = results[i];
      std::printf(
          "%s: %.2fx the step, %.2fx generate; accepted / drafted %.3f, tokens per verify %.2f; "
          "same samples (every step's reward and length): %s\n",
          on.mode.c_str(), base.step / on.step, base.generate / on.generate, on.spec_accept_rate,
          on.spec_tokens_per_verify, base.per_step == on.per_step ? "yes" : "NO");
      if (base.per_step != on.per_step)
        return fail("bench step", "speculative decoding changed the samples (rewards or lengths)");
    }
  }
  if (!o.out.empty()) std::ofstream(o.out) << out.dump(2) << "\n";
  return 0;
}

}  // namespace

void register_bench_step(CLI::App& bench) {
  auto o = std::make_shared<BenchStepOptions>();
  CLI::App* sub = bench.add_subcommand(
      "step", "RL step time and its breakdown: sync vs one-step-off vs async on one job");
  sub->add_option("config", o->config, "job file")->capture_default_str();
  sub->add_option("overrides", o->overrides, "section.key=value overrides for every run");
  sub->add_option("--steps", o->steps, "rollout steps per schedule")->capture_default_str();
  sub->add_option("--run-dir", o->run_dir, "parent of the three runs' directories")
      ->capture_default_str();
  sub->add_option("--out", o->out, "also write the table as JSON");
  CLI::Option* spec =
      sub->add_flag("--spec", o->spec,
                    "speculative decoding off vs on (rollout.speculative) in one schedule instead");
  sub->add_option("--schedule", o->schedule, "--spec: the schedule of both runs")
      ->capture_default_str()
      ->check(CLI::IsMember({"sync", "one_step_off", "async"}));
  sub->add_option("--spec-head-ttt-length", o->spec_head_ttt_length,
                  "--spec: the co-trained head's training passes per sample in its run "
                  "(rollout.speculative_draft_ttt_length; > 1: EAGLE-3's training-time test)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{8}))
      ->needs(spec);
  sub->callback([o] {
    if (int rc = run_bench_step(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
