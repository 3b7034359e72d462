// WeightGroup: the controller's side of the broadcast transport in `miles run` — a Gloo group of
// the controller (rank 0, the only sender) and the ready engines (ranks 1..n), formed through a
// TcpStore the controller hosts, re-formed whenever the engines change, and one broadcast per
// version to all of them at once.
//
// Why: disk-delta makes every engine read each version from a shared directory; a broadcast moves
// the bytes over the network once per engine with no shared filesystem in the path. The group has
// to follow the pool: an engine that died, restarted or registered late is a different member, so
// any change of membership forms a new group under a fresh prefix ("wsync-<generation>"), and a
// transfer that fails drops the group so that the next one starts clean.
//
// One group per pipeline stage: the group of stage s is that stage's (dp = 0, tp = 0) trainer rank
// (rank 0) and the engines (ranks 1..n), under the prefix "wsync-<generation>-s<s>". The controller
// is stage 0's sender; the trainer ranks that lead stages 1.. join and send on command
// (StageSenders: `miles train-worker` processes, trainer_group.h). Engines receive the stages in
// order.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "controller/engine_client.h"
#include "miles/comm.h"
#include "miles/controller/run_config.h"
#include "miles/tcp_store.h"
#include "miles/weight_sync/transfer_plan.h"
#include "miles/weight_sync/weight_sync.h"

namespace miles::controller {

// The broadcast group of pipeline stage `stage` under a group prefix ("wsync-3" → "wsync-3-s1"):
// the name the controller, the stage leaders and the engines all use.
std::string weight_stage_prefix(const std::string& prefix, int stage);

// The plan a weight group follows for a trainer of layout `trainer`: broadcast sends whole stages
// (the plan of dp=1,pp=P,tp=1: each stage's leader sends its stage), p2p every rank's own shards
// (the trainer's layout). The controller and every train-worker make it alike.
Result<TransferPlan> weight_group_plan(Transport transport, const ModelConfig& config,
                                       const ParamLayout& params, const ParallelLayout& trainer);

// The other trainer ranks' part, driven by the controller (trainer rank 0). Broadcast: the leaders
// of stages 1.. join `prefix`-s<stage> as its rank 0 and send their stage. p2p: every trainer rank
// joins `prefix` as its own world rank and sends its own shards.
struct StageSenders {
  // Starts their joins of the group(s) of `store` (`world_size` members each, over shared memory
  // when `shm`); returns once they were told (they connect while the controller does).
  std::function<Status(const std::string& store, const std::string& prefix, int world_size,
                       double timeout_s, bool shm)>
      join;
  // They send their part of `version`.
  std::function<Status(int64_t version)> send;
  // p2p: trainer rank 0's own shards (the controller's TrainerRank).
  TensorSource local;
  // Every one of them runs on this host (no remote trainer ranks): shared memory reaches them.
  bool on_host = false;
};

struct WeightGroupOptions {
  std::string host = "127.0.0.1";  // the store and the controller's Gloo transport bind here
  std::chrono::milliseconds timeout{60'000};  // forming the group; each collective
  std::function<void(const std::string&)> log;
  StageSenders senders;  // needed when other trainer ranks send (pp > 1, or p2p with > 1 rank)
  // "broadcast" (one group per stage) or "p2p" (`trainer`'s ranks send their shards straight to
  // the engines: the plan is then made for `trainer`).
  Transport transport = Transport::kBroadcast;
  ParallelLayout trainer;
  // The engines' tensor-parallel ranks: each engine takes this many consecutive ranks of every
  // group and each of them receives its own shard (p2p: only its pieces, from the trainer ranks
  // holding them; broadcast: every bucket, keeping its slice).
  int engine_tp = 1;
  // The group's communicator: shared memory (shm: every engine on this host, with its
  // tensor-parallel followers), TCP (gloo), or auto: shm when every sending trainer rank is on
  // this host (one, or senders.on_host) and every engine's address is a loopback one, else gloo.
  // Explicit shm needs the first; an engine whose followers are on another host refuses it.
  WeightComm comm = WeightComm::kAuto;
};

class WeightGroup {
 public:
  // Starts the rendezvous store (bound to options.host, any free port). `plan`: the trainer's
  // (its pipeline stages give the groups: plan_stages).
  static Result<std::unique_ptr<WeightGroup>> create(WeightGroupOptions options, TransferPlan plan);

  // Brings every engine of `engines` to `version` of `source`: forms the group first when they are
  // not its members, then sends while every member receives (POST /update_weights_from_group, one
  // thread each). One status per engine, in order: an error for an engine that could not join or
  // receive. After any failure the group is dropped (formed again on the next call).
  // `known_xxh3` (optional): the checksums of `source`'s tensors, so that stage 0's bucket headers
  // need no second pass over the weights.
  std::vector<Status> update(const std::vector<std::shared_ptr<EngineClient>>& engines,
                             int64_t version, const TensorSource& source,
                             std::function<std::string(const std::string&)> known_xxh3 = {});

  const std::string& store_address() const { return store_address_; }

 private:
  WeightGroup(WeightGroupOptions options, TransferPlan plan)
      : options_(std::move(options)), plan_(std::move(plan)) {}
  // Forms a group of `engines`; statuses as update()'s. Members are those that joined.
  std::vector<Status> form(const std::vector<std::shared_ptr<EngineClient>>& engines);
  void drop();
  void log(const std::string& line) const;
  bool use_shm(const std::vector<std::shared_ptr<EngineClient>>& engines) const;

  WeightGroupOptions options_;
  TransferPlan plan_;
  std::string plan_digest_;
  std::unique_ptr<TcpStoreServer> store_;
  std::string store_address_;
  int64_t generation_ = 0;
  int stages_ = 1;
  bool p2p_ = false;
  int trainer_ranks_ = 1;               // p2p: the engines are ranks trainer_ranks_..
  int engine_tp_ = 1;                   // ranks per engine
  std::unique_ptr<Communicator> comm_;  // stage 0's group; null: no group
  std::vector<std::shared_ptr<EngineClient>> members_;  // group rank i + 1
};

}  // namespace miles::controller
