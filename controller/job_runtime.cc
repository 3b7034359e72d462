// JobRuntime (job_runtime.h): run directory, controller service, trainer group.
#include "controller/job_runtime.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "miles/host_port.h"
#include "miles/secret.h"

namespace miles::controller {

namespace {

// The run token (secret.h): the one this process was given (MILES_RUN_TOKEN), else a fresh one.
// The engines and ranks this process starts inherit it as their API keys; engines started
// elsewhere are given the same secret as MILES_API_KEY (scripts/slurm, scripts/k8s).
void ensure_run_token() {
  if (run_token().empty()) ::setenv("MILES_RUN_TOKEN", fresh_token().c_str(), 1);
  const std::string t = run_token();
  ::setenv("MILES_API_KEY", t.c_str(), 1);
  ::setenv("MILES_ADMIN_API_KEY", t.c_str(), 1);
}

}  // namespace

JobRuntime::~JobRuntime() {
  stop_service();  // first: its calls read the members below
  group_.reset();  // before the workers: their store and processes go last
  workers_.reset();
}

void JobRuntime::stop_service() {
  if (service_) service_->stop();
}

Status JobRuntime::make_run_dir() {
  std::error_code ec;
  std::filesystem::create_directories(cfg_.logging.run_dir, ec);
  if (ec) return Status::Error("logging.run_dir " + cfg_.logging.run_dir + ": " + ec.message());
  std::ofstream(cfg_.logging.run_dir + "/config.yaml") << run_config_to_yaml(cfg_);
  return Status::Ok();
}

Status JobRuntime::start_service(std::function<void(v1::ControllerStatus*)> status) {
  ensure_run_token();
  service_ = std::make_unique<ControllerService>(
      std::move(status), [this](const std::string& peer, int64_t pid, const std::string& host) {
        return claim_seat(peer, pid, host);
      });
  MILES_RETURN_IF_ERROR(
      service_->start(cfg_.controller.host, static_cast<int>(cfg_.controller.port)));
  controller_address_ = host_port(cfg_.controller.host, service_->port());
  nlohmann::json cj = {{"address", controller_address_}, {"pid", static_cast<int64_t>(getpid())}};
  std::ofstream(cfg_.logging.run_dir + "/controller.json") << cj.dump() << "\n";
  log_("controller listening on " + controller_address_);
  return Status::Ok();
}

SeatReply JobRuntime::claim_seat(const std::string& peer, int64_t pid,
                                 const std::string& hostname) {
  SeatReply r;
  if (cfg_.parallel.remote_ranks == 0) {
    r.kind = SeatReply::Kind::kRefused;
    r.message = "this run has no remote trainer ranks (parallel.remote_ranks: 0)";
    return r;
  }
  TrainerWorkers* w = seats_.load();
  if (!w) {
    r.message = "the controller is still starting its trainer group";
    return r;
  }
  return w->claim_remote(peer, pid, hostname);
}

Result<TrainState> JobRuntime::start_trainer_group() {
  const ParallelSection& p = cfg_.parallel;
  const int64_t world = p.dp * p.pp * p.tp;
  if (world > 1) {
    MILES_ASSIGN_OR_RETURN(workers_,
                           TrainerWorkers::start(cfg_, cfg_.logging.run_dir + "/config.yaml"));
    seats_ = workers_.get();
    log_("trainer group: " + std::to_string(world) + " ranks (dp " + std::to_string(p.dp) +
         ", pp " + std::to_string(p.pp) + ", tp " + std::to_string(p.tp) + "), rendezvous at " +
         workers_->store_address());
    if (p.remote_ranks > 0)
      log_("waiting for " + std::to_string(p.remote_ranks) +
           " remote trainer rank(s): miles train-worker --controller " + controller_address_);
  }
  TrainState st;
  MILES_ASSIGN_OR_RETURN(
      group_, TrainerRank::create(cfg_, workers_ ? workers_->leader_place() : RankPlace{}, &st));
  return st;
}

}  // namespace miles::controller
