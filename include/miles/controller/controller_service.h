// The controller's gRPC service (proto/miles/v1/controller.proto) and the engine side of it.
//
// Why: engines and trainer ranks started anywhere (by the controller, by Slurm, by a Kubernetes
// StatefulSet, on another host) announce themselves to the controller instead of being listed by
// hand; tools ask a running job where it is; an operator stops it cleanly.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "miles/controller/trainer_seat.h"
#include "miles/status.h"
#include "miles/v1/controller.pb.h"

namespace grpc {
class Server;
}

namespace miles::controller {

class EnginePool;

// JoinTrainer's handler (TrainerWorkers::claim_remote): the caller's address as seen here, its
// pid and host name.
using SeatFn =
    std::function<SeatReply(const std::string& peer, int64_t pid, const std::string& hostname)>;

class ControllerService {
 public:
  // `status` fills GetStatus replies (engines are added from the pool once attached); `seats`
  // answers JoinTrainer. The service may listen before the engine pool exists: engines that
  // register earlier are told to try again.
  ControllerService(std::function<void(v1::ControllerStatus*)> status, SeatFn seats);
  ~ControllerService();
  void attach_engines(EnginePool& pool);
  // Listens on host:port (0: any free port).
  Status start(const std::string& host, int port);
  int port() const { return port_; }
  void stop();
  // Set by the Stop call.
  bool stop_requested() const { return stop_requested_; }

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<bool> stop_requested_{false};
};

// What `miles serve --controller HOST:PORT` sends once its servers listen. Retries until the
// controller answers (or `timeout_s` passes, or `stop` returns true between tries); an explicit
// refusal is an error at once.
struct EngineRegistration {
  std::string host;  // empty: the controller uses the address it sees
  int http_port = 0, grpc_port = 0;
  int64_t engine_id = -1;
  int64_t pid = 0;
  int64_t weight_version = 0;
  std::string token;  // the run token the controller requires (the engine's API key)
};
Result<int64_t> register_with_controller(const std::string& controller,
                                         const EngineRegistration& reg, double timeout_s,
                                         const std::function<bool()>& stop = nullptr);

// What `miles train-worker --controller HOST:PORT` asks for: a remote trainer rank's seat, and the
// address the controller saw the call come from. Retries while the controller is unreachable or
// not ready (up to `timeout_s`); a refusal is an error at once.
struct JoinedSeat {
  TrainerSeat seat;
  std::string peer_host;
};
Result<JoinedSeat> join_trainer_group(const std::string& controller, const std::string& token,
                                      double timeout_s);

}  // namespace miles::controller
