// The state behind `miles serve`'s weight-sync endpoints (serve_routes.h), shared by the disk-delta
// and checksum handlers (serve_routes.cc) and the broadcast-group handlers (serve_group_routes.cc).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "miles/comm.h"
#include "miles/model_config.h"
#include "miles/status.h"
#include "miles/weight_sync/weight_sync.h"
#include "miles/rollout/engine_driver.h"
#include "miles/rollout/tp_engine.h"
#include "miles/weight_sync/tp_intake.h"

namespace miles {

class ThreadPool;

// Replies of the weight-sync endpoints: JSON, errors as SGLang's {"success": false, "message"}.
inline void reply_json(httplib::Response& res, int status, const nlohmann::json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}
inline void reply_failure(httplib::Response& res, int status, const std::string& message) {
  reply_json(res, status, nlohmann::json{{"success", false}, {"message", message}});
}

// A weight group this engine was asked to join (POST /join_weight_group). connect_gloo blocks until
// every member has joined, so it runs on a thread of its own; an update waits for it.
struct WeightGroupJoin {
  std::string prefix;
  std::chrono::milliseconds timeout{60'000};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;  // of the join, once done
  std::unique_ptr<Communicator> comm;

  // Waits for the join to end: the communicator, or why there is none.
  Result<Communicator*> wait();
};

// A thread running connect_gloo for a join; `finished` once it returned.
struct JoinThread {
  std::thread thread;
  std::shared_ptr<std::atomic<bool>> finished;
};

struct WeightSyncRoutes {
  ~WeightSyncRoutes();  // waits for joins in flight (each bounded by its timeout)

  ModelConfig config;
  std::string model_path;
  ThreadPool* pool = nullptr;
  // A tensor-parallel engine's handle on its followers: with it, p2p joins that give engine_tp
  // have every rank receive its own shard (tp_intake.h). Null for a one-process engine.
  std::shared_ptr<rollout::TpShardIntake> tp_intake;
  TransferPlan plan;
  std::string plan_digest;               // transfer_plan_digest(plan)
  std::vector<std::string> store_hosts;  // joins reach stores here or on this machine

  std::mutex mu;         // one update at a time; guards the fields below
  int64_t version = -1;  // of `checksums` (-1: not computed yet)
  std::map<std::string, std::string> checksums;
  std::map<std::string, std::unique_ptr<WeightReceiver>> receivers;  // by delta directory

  std::mutex group_mu;  // guards the fields below
  // The current weight groups, one per pipeline stage of the sender (stage s's buckets come from
  // that stage's trainer rank over groups[s]); empty: none. A slot is null until joined.
  std::vector<std::shared_ptr<WeightGroupJoin>> groups;
  std::vector<JoinThread> joins;
  // p2p instead of broadcast: the trainer's ranks and the engines in one group (groups holds it).
  std::optional<P2pRoles> p2p;
  // Set when every rank of this tensor-parallel engine is a member of the current groups and
  // receives its own shard (tp_intake.h); unset: rank 0 receives whole tensors.
  std::optional<IntakeGroup> direct;
  // The plan a sender with trainer layout `layout` follows (made once per layout): broadcast uses
  // dp=1,pp=S,tp=1 for S stages, p2p the trainer's own layout. Under `group_mu`.
  Result<const TransferPlan*> plan_for(const ParallelLayout& layout);
  std::map<std::string, TransferPlan> plans;  // by ParallelLayout::to_string()

  // Checksums of the weights loaded at start-up (float32, as the trainer holds them). Under `mu`.
  Status initial_checksums();
  // Swaps a staged version into the engine and records its version and checksums. Under `mu`.
  // Returns the HTTP status: 200, 409 (generating and not paused) or 400.
  int apply(rollout::EngineDriver& driver, const ReceivedWeights& got, std::string* error);
  // The same for a runner built from shards received directly, with its (sharded) checksums.
  int apply_runner(rollout::EngineDriver& driver, std::unique_ptr<ModelRunner> runner,
                   int64_t version, std::map<std::string, std::string> sums, std::string* error);
  // Their end: on success the engine's version and checksums are `v` and `sums`; the HTTP status.
  int record(const Status& applied, int64_t v, std::map<std::string, std::string> sums,
             std::string* error);
  // Forgets `gs` if they are still the current groups (after an error: the controller re-forms
  // them).
  void drop_groups(const std::vector<std::shared_ptr<WeightGroupJoin>>& gs);
};

// POST /join_weight_group and POST /update_weights_from_group (serve_routes.h).
void register_group_routes(httplib::Server& server, std::shared_ptr<WeightSyncRoutes> state,
                           rollout::EngineDriver& driver);

}  // namespace miles
