// `miles sft`: supervised fine-tuning on JSONL, one JSON line per step; with --layout dp=N it
// starts N `miles train-worker` processes (one per rank) that meet through a TCP rendezvous store
// and sum their gradients over Gloo. `miles train-worker` is the same job as one rank of a launched
// world (the controller or Slurm / Kubernetes start it with --rank, --world-size and --store).
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/worker_launch.h"
#include "miles/comm.h"
#include "miles/controller/child_process.h"
#include "miles/device_model.h"
#include "miles/tcp_store.h"
#include "miles/thread_pool.h"
#include "miles/trainer/sft_data.h"
#include "miles/trainer/train_checkpoint.h"
#include "miles/trainer/trainer.h"

namespace miles::cli {

namespace {

struct SftOptions {
  std::string model, tokenizer, data, layout = "dp=1,pp=1,tp=1", config, decay = "constant";
  int64_t steps = 10, batch_size = 8, micro_batch_size = 1, max_len = 256, warmup_steps = 0;
  double lr = 1e-4, min_lr = 0.0, weight_decay = 0.0, clip_grad_norm = 1.0;
  int threads = 0;
  double comm_timeout_s = 60;
  // Collectives: "shm" (every rank on this host) or "gloo" (TCP); "": shm for the ranks `miles
  // sft` starts itself, gloo for a train-worker started by an external launcher.
  std::string comm;
  std::string device = "cpu";  // where forward and backward run (TrainerConfig::device)
  std::string save_dir;
  int64_t save_every = 0;
  bool resume = false;
  // world (train-worker)
  int rank = 0, world_size = 1;
  std::string store;
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
    if (!opt || key == "config" || key == "rank" || key == "world_size" || key == "store")
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

Result<TrainerConfig> trainer_config(const SftOptions& o) {
  TrainerConfig tc;
  tc.optimizer.weight_decay = o.weight_decay;
  tc.optimizer.clip_grad_norm = o.clip_grad_norm;
  tc.lr.lr = o.lr;
  tc.lr.min_lr = o.min_lr;
  tc.lr.warmup_steps = o.warmup_steps;
  tc.lr.total_steps = o.steps;
  if (o.decay == "cosine") {
    tc.lr.decay = LrSchedule::Decay::kCosine;
  } else if (o.decay != "constant") {
    return Status::Error("--decay must be constant or cosine, not '" + o.decay + "'");
  }
  tc.micro_batch_size = o.micro_batch_size;
  MILES_ASSIGN_OR_RETURN(tc.device, parse_device(o.device));
  MILES_RETURN_IF_ERROR(tc.validate());
  return tc;
}

// One rank of the job (the whole job when world_size is 1).
Status run_rank(const SftOptions& o) {
  MILES_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::parse(o.layout));
  MILES_RETURN_IF_ERROR(layout.check_world_size(o.world_size));
  if (o.steps < 1) return Status::Error("--steps must be >= 1");
  if (o.batch_size < 1 || o.batch_size % o.micro_batch_size != 0)
    return Status::Error("--batch-size must be a positive multiple of --micro-batch-size");
  if ((o.batch_size / o.micro_batch_size) % layout.dp() != 0)
    return Status::Error(
        "--batch-size / --micro-batch-size = " + std::to_string(o.batch_size / o.micro_batch_size) +
        " micro-batches do not split evenly over dp=" + std::to_string(layout.dp()));
  MILES_ASSIGN_OR_RETURN(TrainerConfig tc, trainer_config(o));
  MILES_ASSIGN_OR_RETURN(ModelFiles files, load_model_files(o.model));
  std::unique_ptr<Tokenizer> tok;
  auto t = find_tokenizer(o.model, o.tokenizer, static_cast<int32_t>(files.config.vocab_size));
  if (t.ok()) {
    tok = std::move(t).value();
  } else if (!o.tokenizer.empty()) {
    return t.status();
  }
  MILES_ASSIGN_OR_RETURN(std::vector<TrainSample> data,
                         load_sft_jsonl(o.data, tok.get(), files.config.vocab_size,
                                        SftDataOptions{.max_len = o.max_len}));
  std::unique_ptr<Communicator> world;
  ParallelGroups groups;
  if (o.world_size > 1) {
    CommOptions co;
    co.rank = o.rank;
    co.world_size = o.world_size;
    co.store_address = o.store;
    co.prefix = "sft";
    co.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.comm_timeout_s * 1000));
    if (o.comm == "shm") {
      MILES_ASSIGN_OR_RETURN(world, connect_shm(co));
    } else {
      MILES_ASSIGN_OR_RETURN(world, connect_gloo(co));
    }
    MILES_ASSIGN_OR_RETURN(groups, make_parallel_groups(*world, layout));
  }
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(o.threads > 0 ? o.threads : std::max(1, hw / o.world_size));
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                         Trainer::create(files.config, files.weights, tc, &pool));
  if (layout.pp() > 1)
    MILES_RETURN_IF_ERROR(trainer->set_pipeline_stage(groups.coord.pp, layout.pp()));
  const TrainerComms comms{groups.dp.get(), groups.pp.get()};
  int64_t first = 0;
  if (o.resume) {
    if (o.save_dir.empty()) return Status::Error("--resume needs --save-dir");
    auto latest = latest_checkpoint(o.save_dir);
    if (latest.ok()) {
      MILES_ASSIGN_OR_RETURN(TrainState st, load_checkpoint(*latest, *trainer));
      first = st.step;
      if (o.rank == 0) spdlog::info("miles sft: resumed from {} (step {})", *latest, first);
    } else if (o.rank == 0) {
      spdlog::info("miles sft: nothing to resume in {} ({}); starting fresh", o.save_dir,
                   latest.message());
    }
  }
  auto save = [&](int64_t done) -> Status {
    if (o.save_dir.empty()) return Status::Ok();
    if (comms.pp) MILES_RETURN_IF_ERROR(trainer->gather_pipeline_state(*comms.pp));
    std::unique_ptr<Trainer> gathered;
    if (layout.tp() > 1) {
      MILES_ASSIGN_OR_RETURN(gathered, trainer->gather_tensor_parallel(*groups.tp));
    }
    if (o.rank != 0) return Status::Ok();
    TrainState st;
    st.step = done;
    st.data_position = done * o.batch_size;
    const std::string dir = o.save_dir + "/" + checkpoint_dir_name(done);
    std::error_code ec;
    std::filesystem::create_directories(o.save_dir, ec);
    SaveOptions so;
    if (std::filesystem::is_directory(o.model)) so.tokenizer_dir = o.model;
    so.overwrite = true;
    return save_checkpoint(dir, gathered ? *gathered : *trainer, st, so);
  };
  if (layout.tp() > 1) MILES_RETURN_IF_ERROR(trainer->shard_for_tensor_parallel(*groups.tp));
  for (int64_t step = first; step < o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<TrainSample> batch = sft_batch(data, step, o.batch_size);
    double tokens = 0;
    for (const TrainSample& s : batch) tokens += s.response_length;
    auto r = trainer->step(batch, sft_objective(batch, tokens), comms);
    if (!r.ok()) return r.status().with_context("step " + std::to_string(step + 1));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.rank == 0) {
      nlohmann::json j;
      j["step"] = r->step;
      j["loss"] = r->loss;
      j["grad_norm"] = r->grad_norm;
      j["lr"] = r->lr;
      j["tokens"] = r->tokens;
      j["step_time_s"] = secs;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
    const int64_t done = step + 1;
    if ((o.save_every > 0 && done % o.save_every == 0) || (done == o.steps && !o.save_dir.empty()))
      MILES_RETURN_IF_ERROR(save(done));
  }
  if (world) MILES_RETURN_IF_ERROR(world->barrier());
  return Status::Ok();
}

