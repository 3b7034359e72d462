// The SGLang-style HTTP adapter onto the engine's weight lifecycle (engine_weights.h), registered
// by `miles serve` through ServerOptions::extra_routes. Each route translates JSON to the typed
// step and back; errors are SGLang's {"success": false, "message"} with 400 / 403 / 409 / 500
// (WeightFault). The controller uses the gRPC twin (grpc_weights.h).
//   POST /update_weights_from_disk_delta {"dir": DIR, "weight_version": N}
//        advances the engine to version N of the disk-delta chain in DIR; 409 while the engine is
//        generating (pause it first); on any error the engine keeps serving its current version.
//   POST /join_weight_group {"store": "host:port", "prefix": P, "rank": r, "world_size": W,
//        "timeout_s": t, "host": A, "plan_digest": D, "stage": s, "stages": S,
//        "transport": "broadcast" | "p2p", "trainer_layout": L, "engine_tp": N}
//        starts joining (GroupJoinSpec) and replies at once {"success", "prefix", "stage"}; 403 for
//        a store neither on this machine nor a trusted host.
//   POST /update_weights_from_group {"weight_version": N}
//        receives version N over the joined group(s), verifies and swaps it in.
//   GET  /weight_checksums  → {"weight_version": v, "checksums": {name: xxh3-128 hex}}
//   POST /check_weights {"checksums": {name: hex}} → {"success": bool, "weight_version", "message"}
#pragma once

#include <memory>

namespace httplib {
class Server;
}

namespace miles {

class EngineWeights;

void register_weight_sync_routes(httplib::Server& server, std::shared_ptr<EngineWeights> weights);

}  // namespace miles
