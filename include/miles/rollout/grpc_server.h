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
class ServerContext;
class Service;
class Status;
}  // namespace grpc

namespace miles {
class ThreadPool;
}

namespace miles::rollout {

class RolloutService;

// "authorization: Bearer <key>" metadata against `keys` (none: open); `admin` calls need the admin
// key. UNAUTHENTICATED with the reason otherwise. Every service of the engine's port uses it.
grpc::Status authorize_grpc_call(const grpc::ServerContext& ctx, const ApiKeys& keys, bool admin);

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
  // Serves another service beside RolloutEngine on the same port (the engine's weight lifecycle,
  // weight_sync/grpc_weights.h); before start(). The service outlives the server.
  void add_service(grpc::Service* service) { extra_services_.push_back(service); }
  // How UpdateWeightsFromDisk swaps in a checkpoint (default: load_checkpoint_into).
  void set_checkpoint_loader(CheckpointLoader load);

 private:
  std::unique_ptr<RolloutService> service_;
  std::vector<grpc::Service*> extra_services_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace miles::rollout
