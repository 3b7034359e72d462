// JobRuntime: what every job of the controller has, RL (rl_job.h) and SFT (sft_job.h) alike — its
// run directory, the controller's gRPC service (GetStatus, Stop, JoinTrainer) and its trainer group
// (rank 0 in this process; the other ranks started here or joining from other hosts).
//
// Why: the two kinds of job differ in what they feed the trainer, not in how a run is laid out,
// how its ranks are placed, found and stopped, or how it is observed from outside. One place owns
// that, so an SFT job gets remote ranks, Slurm / Kubernetes placement and `Stop` for free.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "miles/controller/controller_service.h"
#include "miles/controller/run_config.h"
#include "miles/controller/trainer_group.h"
#include "miles/trainer/train_checkpoint.h"

namespace miles::controller {

class JobRuntime {
 public:
  using Log = std::function<void(const std::string&)>;
  JobRuntime(const RunConfig& config, Log log) : cfg_(config), log_(std::move(log)) {}
  ~JobRuntime();

  // RUN_DIR and RUN_DIR/config.yaml (the resolved config the local ranks read).
  Status make_run_dir();
  // The run token (secret.h) and the service, before the trainer group: remote ranks join through
  // it. `status` fills GetStatus replies.
  Status start_service(std::function<void(v1::ControllerStatus*)> status);
  // Starts ranks 1.. of a layout larger than one (logging where they meet) and becomes rank 0;
  // returns the resumed checkpoint's state (step 0 when none).
  Result<TrainState> start_trainer_group();
  // Tells the other ranks to exit.
  Status stop_trainer_group() { return group_->stop(); }
  void stop_service();

  TrainerRank& group() { return *group_; }
  ControllerService& service() { return *service_; }
  const std::string& controller_address() const { return controller_address_; }
  // Set by the service's Stop call.
  bool should_stop() const { return service_ && service_->stop_requested(); }

 private:
  // JoinTrainer (the service's thread): a remote rank's seat, once the group exists.
  SeatReply claim_seat(const std::string& peer, int64_t pid, const std::string& hostname);

  RunConfig cfg_;
  Log log_;
  std::unique_ptr<ControllerService> service_;
  std::string controller_address_;               // the service's host:port
  std::unique_ptr<TrainerWorkers> workers_;      // ranks 1.. of the trainer group
  std::atomic<TrainerWorkers*> seats_{nullptr};  // read by the service's threads
  std::unique_ptr<TrainerRank> group_;           // rank 0: this process
};

}  // namespace miles::controller
