// TrainerWorkers (trainer_group.h): rank 0's side of the trainer group — the rendezvous store, the
// ranks started on this host, the seats of the ranks that join from other hosts.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "miles/controller/trainer_group.h"

namespace miles::controller {

namespace {

int64_t world_of(const RunConfig& cfg) {
  return cfg.parallel.dp * cfg.parallel.pp * cfg.parallel.tp;
}

// The argv of a local rank: it reads the run's resolved config from `config_path`.
std::vector<std::string> local_rank_argv(const RunConfig& cfg, const std::string& config_path,
                                         const std::string& store, int64_t rank) {
  return {miles_executable(), "train-worker",
          "--rank",           std::to_string(rank),
          "--world-size",     std::to_string(world_of(cfg)),
          "--store",          store,
          "--host",           local_rank_host(cfg),
          "--config",         config_path};
}

}  // namespace

Result<std::unique_ptr<TrainerWorkers>> TrainerWorkers::start(const RunConfig& cfg,
                                                              const std::string& config_path) {
  auto w = std::unique_ptr<TrainerWorkers>(new TrainerWorkers());
  w->cfg_ = cfg;
  std::ifstream in(config_path);
  if (!in) return Status::Error("trainer group: cannot read " + config_path);
  std::ostringstream text;
  text << in.rdbuf();
  w->config_yaml_ = text.str();
  TcpStoreServerOptions so;
  so.host = local_rank_host(cfg);  // where every rank can reach it
  MILES_ASSIGN_OR_RETURN(w->store_, TcpStoreServer::start(so));
  const int64_t world = world_of(cfg);
  const int64_t first_remote = world - cfg.parallel.remote_ranks;
  w->next_remote_ = static_cast<int>(first_remote);
  for (int64_t r = 1; r < first_remote; ++r) {
    MILES_ASSIGN_OR_RETURN(
        ChildProcess p,
        ChildProcess::spawn(local_rank_argv(cfg, config_path, w->store_->address(), r),
                            cfg.logging.run_dir + "/trainer_rank_" + std::to_string(r) + ".log"));
    w->procs_.push_back(std::move(p));
  }
  return w;
}

RankPlace TrainerWorkers::leader_place() const {
  RankPlace p;
  p.world_size = static_cast<int>(world_of(cfg_));
  p.store = store_->address();
  p.host = local_rank_host(cfg_);
  return p;
}

SeatReply TrainerWorkers::claim_remote(const std::string& peer, int64_t pid,
                                       const std::string& hostname) {
  std::lock_guard<std::mutex> lock(seats_mu_);
  SeatReply reply;
  const int64_t world = world_of(cfg_);
  if (next_remote_ >= world) {
    reply.kind = SeatReply::Kind::kRefused;
    reply.message = "every remote trainer rank of this run has joined (parallel.remote_ranks: " +
                    std::to_string(cfg_.parallel.remote_ranks) + ")";
    return reply;
  }
  reply.kind = SeatReply::Kind::kSeat;
  reply.seat.rank = next_remote_++;
  reply.seat.world_size = static_cast<int>(world);
  reply.seat.store_address = store_->address();
  reply.seat.config_yaml = config_yaml_;
  spdlog::info("miles run: trainer rank {} joined from {} ({}, pid {})", reply.seat.rank, peer,
               hostname.empty() ? "?" : hostname, pid);
  return reply;
}

TrainerWorkers::~TrainerWorkers() {
  // Workers exit after the stop command; give them a moment, then make sure.
  for (ChildProcess& p : procs_) {
    for (int i = 0; i < 100 && p.alive(); ++i) usleep(50'000);
    p.terminate();
  }
}

}  // namespace miles::controller
