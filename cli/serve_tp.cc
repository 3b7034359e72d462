// `miles serve --tp N` start-up and `miles engine-tp-worker` (serve_tp.h).
#include "cli/serve_tp.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/model_files.h"
#include "miles/comm.h"
#include "miles/host_port.h"
#include "miles/model.h"
#include "miles/tensor_parallel.h"
#include "miles/thread_pool.h"
#include "miles/rollout/tp_engine.h"
#include "miles/weight_sync/tp_intake.h"

namespace miles::cli {

namespace {
constexpr auto kGroupTimeout = std::chrono::milliseconds(60'000);
}

Result<ServeTpGroup> start_serve_tp(const std::string& model_path, const ServeTpOptions& o,
                                    const EngineOptions& engine, ThreadPool* pool) {
  if (o.launch != "local" && o.launch != "external")
    return Status::Error("--tp-launch must be local or external, not " + o.launch);
  if (o.launch == "external" && o.store.empty())
    return Status::Error("--tp-launch external needs --tp-store HOST:PORT for the followers");
  const std::string transport =
      !o.transport.empty() ? o.transport : (o.launch == "local" ? "shm" : "gloo");
  if (transport != "shm" && transport != "gloo")
    return Status::Error("--tp-transport must be shm or gloo, not " + transport);
  MILES_ASSIGN_OR_RETURN(ModelFiles files, load_model_files(model_path));
  MILES_RETURN_IF_ERROR(tensor_parallel::local_config(files.config, o.tp).status());
  if (Status b = tensor_parallel::bitwise_split(files.config, o.tp); !b.ok())
    spdlog::warn(
        "miles serve: --tp {} is not bit-identical to one process ({}); a trainer with the same "
        "tensor-parallel size computes the same numbers",
        o.tp, b.message());
  ServeTpGroup g;
  CommOptions c;
  c.rank = 0;
  c.world_size = o.tp;
  c.host = o.host;
  c.timeout = kGroupTimeout;
  c.prefix = "miles-engine-tp-" + std::to_string(getpid());
  if (o.launch == "local") {
    TcpStoreServerOptions so;
    so.host = "127.0.0.1";
    MILES_ASSIGN_OR_RETURN(g.store, TcpStoreServer::start(so));
    c.store_address = g.store->address();
    for (int r = 1; r < o.tp; ++r) {
      std::vector<std::string> argv = {controller::miles_executable(),
                                       "engine-tp-worker",
                                       "--store",
                                       c.store_address,
                                       "--rank",
                                       std::to_string(r),
                                       "--world",
                                       std::to_string(o.tp),
                                       "--prefix",
                                       c.prefix,
                                       "--threads",
                                       std::to_string(o.threads),
                                       "--transport",
                                       transport};
      MILES_ASSIGN_OR_RETURN(controller::ChildProcess p,
                             controller::ChildProcess::spawn(argv, "/dev/stderr"));
      g.followers.push_back(std::move(p));
    }
  } else {
    const size_t colon = o.store.rfind(':');
    if (colon == std::string::npos)
      return Status::Error("--tp-store must be HOST:PORT, not " + o.store);
    TcpStoreServerOptions so;
    so.host = unbracket(o.store.substr(0, colon));
    so.port = std::atoi(o.store.c_str() + colon + 1);
    MILES_ASSIGN_OR_RETURN(g.store, TcpStoreServer::start(so));
    c.store_address = o.store;
    c.prefix = "miles-engine-tp";  // the followers were told only the store
    spdlog::info("miles serve: waiting for {} tensor-parallel followers at {}", o.tp - 1, o.store);
  }
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                         transport == "shm" ? connect_shm(c) : connect_gloo(c));
  MILES_ASSIGN_OR_RETURN(g.runner, rollout::make_tp_model_runner(std::move(comm), files.config,
                                                                 files.weights, engine, pool));
  spdlog::info("miles serve: tensor parallel over {} processes ({} launch, {})", o.tp, o.launch,
               transport);
  return g;
}

void register_engine_tp_worker(CLI::App& app) {
  struct Options {
    std::string store, prefix = "miles-engine-tp", host = "127.0.0.1", transport = "gloo";
    int rank = 1, world = 2, threads = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "engine-tp-worker", "A tensor-parallel follower of `miles serve --tp N` (rank 1..N-1)");
  sub->add_option("--store", o->store, "HOST:PORT of rank 0's store")->required();
  sub->add_option("--rank", o->rank, "this process's rank (1..world-1)")->required();
  sub->add_option("--world", o->world, "the engine's tensor-parallel size")->required();
  sub->add_option("--prefix", o->prefix, "the group's store namespace")->capture_default_str();
  sub->add_option("--host", o->host, "the address this rank's transport binds to")
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "compute threads (0 = all cores)")
      ->capture_default_str();
  sub->add_option("--transport", o->transport, "shm (rank 0 on this host) or gloo")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "gloo"}));
  sub->callback([o, sub] {
    if (o->rank < 1 || o->rank >= o->world)
      throw CLI::ValidationError("--rank", "must be in [1, world - 1]");
    CommOptions c;
    c.rank = o->rank;
    c.world_size = o->world;
    c.store_address = o->store;
    c.host = o->host;
    c.timeout = kGroupTimeout;
    c.prefix = o->prefix;
    auto comm = o->transport == "shm" ? connect_shm(c) : connect_gloo(c);
    if (!comm.ok()) throw CLI::RuntimeError(fail("engine-tp-worker", comm.message()));
    ThreadPool pool(o->threads);
    // Direct p2p weights bind --host when given, else the address rank 0 joined with (a local
    // launch's followers share its machine).
    auto intake = make_weight_group_intake(sub->count("--host") ? o->host : "");
    Status s = rollout::run_tp_engine_follower(**comm, &pool, intake.get());
    if (!s.ok())
      throw CLI::RuntimeError(
          fail("engine-tp-worker", "rank " + std::to_string(o->rank) + ": " + s.message()));
  });
}

}  // namespace miles::cli
