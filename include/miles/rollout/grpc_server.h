// GrpcServer: the RolloutEngine service of proto/miles/v1/rollout.proto over the EngineDriver — the
// same operations as the HTTP API, for the controller and trainers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "miles/model_config.h"
#include "miles/secret.h"
#include "miles/tokenizer.h"
#include "miles/rollout/engine_driver.h"

namespace grpc {
class Server;
}

namespace miles {
class ThreadPool;
}

namespace miles::rollout {

class RolloutService;

class GrpcServer {
 public:
  // keys: what callers must present as "authorization: Bearer <key>" metadata (none: open).
  // weight_dirs: the directories UpdateWeightsFromDisk may load from (path_guard.h; empty: any,
  // a library default; `miles serve` names the model's and --weights-dir).
  GrpcServer(EngineDriver& driver, const ModelConfig& config, std::shared_ptr<const Tokenizer> tok,
             ThreadPool* model_pool, std::string model_path, ApiKeys keys = {},
             std::vector<std::string> weight_dirs = {});
  ~GrpcServer();
  // Listens on host:port (port 0: any free port; see port()); with TLS when given a certificate
  // and key (PEM files).
  Status start(const std::string& host, int port, const std::string& ssl_certfile = "",
               const std::string& ssl_keyfile = "");
  void stop();
  int port() const { return port_; }

 private:
  std::unique_ptr<RolloutService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace miles::rollout