// `miles sft` with a world larger than one: host the store, start one train-worker per rank.
Status launch(const SftOptions& o, const std::vector<std::string>& job_args) {
  MILES_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::parse(o.layout));
  MILES_ASSIGN_OR_RETURN(auto store, TcpStoreServer::start(TcpStoreServerOptions{}));
  const int n = layout.world_size();
  std::vector<std::vector<std::string>> argvs;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> a{controller::miles_executable(),
                               "train-worker",
                               "--rank",
                               std::to_string(r),
                               "--world-size",
                               std::to_string(n),
                               "--store",
                               store->address()};
    a.insert(a.end(), job_args.begin(), job_args.end());
    if (o.comm.empty()) a.insert(a.end(), {"--comm", "shm"});  // every rank is on this host
    argvs.push_back(std::move(a));
  }
  return run_local_workers(n, argvs);
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
  sub->add_option("--comm", o->comm,
                  "collectives over shm (one host) or gloo (TCP); default: shm for the ranks sft "
                  "starts, gloo for a train-worker")
      ->check(CLI::IsMember({"shm", "gloo"}));
  sub->add_option("--device", o->device,
                  "where forward and backward run: cpu, cuda (a GPU) or emulated; "
                  "the same bits on each")
      ->check(CLI::IsMember(device_names()));
}

// The arguments after the subcommand name, to forward to workers.
std::vector<std::string> job_args_of(int argc, char** argv) {
  std::vector<std::string> out;
  bool seen = false;
  for (int i = 1; i < argc; ++i) {
    if (seen) out.push_back(argv[i]);
    if (std::string(argv[i]) == "sft") seen = true;
  }
  return out;
}

}  // namespace

void register_sft(CLI::App& app, int argc, char** argv) {
  auto o = std::make_shared<SftOptions>();
  CLI::App* sub =
      app.add_subcommand("sft", "Supervised fine-tuning on JSONL; one JSON line per step");
  add_job_options(sub, o.get());
  sub->callback([o, sub, argc, argv] {
    if (!o->config.empty()) {
      if (Status s = apply_yaml(o->config, *o, *sub); !s.ok()) std::exit(fail("sft", s.message()));
    }
    for (const char* need : {"--model", "--data"})
      if (sub->get_option(need)->empty() &&
          (std::string(need) == "--model" ? o->model : o->data).empty())
        std::exit(fail("sft", std::string(need) + " is required"));
    auto layout = ParallelLayout::parse(o->layout);
    if (!layout.ok()) std::exit(fail("sft", "--layout: " + layout.message()));
    const Status s = layout->world_size() > 1 ? launch(*o, job_args_of(argc, argv)) : run_rank(*o);
    if (!s.ok()) std::exit(fail("sft", s.message()));
  });

  auto w = std::make_shared<SftOptions>();
  CLI::App* worker = app.add_subcommand(
      "train-worker",
      "One rank of a training job (started by `miles sft`, the controller or Slurm)");
  add_job_options(worker, w.get());
  worker->add_option("--rank", w->rank, "this process's rank")->required();
  worker->add_option("--world-size", w->world_size, "number of ranks")->required();
  worker->add_option("--store", w->store, "host:port of the rendezvous store")->required();
  worker->callback([w, worker] {
    if (!w->config.empty()) {
      if (Status s = apply_yaml(w->config, *w, *worker); !s.ok())
        std::exit(fail("train-worker", s.message()));
    }
    const Status s = run_rank(*w);
    if (!s.ok())
      std::exit(fail("train-worker", "rank " + std::to_string(w->rank) + ": " + s.message()));
  });
}

}  // namespace miles::cli
