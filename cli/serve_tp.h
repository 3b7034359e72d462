// `miles serve --tp N`: the engine's tensor-parallel group — rank 0 (this process) and N-1
// `miles engine-tp-worker` followers, started here (local launch) or by an external launcher.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "miles/controller/child_process.h"
#include "miles/rollout/engine.h"
#include "miles/tcp_store.h"

namespace miles::cli {

struct ServeTpOptions {
  int tp = 1;
  // "local": start the followers here; "external": wait for followers started elsewhere with
  // `miles engine-tp-worker --store <tp_store> --rank R --world N`.
  std::string launch = "local";
  std::string store;               // HOST:PORT rank 0 hosts the group's store on ("" = any port)
  std::string host = "127.0.0.1";  // the address rank 0's transport binds to
  // "shm": one shared-memory segment (every rank on this host; the default for a local launch);
  // "gloo": TCP (ranks on several hosts; the default for an external launch).
  std::string transport;
  int threads = 0;  // per process
};

// What keeps the group alive: the store (local launch) and the followers, killed with this
// process.
struct ServeTpGroup {
  std::unique_ptr<TcpStoreServer> store;
  std::vector<controller::ChildProcess> followers;
  std::unique_ptr<ModelRunner> runner;
};

// Loads `model_path`, starts or awaits the followers, and returns rank 0's runner over them.
Result<ServeTpGroup> start_serve_tp(const std::string& model_path, const ServeTpOptions& o,
                                    const EngineOptions& engine, ThreadPool* pool);

// `miles engine-tp-worker` (registered under `app`).
void register_engine_tp_worker(CLI::App& app);

}  // namespace miles::cli
