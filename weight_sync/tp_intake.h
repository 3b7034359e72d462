// The p2p transport into a tensor-parallel engine, every rank taking its own shard (weight_sync.h's
// P2pRoles.engine_tp): the requests rank 0 relays to its followers (rollout/tp_engine.h) and the
// followers' intake that acts on them.
//
// Why: without it the trainer sends whole tensors to the engine's rank 0, which slices them and
// sends every follower its shard: a second hop over the engine's group for (tp − 1)/tp of the
// bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "miles/comm.h"
#include "miles/weight_sync.h"
#include "rollout/tp_engine.h"

namespace miles {

// A follower's join: the group rank 0 joins (rank 0 is `options.rank`, follower j joins as
// options.rank + j) and the roles. JSON bytes.
std::vector<uint8_t> intake_join_request(const CommOptions& options, const P2pRoles& roles);
// One version's receive. JSON bytes.
std::vector<uint8_t> intake_receive_request(int64_t version);

// The followers' intake of `miles engine-tp-worker`: joins the p2p group with Gloo, binding `host`
// ("": the address rank 0 joined with, the same machine for a local launch), and receives this
// rank's shard with p2p_receive_weights.
std::unique_ptr<rollout::FollowerIntake> make_p2p_follower_intake(std::string host);

// Rank 0's shard as the tensor-parallel intake takes it.
rollout::ShardWeights to_shard(ReceivedWeights&& set);

}  // namespace miles
