// `miles run CONFIG.yaml [section.key=value ...]`: an RL job (include/miles/controller/rl_job.h)
// or, with an `sft:` section, an SFT job (include/miles/controller/sft_job.h) from a job file
// (include/miles/controller/run_config.h), validated before anything starts; `miles check`,
// `miles eval`, and `miles train-worker`, one rank of either job's trainer group.
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/controller/controller_service.h"
#include "miles/controller/rl_job.h"
#include "miles/controller/run_config.h"
#include "miles/controller/sft_job.h"
#include "miles/controller/trainer_group.h"
#include "miles/durable_file.h"
#include "miles/model.h"
#include "miles/secret.h"

namespace miles::cli {

namespace {

struct RunOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string run_dir;
  bool resume = false;
  bool check_only = false;
};

// The tokenizer and chat template of the job's model.
Result<controller::RunResources> load_resources(const RunConfig& cfg) {
  auto files = load_model_files(cfg.model.path);
  if (!files.ok()) return Status::Error("model.path: " + files.message());
  auto tok = find_tokenizer(cfg.model.path, cfg.model.tokenizer,
                            static_cast<int32_t>(files->config.vocab_size));
  if (!tok.ok()) return tok.status();
  controller::RunResources res;
  res.tokenizer = std::move(tok).value();
  const std::string tc = std::filesystem::is_directory(cfg.model.path)
                             ? cfg.model.path + "/tokenizer_config.json"
                             : "";
  if (!tc.empty() && std::filesystem::exists(tc)) {
    auto chat = ChatTemplate::from_tokenizer_config(tc);
    if (chat.ok()) res.chat = std::make_shared<const ChatTemplate>(std::move(chat).value());
  }
  return res;
}

// An SFT job file: a tokenizer only when one is found (token-id data needs none).
int run_sft(const RunConfig& cfg) {
  auto res = load_resources(cfg);
  if (!res.ok() && !cfg.model.tokenizer.empty()) return fail("run", res.message());
  std::signal(SIGPIPE, SIG_IGN);
  auto sum = controller::run_sft_job(cfg, res.ok() ? res->tokenizer : nullptr, {});
  if (!sum.ok()) return fail("run", sum.message());
  std::printf(
      "miles run: %lld SFT steps; loss %.4f -> %.4f over steps %lld..%lld (metrics: "
      "%s/metrics.jsonl)\n",
      static_cast<long long>(sum->steps), sum->first_loss, sum->last_loss,
      static_cast<long long>(sum->first_step + 1), static_cast<long long>(sum->steps),
      cfg.logging.run_dir.c_str());
  return 0;
}

// `miles check` and `miles eval` gate and evaluate RL jobs (engines, rewards): an SFT job has none.
Status rl_job_only(const RunConfig& cfg) {
  if (!cfg.is_sft()) return Status::Ok();
  return Status::Error(cfg.source +
                       ": an SFT job (sft.data is set) has no rollouts to check or "
                       "evaluate; run it with `miles run`");
}

int run_run(const RunOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (!o.run_dir.empty()) overrides.push_back("logging.run_dir=" + o.run_dir);
  if (o.resume) overrides.push_back("checkpoint.resume=true");
  auto cfg = load_run_config(o.config, overrides);
  if (!cfg.ok()) return fail("run", cfg.message());
  if (o.check_only) {
    std::printf("%s", run_config_to_yaml(*cfg).c_str());
    return 0;
  }
  if (cfg->is_sft()) return run_sft(*cfg);
  auto res = load_resources(*cfg);
  if (!res.ok()) return fail("run", res.message());
  std::signal(SIGPIPE, SIG_IGN);
  auto sum = controller::run_rl_job(*cfg, *res);
  if (!sum.ok()) return fail("run", sum.message());
  if (sum->evaluations > 0)
    std::printf(
        "miles run: %lld evaluations; eval reward %.4f -> %.4f, pass@1 %.4f -> %.4f, pass@%lld "
        "%.4f -> %.4f (first -> last; %s/eval.jsonl)\n",
        static_cast<long long>(sum->evaluations), sum->first_eval.reward_mean,
        sum->last_eval.reward_mean, sum->first_eval.pass_at_1, sum->last_eval.pass_at_1,
        static_cast<long long>(sum->eval_k), sum->first_eval.pass_at_k, sum->last_eval.pass_at_k,
        cfg->logging.run_dir.c_str());
  if (sum->window_steps == 0) {
    std::printf(
        "miles run: %lld rollout steps (too few to compare windows; metrics: %s/metrics.jsonl)\n",
        static_cast<long long>(sum->rollout_steps), cfg->logging.run_dir.c_str());
    return 0;
  }
  std::printf(
      "miles run: %lld rollout steps; reward mean of the first %lld steps %.4f, of the last %lld "
      "%.4f (metrics: %s/metrics.jsonl)\n",
      static_cast<long long>(sum->rollout_steps), static_cast<long long>(sum->window_steps),
      sum->first_reward_mean, static_cast<long long>(sum->window_steps), sum->last_reward_mean,
      cfg->logging.run_dir.c_str());
  return 0;
}

// `miles check`: the gate's table on stdout, the JSON report in check.report; exit 1 on a failure.
int run_check(const RunOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (!o.run_dir.empty()) overrides.push_back("logging.run_dir=" + o.run_dir);
  auto cfg = load_run_config(o.config, overrides);
  if (!cfg.ok()) return fail("check", cfg.message());
  if (Status s = rl_job_only(*cfg); !s.ok()) return fail("check", s.message());
  auto res = load_resources(*cfg);
  if (!res.ok()) return fail("check", res.message());
  std::signal(SIGPIPE, SIG_IGN);
  auto report = controller::run_rl_check(*cfg, *res);
  if (!report.ok()) return fail("check", report.message());
  std::printf("%-40s %14s %3s %12s  %s\n", "gate", "value", "", "limit", "result");
  for (const auto& g : (*report)["gates"]) {
    if (g.contains("value")) {
      std::printf("%-40s %14.6g %3s %12.6g  %s\n", g["gate"].get<std::string>().c_str(),
                  g["value"].get<double>(), g["op"].get<std::string>().c_str(),
                  g["limit"].get<double>(), g["passed"].get<bool>() ? "ok" : "FAIL");
    } else {
      std::printf("%-40s %14s %3s %12s  FAIL: %s\n", g["gate"].get<std::string>().c_str(), "-", "",
                  "-", g["note"].get<std::string>().c_str());
    }
  }
  const bool passed = (*report)["passed"].get<bool>();
  std::printf("miles check: %s (%lld tokens of %lld samples; report %s)\n",
              passed ? "passed" : "FAILED", (*report)["tokens"].get<long long>(),
              (*report)["samples"].get<long long>(), cfg->check.report.c_str());
  return passed ? 0 : 1;
}

struct EvalOptions {
  std::string config, checkpoint, run_dir;
  std::vector<std::string> overrides;
};

// `miles eval`: one evaluation (the job's eval: section) of the model, or of the newest checkpoint
// in --checkpoint; the eval_* metrics as JSON on stdout and in RUN_DIR/eval.json.
int run_eval(const EvalOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (!o.checkpoint.empty()) {
    overrides.push_back("checkpoint.dir=" + o.checkpoint);
    overrides.push_back("checkpoint.resume=true");
  }
  auto cfg = load_run_config(o.config, overrides);
  if (!cfg.ok()) return fail("eval", cfg.message());
  if (Status s = rl_job_only(*cfg); !s.ok()) return fail("eval", s.message());
  // Never the job's own run folder: its metrics and TensorBoard files stay the training run's.
  cfg->logging.run_dir = o.run_dir.empty() ? cfg->logging.run_dir + "-eval" : o.run_dir;
  auto res = load_resources(*cfg);
  if (!res.ok()) return fail("eval", res.message());
  std::signal(SIGPIPE, SIG_IGN);
  auto result = controller::run_rl_eval(*cfg, *res);
  if (!result.ok()) return fail("eval", result.message());
  const std::string text = result->dump(2);
  std::printf("%s\n", text.c_str());
  if (Status s = write_file_synced(cfg->logging.run_dir + "/eval.json", text + "\n"); !s.ok())
    return fail("eval", s.message());
  return 0;
}

struct WorkerOptions {
  std::string config, store, controller, host;
  int rank = 0, world_size = 1;
  double join_timeout_s = 600;
};

// A rank joining from another host: its seat, the store and the run's config come from the
// controller; it binds its collectives to --host, else the address the controller saw it at.
Result<controller::RankPlace> join_remote(const WorkerOptions& o, RunConfig* cfg) {
  const std::string token = run_token();
  if (token.empty())
    return Status::Error(
        "--controller needs the run's token in MILES_RUN_TOKEN (the controller's; "
        "docs/security.md)");
  MILES_ASSIGN_OR_RETURN(controller::JoinedSeat j,
                         controller::join_trainer_group(o.controller, token, o.join_timeout_s));
  MILES_ASSIGN_OR_RETURN(
      *cfg, parse_run_config(j.seat.config_yaml, "the controller at " + o.controller, {}));
  controller::RankPlace p;
  p.rank = j.seat.rank;
  p.world_size = j.seat.world_size;
  p.store = j.seat.store_address;
  p.host = o.host.empty() ? j.peer_host : o.host;
  p.remote = true;
  spdlog::info("miles train-worker: rank {} of {} (controller {}, store {}, bound to {})", p.rank,
               p.world_size, o.controller, p.store, p.host);
  return p;
}

// The place of a rank the controller started on its own host (its command line says it all).
Result<controller::RankPlace> local_place(const WorkerOptions& o, RunConfig* cfg) {
  if (o.config.empty() || o.store.empty() || o.rank <= 0 || o.world_size <= 1)
    return Status::Error(
        "either --controller HOST:PORT, or --config, --store, --rank > 0 and --world-size > 1");
  MILES_ASSIGN_OR_RETURN(*cfg, load_run_config(o.config, {}));
  controller::RankPlace p;
  p.rank = o.rank;
  p.world_size = o.world_size;
  p.store = o.store;
  p.host = o.host.empty() ? "127.0.0.1" : o.host;
  return p;
}

// One rank (> 0) of the trainer group of a job's controller (`miles run`, `miles sft`;
// trainer_group.h).
int run_train_worker(const WorkerOptions& o) {
  RunConfig cfg;
  auto place = o.controller.empty() ? local_place(o, &cfg) : join_remote(o, &cfg);
  if (!place.ok()) return fail("train-worker", place.message());
  const std::string rank_name = "rank " + std::to_string(place->rank);
  TrainState resumed;
  auto rank = controller::TrainerRank::create(cfg, *place, &resumed);
  if (!rank.ok()) return fail("train-worker", rank_name + ": " + rank.message());
  if (Status s = (*rank)->follow(); !s.ok())
    return fail("train-worker", rank_name + ": " + s.message());
  return 0;
}

}  // namespace

