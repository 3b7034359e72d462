// TrainerRank: one rank of the trainer group of a job (`miles run` RL or SFT, `miles sft`) — the
// controller is rank 0, the other ranks are `miles train-worker` processes, started by the
// controller on its host or joining from other hosts (parallel.remote_ranks) — all running this
// same code.
//
// Why: the trainer's layouts (parallel.dp × pp × tp) train one batch across processes.
// Rank 0 broadcasts a command and the batch bytes (batch_wire.h) over the group's world
// communicator; every rank builds the same RL objective and calls Trainer::step with its data- and
// pipeline-parallel groups (so dp / pp layouts give the single-process numbers bit for bit, tp
// within 1e-6). Before a weight publish or a checkpoint, pipeline stages exchange their tensors and
// tensor-parallel shards are gathered so that rank 0 holds the whole model. With one rank there is
// no communication at all.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "miles/comm.h"
#include "miles/controller/child_process.h"
#include "miles/controller/run_config.h"
#include "miles/controller/trainer_seat.h"
#include "miles/tcp_store.h"
#include "miles/thread_pool.h"
#include "miles/trainer/rl_objective.h"
#include "miles/trainer/train_checkpoint.h"
#include "miles/trainer/trainer.h"
#include "miles/weight_sync/transfer_plan.h"

namespace miles::controller {

// What one rollout step's optimizer steps produced (on rank 0).
// |trainer logp − engine logp| per token, counted in TrainOutcome::sums as "mismatch_hist_K":
// bucket K holds the tokens in (kMismatchLimits[K − 1], kMismatchLimits[K]]; bucket 0 exactly 0.
inline constexpr int kMismatchBuckets = 11;
inline constexpr double kMismatchLimits[kMismatchBuckets] = {
    0, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 1.7976931348623157e308};

struct TrainOutcome {
  double loss = 0, grad_norm = 0, lr = 0;  // mean loss, max grad norm, last lr
  std::map<std::string, double> sums;      // metric sums over every rank and step
  double mismatch_max = 0;                 // max |trainer − engine logp| over rank 0's tokens
};

// Where a rank sits in the group and how it reaches the others.
struct RankPlace {
  int rank = 0;
  int world_size = 1;
  std::string store;               // the controller's rendezvous store, host:port
  std::string host = "127.0.0.1";  // the address this rank's collectives bind to
  bool remote = false;             // joined from another host: weight groups bind `host` too
};

// The address the trainer ranks on the controller's host bind their collectives to: parallel.host,
// else controller.host when some ranks are remote, else loopback.
std::string local_rank_host(const RunConfig& config);

class TrainerRank {
 public:
  // Loads the model (and on resume the newest checkpoint of checkpoint.dir), joins the group when
  // world_size > 1, becomes its pipeline stage / TP shard. `resumed` receives the checkpoint's
  // state (step 0 when none).
  static Result<std::unique_ptr<TrainerRank>> create(const RunConfig& config,
                                                     const RankPlace& place, TrainState* resumed);
  ~TrainerRank();

  // Rank 0, RL job: trains every rank on `samples` (num_steps_per_rollout optimizer steps).
  Result<TrainOutcome> train(const std::vector<TrainSample>& samples,
                             const std::vector<RlSampleData>& data);
  // Rank 0, SFT job: one optimizer step of every rank on `batch` (the SFT objective).
  Result<StepResult> train_sft(const std::vector<TrainSample>& batch);
  // Rank 0: the whole model, current (gathers stages and shards on every rank when needed).
  Result<const Trainer*> full();
  // Rank 0: tells the other ranks to exit.
  Status stop();
  // Rank 0, transport broadcast with pp > 1: the trainer ranks that lead pipeline stages 1..
  // ((dp, tp) = (0, 0)) start joining the weight group `prefix`-s<stage> of `store` as its rank 0
  // (world_size: 1 + engines), over shared memory when `shm` (else Gloo), and later send their
  // stage's buckets of a version over it. A leader that fails logs it and drops its group (the
  // engines see the failure and report it).
  Status join_weight_groups(const std::string& store, const std::string& prefix, int world_size,
                            double timeout_s, bool shm);
  Status send_stage_weights(int64_t version);
  // Ranks > 0: serves rank 0's commands until stop().
  Status follow();

  // This rank's trainer (a stage / shard in a group), for scoring when it is whole.
  Trainer& trainer() { return *trainer_; }
  bool whole() const { return layout_.pp() == 1 && layout_.tp() == 1; }
  const ParallelLayout& layout() const { return layout_; }
  int world_size() const { return layout_.world_size(); }

 private:
  TrainerRank() = default;
  Result<TrainOutcome> run_steps(const std::vector<TrainSample>& samples,
                                 const std::vector<RlSampleData>& data);
  Result<StepResult> run_sft_step(const std::vector<TrainSample>& batch);
  Result<const Trainer*> gather();
  Status command(int64_t cmd, const std::vector<uint8_t>& payload);
  bool leads_later_stage() const;
  void join_weight_group(const std::vector<uint8_t>& payload);
  void send_weight_version(const std::vector<uint8_t>& payload);

  RunConfig cfg_;
  RankPlace place_;
  ParallelLayout layout_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Communicator> world_;
  ParallelGroups groups_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<Trainer> gathered_;  // tp: the whole model assembled from the shards
  // A stage leader's weight group (transport broadcast, pp > 1) and the plan it follows.
  std::unique_ptr<Communicator> weight_group_;
  std::string weight_group_prefix_;
  std::unique_ptr<TransferPlan> weight_plan_;
};

// Rank 0 side of a group: the rendezvous store, the ranks started on this host
// (RUN_DIR/trainer_rank_R.log) and the seats kept for ranks joining from other hosts.
class TrainerWorkers {
 public:
  // Hosts the store (at local_rank_host) and starts ranks 1 .. world − remote_ranks − 1 here.
  static Result<std::unique_ptr<TrainerWorkers>> start(const RunConfig& config,
                                                       const std::string& config_path);
  ~TrainerWorkers();
  std::string store_address() const { return store_->address(); }
  // Rank 0's place in this group (the controller's own rank).
  RankPlace leader_place() const;
  // A remote rank joining (JoinTrainer, from `peer` as the controller sees it): the lowest free
  // remote rank, refused once every one is taken. Thread-safe.
  SeatReply claim_remote(const std::string& peer, int64_t pid, const std::string& hostname);

 private:
  RunConfig cfg_;
  std::string config_yaml_;
  std::unique_ptr<TcpStoreServer> store_;
  std::vector<ChildProcess> procs_;
  std::mutex seats_mu_;
  int next_remote_ = 0;  // the next remote rank to hand out
};

}  // namespace miles::controller
