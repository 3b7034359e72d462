// GrpcServer: the RolloutEngine service of proto/miles/v1/rollout.proto over the EngineDriver — the
// same operations as the HTTP API, for the controller and trainers.
#pragma once

#include <memory>
#include <string>

#include "miles/model_config.h"
#include "miles/tokenizer.h"
#include "rollout/engine_driver.h"

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
  GrpcServer(EngineDriver& driver, const ModelConfig& config, std::shared_ptr<const Tokenizer> tok,
             ThreadPool* model_pool, std::string model_path);
  ~GrpcServer();
  // Listens on host:port (port 0: any free port; see port()).
  Status start(const std::string& host, int port);
  void stop();
  int port() const { return port_; }

 private:
  std::unique_ptr<RolloutService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace miles::rollout
