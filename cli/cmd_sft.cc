// `miles sft`: supervised fine-tuning on JSONL, one JSON line per step. Its flags (or a flat YAML
// of them) make the RunConfig of an SFT job (run_config.h's `sft:` section), run by the job layer
// like `miles run` (include/miles/controller/sft_job.h): with --layout dp=A,pp=B,tp=C it starts
// A·B·C − 1 `miles train-worker` ranks beside this process, rank 0, which broadcasts each batch.
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/controller/run_config.h"
#include "miles/controller/sft_job.h"
#include "miles/device_model.h"
#include "miles/parallel_layout.h"

namespace miles::cli {

namespace {

struct SftOptions {
  std::string model, tokenizer, data, layout = "dp=1,pp=1,tp=1", config, decay = "constant";
  int64_t steps = 10, batch_size = 8, micro_batch_size = 1, max_len = 256, warmup_steps = 0;
  double lr = 1e-4, min_lr = 0.0, weight_decay = 0.0, clip_grad_norm = 1.0;
  int threads = 0;
  double comm_timeout_s = 60;
  std::string comm = "shm";    // the ranks' collectives: shm (this host) or gloo (TCP)
  std::string device = "cpu";  // where forward and backward run (TrainerConfig::device)
  std::string save_dir, run_dir;
  int64_t save_every = 0;
  bool resume = false;
};

// YAML keys are the long option names with '_' for '-'; a flag given on the command line wins.
Status apply_yaml(const std::string& path, SftOptions& o, CLI::App& app) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ": " + e.what());
  }
  if (!root.IsMap()) return Status::Error(path + ": expected a mapping of option: value");
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    std::string flag = "--" + key;
    for (char& ch : flag) ch = ch == '_' ? '-' : ch;
    const std::string at = path + ":" + std::to_string(it->first.Mark().line + 1) + ": ";
    CLI::Option* opt = nullptr;
    try {
      opt = app.get_option(flag);
    } catch (const CLI::OptionNotFound&) {
    }
    if (!opt || key == "config")
      return Status::Error(at + "unknown key '" + key +
                           "' (keys are the sft options, e.g. lr, steps)");
    if (opt->count() > 0) continue;
    if (!it->second.IsScalar()) return Status::Error(at + "'" + key + "' must be a scalar");
    try {
      opt->clear();
      opt->add_result(it->second.as<std::string>());
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return Status::Error(at + "'" + key + "': " + e.what());
    }
  }
  return Status::Ok();
}

// The flags' checks, named by flag, then the SFT job's RunConfig (validated like a job file).
Result<RunConfig> sft_run_config(const SftOptions& o) {
  MILES_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::parse(o.layout));
  if (o.steps < 1) return Status::Error("--steps must be >= 1");
  if (o.batch_size < 1 || o.micro_batch_size < 1 || o.batch_size % o.micro_batch_size != 0)
    return Status::Error("--batch-size must be a positive multiple of --micro-batch-size");
  if ((o.batch_size / o.micro_batch_size) % layout.dp() != 0)
    return Status::Error(
        "--batch-size / --micro-batch-size = " + std::to_string(o.batch_size / o.micro_batch_size) +
        " micro-batches do not split evenly over dp=" + std::to_string(layout.dp()));
  if (o.decay != "constant" && o.decay != "cosine")
    return Status::Error("--decay must be constant or cosine, not '" + o.decay + "'");
  if (o.resume && o.save_dir.empty()) return Status::Error("--resume needs --save-dir");
  if (o.save_every > 0 && o.save_dir.empty())
    return Status::Error("--save-every needs --save-dir (where the checkpoints go)");
  RunConfig c;
  c.source = o.config.empty() ? "miles sft" : o.config;
  c.model.path = o.model;
  c.model.tokenizer = o.tokenizer;
  c.sft.data = o.data;
  c.sft.steps = o.steps;
  c.sft.max_len = o.max_len;
  TrainerSection& t = c.trainer;
  t.global_batch_size = o.batch_size;
  t.micro_batch_size = o.micro_batch_size;
  t.lr = o.lr;
  t.min_lr = o.min_lr;
  t.warmup_steps = o.warmup_steps;
  t.decay = o.decay == "cosine" ? LrDecay::kCosine : LrDecay::kConstant;
  t.weight_decay = o.weight_decay;
  t.clip_grad_norm = o.clip_grad_norm;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  t.threads = o.threads > 0 ? o.threads : std::max(1, hw / layout.world_size());
  MILES_ASSIGN_OR_RETURN(t.device, parse_device(o.device));
  c.parallel.dp = layout.dp();
  c.parallel.pp = layout.pp();
  c.parallel.tp = layout.tp();
  c.parallel.comm = o.comm == "gloo" ? TrainerComm::kGloo : TrainerComm::kShm;
  c.parallel.timeout_s = o.comm_timeout_s;
  c.checkpoint.dir = o.save_dir;
  c.checkpoint.save_every = o.save_every;
  c.checkpoint.save_final = !o.save_dir.empty();
  c.checkpoint.resume = o.resume;
  c.logging.run_dir = o.run_dir;
  c.logging.tensorboard = !o.run_dir.empty();
  c.logging.progress = Progress::kNone;
  return c;
}

