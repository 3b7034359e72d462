// TrainerSeat: what a trainer rank joining from another host is given (`miles train-worker
// --controller HOST:PORT`, the JoinTrainer call of proto/miles/v1/controller.proto).
//
// Why: with parallel.remote_ranks > 0 the controller starts only the ranks on its own host; the
// others are started by Slurm, Kubernetes or an operator anywhere, and learn their rank, the
// rendezvous store and the run's config from the controller instead of from their command line.
#pragma once

#include <string>

namespace miles::controller {

struct TrainerSeat {
  int rank = 0, world_size = 1;
  std::string store_address;  // the rendezvous store (at parallel.host), host:port
  std::string config_yaml;    // the run's resolved config
};

// JoinTrainer's answer: a seat, not yet (the controller is still loading: try again), or refused.
struct SeatReply {
  enum class Kind { kSeat, kNotYet, kRefused } kind = Kind::kNotYet;
  TrainerSeat seat;
  std::string message;  // kNotYet / kRefused: why
};

}  // namespace miles::controller
