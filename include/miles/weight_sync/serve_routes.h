// Weight-sync endpoints of `miles serve` (registered through ServerOptions::extra_routes):
//   POST /update_weights_from_disk_delta {"dir": DIR, "weight_version": N}
//        advances the engine to version N of the disk-delta chain in DIR
//        (weight_sync/disk_delta_*): the whole version is staged and every checksum verified before
//        the swap (begin → update → version → end); refused with 409 while the engine is generating
//        (pause it first); on any error the engine keeps serving its current version.
//   POST /join_weight_group {"store": "host:port", "prefix": P, "rank": r, "world_size": W,
//        "timeout_s": t, "host": A, "plan_digest": D}
//        starts joining the Gloo group P of the controller's TcpStore (rank 0, the controller,
//        sends; the engines are ranks 1..W − 1) on a thread of its own, binding A (default
//        127.0.0.1), and replies at once; a later join replaces the group. The optional plan digest
//        (transfer_plan_digest) must be the engine's own: otherwise 400 at once. The store must be
//        on this machine or a trusted host (WeightSyncTrust::store_hosts): otherwise 403.
//        p2p ("transport": "p2p", "trainer_layout": L): one group of the trainer's ranks and the
//        engines; "engine_tp": N (a tensor-parallel engine's N ranks are ranks r..r+N−1, N its
//        --tp) makes every rank of this engine join and receive its own shard straight from the
//        trainer; its checksums are then reported per shard (sharded_checksum in weight_sync.h).
//   POST /update_weights_from_group {"weight_version": N}
//        waits for the join, receives version N over the group (broadcast_weights from rank 0),
//        verifies and swaps it in as the disk-delta route does (409 while generating and not
//        paused). On any error the engine keeps its version and drops the group (join it again).
//   GET  /weight_checksums  → {"weight_version": v, "checksums": {name: xxh3-128 hex}}
//   POST /check_weights {"checksums": {name: hex}} → {"success": bool, "message": …}: the trainer's
//        checksums against the engine's current weights (check_weights in weight_sync.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "miles/model_config.h"
#include "miles/rollout/engine_driver.h"
#include "miles/rollout/tp_engine.h"

namespace httplib {
class Server;
}

namespace miles {
class ThreadPool;

struct WeightSyncRoutes;  // state shared by the handlers (current checksums, delta receivers)

// What the routes may reach on a client's word: delta directories inside `weight_dirs`
// (path_guard.h; empty: any) and group stores on this machine or `store_hosts` (host_guard.h).
struct WeightSyncTrust {
  std::vector<std::string> weight_dirs;
  std::vector<std::string> store_hosts;
};

// `model_path` is where the served weights came from (their checksums are computed on first use).
std::shared_ptr<WeightSyncRoutes> register_weight_sync_routes(
    httplib::Server& server, rollout::EngineDriver& driver, const ModelConfig& config,
    const std::string& model_path, ThreadPool* pool,
    std::shared_ptr<rollout::TpShardIntake> tp_intake = nullptr, WeightSyncTrust trust = {});

}  // namespace miles
