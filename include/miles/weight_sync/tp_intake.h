// Weight groups into a tensor-parallel engine, every rank taking its own shard: the requests rank 0
// relays to its followers (include/miles/rollout/tp_engine.h) and the followers' intake that acts on them. p2p:
// each rank receives only its shard, piece by piece from the trainer ranks that hold it; broadcast:
// each rank is a member of every stage's group, checks each whole tensor as it arrives and keeps
// its shard (one bucket at a time, so no rank ever stages the whole model).
//
// Why: otherwise the engine's rank 0 receives whole tensors, stages the whole version, slices it
// and sends every follower its shard: a second hop over the engine's group for (tp − 1)/tp of the
// bytes, and the whole model in rank 0's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "miles/comm.h"
#include "miles/weight_sync/weight_sync.h"
#include "miles/rollout/tp_engine.h"

namespace miles {

// The weight group a tensor-parallel engine's ranks join (rank 0 as CommOptions::rank, follower j
// as that rank + j).
struct IntakeGroup {
  std::string transport = "p2p";  // or "broadcast"
  std::string comm = "gloo";      // the groups' communicator: or "shm" (the followers join it)
  int stage = 0, stages = 1;      // broadcast: which stage's group, of how many
  // p2p: the trainer's layout and the engines; both: engine_tp, this engine's ranks.
  P2pRoles roles;
};

// A follower's join request (JSON bytes).
std::vector<uint8_t> intake_join_request(const CommOptions& options, const IntakeGroup& group);
// One version's receive (JSON bytes).
std::vector<uint8_t> intake_receive_request(int64_t version);

// The followers' intake of `miles engine-tp-worker`: joins the groups with Gloo, binding `host`
// ("": the address rank 0 joined with, the same machine for a local launch), and receives this
// rank's shard of each version.
std::unique_ptr<rollout::FollowerIntake> make_weight_group_intake(std::string host);

// This rank's shard of `version` over the groups it joined (`comms`: p2p one, broadcast one per
// stage, in order), as every rank of the engine receives it: rank 0 calls it for itself.
Result<rollout::ShardWeights> receive_shard(std::span<Communicator* const> comms,
                                            const TransferPlan& plan, const IntakeGroup& group,
                                            int64_t version, int tp_rank);

}  // namespace miles