// A private run directory (config.yaml for the ranks, metrics.jsonl) when --run-dir is not given.
Result<std::string> temporary_run_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/miles-sft-XXXXXX";
  if (!::mkdtemp(pattern.data())) return Status::Error("cannot create a run directory " + pattern);
  return pattern;
}

// The last lines of the other ranks' logs, when a multi-rank job failed.
void show_rank_logs(const std::string& run_dir) {
  for (int r = 1;; ++r) {
    const std::string path = run_dir + "/trainer_rank_" + std::to_string(r) + ".log";
    std::ifstream in(path);
    if (!in) return;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    for (size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i)
      std::fprintf(stderr, "  rank %d: %s\n", r, lines[i].c_str());
  }
}

Status run_job(const SftOptions& o) {
  MILES_ASSIGN_OR_RETURN(RunConfig cfg, sft_run_config(o));
  MILES_RETURN_IF_ERROR(validate_run_config(cfg));
  std::shared_ptr<const Tokenizer> tok;
  MILES_ASSIGN_OR_RETURN(ModelFiles files, load_model_files(o.model));
  auto t = find_tokenizer(o.model, o.tokenizer, static_cast<int32_t>(files.config.vocab_size));
  if (t.ok()) {
    tok = std::move(t).value();
  } else if (!o.tokenizer.empty()) {
    return t.status();
  }
  controller::SftJobOptions jo;
  jo.json_lines = true;
  return controller::run_sft_job(cfg, tok, jo).status();
}

// The job in --run-dir, or in a temporary run directory removed afterwards. When a job with other
// ranks fails, the end of their logs is shown too.
Status run_sft(SftOptions o) {
  const bool temporary = o.run_dir.empty();
  if (temporary) {
    MILES_ASSIGN_OR_RETURN(o.run_dir, temporary_run_dir());
  }
  Status s = run_job(o);
  if (!s.ok()) show_rank_logs(o.run_dir);
  if (!s.ok() && !temporary) s = Status::Error(s.message() + " (logs in " + o.run_dir + ")");
  if (temporary) std::filesystem::remove_all(o.run_dir);
  return s;
}

void add_job_options(CLI::App* sub, SftOptions* o) {
  sub->add_option("--model", o->model, "HF directory or llama2.c checkpoint");
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer (default: found beside the model)");
  sub->add_option("--data", o->data, "JSONL: {\"text\": ...} or {\"input_ids\": [...]} per line");
  sub->add_option("--config", o->config, "YAML file of these options (flags win)");
  sub->add_option("--steps", o->steps, "optimizer steps");
  sub->add_option("--lr", o->lr, "peak learning rate");
  sub->add_option("--min-lr", o->min_lr, "cosine floor");
  sub->add_option("--warmup-steps", o->warmup_steps, "linear warm-up steps");
  sub->add_option("--decay", o->decay, "constant | cosine");
  sub->add_option("--weight-decay", o->weight_decay, "AdamW decoupled weight decay (matrices)");
  sub->add_option("--clip-grad-norm", o->clip_grad_norm, "global grad-norm clip (<= 0: off)");
  sub->add_option("--batch-size", o->batch_size, "samples per step");
  sub->add_option("--micro-batch-size", o->micro_batch_size, "samples per micro-batch");
  sub->add_option("--max-len", o->max_len, "tokens kept per sample");
  sub->add_option("--layout", o->layout, "dp=A,pp=B,tp=C");
  sub->add_option("--threads", o->threads, "threads per rank (default: cores / ranks)");
  sub->add_option("--save-dir", o->save_dir, "checkpoints go to DIR/step_XXXXXXXX (HF loadable)");
  sub->add_option("--save-every", o->save_every, "checkpoint every N steps (and at the end)");
  sub->add_flag("--resume", o->resume, "continue from the latest checkpoint in --save-dir");
  sub->add_option("--comm-timeout", o->comm_timeout_s,
                  "seconds to wait for a peer (join, collective)");
  sub->add_option("--comm", o->comm, "the ranks' collectives: shm (this host) or gloo (TCP)")
      ->check(CLI::IsMember({"shm", "gloo"}));
  sub->add_option("--run-dir", o->run_dir,
                  "where config.yaml, metrics.jsonl, TensorBoard and the ranks' logs go "
                  "(default: a temporary directory, removed at the end)");
  sub->add_option("--device", o->device,
                  "where forward and backward run: cpu, cuda (a GPU) or emulated; "
                  "the same bits on each")
      ->check(CLI::IsMember(device_names()));
}

}  // namespace

void register_sft(CLI::App& app) {
  auto o = std::make_shared<SftOptions>();
  CLI::App* sub =
      app.add_subcommand("sft", "Supervised fine-tuning on JSONL; one JSON line per step");
  add_job_options(sub, o.get());
  sub->callback([o, sub] {
    if (!o->config.empty()) {
      if (Status s = apply_yaml(o->config, *o, *sub); !s.ok()) std::exit(fail("sft", s.message()));
    }
    for (const char* need : {"--model", "--data"})
      if (sub->get_option(need)->empty() &&
          (std::string(need) == "--model" ? o->model : o->data).empty())
        std::exit(fail("sft", std::string(need) + " is required"));
    auto layout = ParallelLayout::parse(o->layout);
    if (!layout.ok()) std::exit(fail("sft", "--layout: " + layout.message()));
    if (Status s = run_sft(*o); !s.ok()) std::exit(fail("sft", s.message()));
  });
}

}  // namespace miles::cli