void register_run(CLI::App& app) {
  auto c = std::make_shared<RunOptions>();
  CLI::App* check = app.add_subcommand(
      "check", "Train–rollout mismatch gate of a job: exit 0 when every threshold holds");
  check->add_option("config", c->config, "job file (its check: section holds the thresholds)")
      ->required();
  check->add_option("overrides", c->overrides, "section.key=value overrides");
  check->add_option("--run-dir", c->run_dir, "logging.run_dir");
  check->callback([c] {
    if (int rc = run_check(*c); rc != 0) throw CLI::RuntimeError(rc);
  });

  auto e = std::make_shared<EvalOptions>();
  CLI::App* eval = app.add_subcommand(
      "eval", "Evaluate a job's model or checkpoint on its eval: section's held-out prompts");
  eval->add_option("config", e->config, "job file (its eval: section: data, n_samples, ...)")
      ->required();
  eval->add_option("overrides", e->overrides, "section.key=value overrides");
  eval->add_option(
      "--checkpoint", e->checkpoint,
      "a run's checkpoint folder (checkpoint.dir): its newest checkpoint is evaluated");
  eval->add_option("--run-dir", e->run_dir,
                   "where engine logs and eval.json go (default: "
                   "logging.run_dir + \"-eval\")");
  eval->callback([e] {
    if (int rc = run_eval(*e); rc != 0) throw CLI::RuntimeError(rc);
  });

  auto w = std::make_shared<WorkerOptions>();
  CLI::App* worker = app.add_subcommand(
      "train-worker",
      "One rank of a job's trainer group (`miles run`, `miles sft`): started by the controller, "
      "or joining it from another host with --controller (parallel.remote_ranks)");
  worker->alias("rl-worker");  // its earlier name
  worker->add_option("--controller", w->controller,
                     "HOST:PORT of the controller's service: take a remote rank's seat (needs "
                     "MILES_RUN_TOKEN)");
  worker->add_option("--host", w->host,
                     "the address this rank's collectives bind to (default: with --controller, "
                     "the address the controller sees; else 127.0.0.1)");
  worker
      ->add_option("--join-timeout", w->join_timeout_s,
                   "seconds to keep asking the controller for a seat")
      ->check(CLI::PositiveNumber);
  worker->add_option("--config", w->config, "the run's resolved config.yaml (local ranks)");
  worker->add_option("--store", w->store, "the controller's rendezvous store HOST:PORT");
  worker->add_option("--rank", w->rank, "this rank (> 0)");
  worker->add_option("--world-size", w->world_size, "dp × pp × tp");
  for (const char* local : {"--config", "--store", "--rank", "--world-size"})
    worker->get_option(local)->excludes("--controller");
  worker->callback([w] {
    if (int rc = run_train_worker(*w); rc != 0) throw CLI::RuntimeError(rc);
  });

  auto o = std::make_shared<RunOptions>();
  CLI::App* sub =
      app.add_subcommand("run", "Run an RL job (or, with an sft: section, an SFT job) from YAML");
  sub->add_option("config", o->config, "job file (configs/*.yaml)")->required();
  sub->add_option("overrides", o->overrides, "section.key=value overrides");
  sub->add_option("--run-dir", o->run_dir, "logging.run_dir (metrics.jsonl, weights, ...)");
  sub->add_flag("--resume", o->resume, "continue from the newest checkpoint (checkpoint.resume)");
  sub->add_flag("--check", o->check_only, "validate the config, print it resolved, and exit");
  sub->callback([o] {
    if (int rc = run_run(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
