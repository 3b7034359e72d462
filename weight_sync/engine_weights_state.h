// The state behind EngineWeights (engine_weights.h), shared by the receive / verify / adopt steps
// (engine_weights.cc) and the weight groups' join and receive (engine_weights_group.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "miles/comm.h"
#include "miles/model_config.h"
#include "miles/rollout/engine_driver.h"
#include "miles/rollout/tp_engine.h"
#include "miles/status.h"
#include "miles/weight_sync/engine_weights.h"
#include "miles/weight_sync/tp_intake.h"
#include "miles/weight_sync/weight_sync.h"

namespace miles {

// A weight group this engine was asked to join. connect_gloo blocks until every member has
// joined, so it runs on a thread of its own; an update waits for it.
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

// The groups of the current join: one per pipeline stage of the sender (stage s's buckets come
// from that stage's trainer rank over groups[s]), or one p2p group; a slot is null until joined.
struct WeightGroups {
  std::vector<std::shared_ptr<WeightGroupJoin>> joins;
  // p2p instead of broadcast: the trainer's ranks and the engines in one group.
  std::optional<P2pRoles> p2p;
  // Set when every rank of this tensor-parallel engine is a member and receives its own shard
  // (tp_intake.h); unset: rank 0 receives whole tensors.
  std::optional<IntakeGroup> direct;
};

struct EngineWeights::State {
  rollout::EngineDriver* driver = nullptr;
  ModelConfig config;
  std::string model_path;
  ThreadPool* pool = nullptr;
  std::shared_ptr<rollout::TpShardIntake> tp_intake;
  WeightSyncTrust trust;
  TransferPlan plan;  // a one-process sender's
  std::string plan_digest;
  EngineWeights::AdoptHook adopt_hook;

  std::mutex mu;  // one update at a time; guards the fields below
  bool have_checksums = false;
  std::map<std::string, std::string> checksums;  // of the weights the engine serves
  std::map<std::string, std::unique_ptr<WeightReceiver>> receivers;  // by delta directory
  // The last group receive's buffers, which the next one fills again: the model copies what it
  // adopts, and writing into fresh pages costs a page fault per 4 KiB (1.7 GB/s against memcpy's
  // 10 on the benchmarks' VM). A second copy of the weights stays in memory for it.
  ReceivedWeights staging;

  std::mutex group_mu;  // guards the fields below
  WeightGroups groups;
  std::vector<JoinThread> threads;
  std::map<std::string, TransferPlan> plans;  // by ParallelLayout::to_string()

  // The plan a sender with trainer layout `layout` follows (made once per layout): broadcast uses
  // dp=1,pp=S,tp=1 for S stages, p2p the trainer's own layout. Under `group_mu`.
  Result<const TransferPlan*> plan_for(const ParallelLayout& layout);
  // The engine's weight version now.
  int64_t engine_version();
  // Checksums of the weights loaded at start-up (float32, as the trainer holds them). Under `mu`.
  Status initial_checksums();
  // Swaps a received version into the engine and records its checksums. Under `mu`.
  WeightReply adopt(const ReceivedWeights& got);
  // The same for a runner built from shards received directly, with its (sharded) checksums.
  WeightReply adopt_runner(std::unique_ptr<ModelRunner> runner, int64_t version,
                           std::map<std::string, std::string> sums);
  // Their end: on success the engine serves `sums` at `version`.
  WeightReply record(const Status& applied, int64_t version,
                     std::map<std::string, std::string> sums);
  // Forgets `joins` if they are still the current groups (after an error: the sender re-forms
  // them).
  void drop_groups(const std::vector<std::shared_ptr<WeightGroupJoin>>& joins);
};

// A version an update names is an integer >= 0, whichever protocol brought it (HTTP refuses a
// negative one as it parses the body; gRPC's int64 field comes here as it is).
inline WeightReply refuse_negative_version(int64_t version) {
  return WeightReply::refuse(WeightFault::kInvalid, "weight_version " + std::to_string(version) +
                                                        " is negative: versions are integers >= 0");
}

}  // namespace miles
