// EngineWeights: the engine's weight lifecycle, one component with one entry point per step —
// join a weight group, receive a version (over the group or a disk-delta chain, or a whole
// checkpoint), verify it, adopt it (swap it into the engine under its version), report and check
// its checksums. Pausing and versions without new weights are the engine's own (Engine::pause,
// update_weight_version).
//
// Why: the controller reaches it over gRPC (proto/miles/v1/weights.proto, grpc_weights.h) and
// SGLang-style trainers over HTTP (serve_routes.h); both adapters only translate, so the state
// machine is tested without either (tests/engine_weights_test.cc). docs/contracts.md states the
// lifecycle's contract.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "miles/model_config.h"
#include "miles/rollout/engine_driver.h"
#include "miles/rollout/tp_engine.h"
#include "miles/status.h"

namespace miles {

class ThreadPool;

// Why a lifecycle step was refused: the request is malformed or does not fit the engine
// (kInvalid), reaches a path or store it may not (kForbidden), arrives while the engine generates
// unpaused (kConflict), or the engine failed (kInternal). HTTP answers 400 / 403 / 409 / 500, gRPC
// INVALID_ARGUMENT / PERMISSION_DENIED / FAILED_PRECONDITION / INTERNAL.
enum class WeightFault { kNone, kInvalid, kForbidden, kConflict, kInternal };

// The outcome of a step: on success the engine's weight version after it.
struct WeightReply {
  WeightFault fault = WeightFault::kNone;
  std::string message;
  int64_t version = -1;

  bool ok() const { return fault == WeightFault::kNone; }
  static WeightReply done(int64_t version) { return {WeightFault::kNone, "", version}; }
  static WeightReply refuse(WeightFault fault, std::string message) {
    return {fault, std::move(message), -1};
  }
};

// A weight group to join: group `prefix` of the TcpStore at `store`, as `rank` of `world_size`
// (rank 0 or the trainer's ranks send), binding `host` for Gloo. Broadcast (trainer_layout empty):
// the group carrying pipeline stage `stage` of `stages`. p2p (trainer_layout "dp=A,pp=B,tp=C"):
// one group of the trainer's ranks (0..W−1) and the engines (W..world_size−1). `engine_tp`: the
// engine's tensor-parallel ranks are ranks rank..rank+engine_tp−1, each taking its own shard (1:
// the engine's rank 0 takes whole tensors). `plan_digest`, when set, must be the engine's own.
struct GroupJoinSpec {
  std::string store, prefix, host = "127.0.0.1", plan_digest;
  int rank = 1, world_size = 2;
  double timeout_s = 60;
  int stage = 0, stages = 1;
  std::string trainer_layout;  // non-empty: p2p
  int engine_tp = 1;
  std::string comm = "gloo";  // gloo (TCP) | shm (shared memory: every member on this host)
};

// What the lifecycle may reach on a caller's word: checkpoints and delta directories inside
// `weight_dirs` (path_guard.h; empty: any) and group stores on this machine or `store_hosts`
// (host_guard.h).
struct WeightSyncTrust {
  std::vector<std::string> weight_dirs;
  std::vector<std::string> store_hosts;
};

// The engine's version and the xxh3-128 (hex) of each tensor as the trainer holds it (float32);
// a tensor-parallel engine that received shards directly reports sharded_checksum (weight_sync.h).
struct WeightChecksums {
  int64_t version = 0;
  std::map<std::string, std::string> checksums;
};

// The trainer's checksums against the engine's: `match` when every tensor agrees.
struct WeightCheck {
  bool match = false;
  int64_t version = 0;
  std::string message;
};

class EngineWeights {
 public:
  // `model_path`: where the served weights came from (their checksums are computed on first use).
  // `tp_intake`: a tensor-parallel engine's handle on its followers (null for one process).
  EngineWeights(rollout::EngineDriver& driver, ModelConfig config, std::string model_path,
                ThreadPool* pool, std::shared_ptr<rollout::TpShardIntake> tp_intake = nullptr,
                WeightSyncTrust trust = {});
  ~EngineWeights();  // waits for joins in flight (each bounded by its timeout)
  EngineWeights(const EngineWeights&) = delete;
  EngineWeights& operator=(const EngineWeights&) = delete;

  // Starts joining a group on a thread of its own and returns at once (the group forms when every
  // member joined; an update waits for it). A later join replaces the groups.
  WeightReply join_group(const GroupJoinSpec& spec);
  // Receives `version` over the joined group(s) (the senders send meanwhile), verifies and adopts
  // it. On any error the engine keeps its version and the groups are dropped (join again); a
  // negative version is refused before anything is received, and the groups are kept.
  WeightReply update_from_group(int64_t version);
  // Advances to `version` (>= 0) of the disk-delta chain in `dir`: staged whole, verified, adopted.
  WeightReply update_from_disk_delta(const std::string& dir, int64_t version);
  // Loads a whole checkpoint (safetensors or GGUF) and swaps it in; the caller sets the version.
  WeightReply load_checkpoint(const std::string& path);

  Result<WeightChecksums> checksums();
  Result<WeightCheck> check(const std::map<std::string, std::string>& trainer_checksums);
  // transfer_plan_digest of the plan a one-process sender follows.
  const std::string& plan_digest() const;

  // Called on the engine's thread after every adopted version (over a group or a disk-delta
  // chain; not load_checkpoint, whose caller sets the version) with the version and its full
  // weights (HF names), or null where the engine received only its shards (a tensor-parallel
  // engine's direct p2p): what follows a version besides the model (the co-trained draft head,
  // `miles serve --spec-draft-head`). Set before any update.
  using AdoptHook = std::function<void(Engine&, int64_t version, const TensorMap* weights)>;
  void set_adopt_hook(AdoptHook hook);

  struct State;  // weight_sync/engine_weights_state.h

 private:
  std::unique_ptr<State> st_;
};

}  // namespace miles
