// Weight sync: moving a new weight version from the trainer to every rollout engine, completely and
// exactly, over a TransferPlan (transfer_plan.h).
//
// Why: a half-applied update silently poisons every later sample. A version travels as the plan's
// buckets, each carrying an xxh3-128 of every tensor's bytes; a receiver stages the whole version,
// verifies every checksum, and only then swaps it into its engine inside begin / end_weight_update
// — so an engine serves v − 1 until it holds all of v, and reports the error when a transfer is
// cut.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/parallel_layout.h"
#include "miles/status.h"
#include "miles/weight_sync/disk_delta.h"
#include "miles/weight_sync/transfer_plan.h"

namespace miles {

class Communicator;
class Engine;
class ModelRunner;
class ThreadPool;

// xxh3-128 of bytes, as 32 hex digits.
std::string xxh3_128_hex(const void* data, size_t size);

// One version as received: float32 tensors by name, and each tensor's checksum.
struct ReceivedWeights {
  int64_t version = -1;
  std::map<std::string, std::vector<float>> tensors;  // owned
  // Or lent: tensors a receiver keeps anyway (a disk-delta receiver's current version, the base of
  // its next delta), shared instead of copied; `lent_owner` keeps them alive and unchanged (the
  // receiver copies before it changes a set still lent). A name is in one of the two maps.
  std::map<std::string, std::span<const float>> lent;
  std::shared_ptr<const void> lent_owner;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> checksums;  // xxh3-128 hex of the float32 bytes
  // Every checksum was computed from these bytes as they arrived and matched the sender's
  // (broadcast_weights), or from bytes assembled from pieces that each matched the sender's
  // (p2p_receive_weights), or verified against a disk-delta manifest: verify_received_weights
  // then checks the set without hashing again.
  bool verified = false;
  TensorMap view() const;  // views for Model::from_weights
  // A tensor's values, owned or lent; nullopt when the set has no such tensor.
  std::optional<std::span<const float>> values(const std::string& name) const;
  size_t size() const { return tensors.size() + lent.size(); }
};

// The sender's access to the full (gathered) tensors of its stage, by name.
using TensorSource = std::function<std::span<const float>(const std::string& name)>;

// Broadcast transport: for each bucket, its sender (a trainer stage leader) broadcasts the version,
// each tensor straight from its source (Communicator::broadcast_chunks: every receiver hashes the
// pieces as they arrive), then the tensors' checksums, to every member of `group` — the stage
// leaders and every engine rank, formed through the controller's rendezvous. Every member calls the
// same function with the same plan; ranks are group ranks (`sender_group_rank` maps a bucket's
// world sender to its rank in the group).
struct BroadcastOptions {
  std::function<int(int world_rank)> sender_group_rank = [](int r) { return r; };
  // On the sender: the xxh3-128 hex of a tensor of the version being sent when the caller already
  // has it ("" or unset: hash it here). Saves a pass over every weight; a wrong value is caught by
  // every receiver's check.
  std::function<std::string(const std::string& name)> known_xxh3;
  // On a receiver: keep only shard `shard_rank` of `shard_size` of every tensor (tensor_parallel's
  // split: a rank of a tensor-parallel engine), after checking the whole tensor's checksum on
  // arrival; the staged tensors, shapes and checksums are then the shard's. 1: whole tensors
  // (each also checked on arrival).
  int shard_rank = 0, shard_size = 1;
};
// Sender and receivers must hold the same plan (bucket bytes, tensors, offsets, senders): its
// digest (xxh3-128 hex over all of them) lets them compare before they form a group.
std::string transfer_plan_digest(const TransferPlan& plan);
// On a sender: source gives its stage's tensors (others are never asked for). On a receiver: source
// is null and the version is staged into `out` (the plan's tensors overwritten in place, so an
// `out` kept from the last version reuses its buffers; other entries are left). Every member
// returns an error if any bucket fails.
Status broadcast_weights(Communicator& group, const TransferPlan& plan, int64_t version,
                         const TensorSource& source, ReceivedWeights* out,
                         const BroadcastOptions& options = {});

// Broadcast with one group per pipeline stage (docs/contracts.md §3): the
// group of stage s has that stage's (dp = 0, tp = 0) trainer rank as rank 0 and the engines after
// it, and carries only stage s's buckets (stage_plan). A stage leader calls send_stage_weights on
// its group; a receiver calls receive_stage_weights with every stage's group, in stage order, and
// gets the whole version (every checksum of every stage) or an error naming the stage.
Status send_stage_weights(Communicator& group, const TransferPlan& plan, int stage, int64_t version,
                          const TensorSource& source,
                          std::function<std::string(const std::string&)> known_xxh3 = {});
// `shard_rank` / `shard_size`: BroadcastOptions' (a tensor-parallel engine rank keeps its shard).
Status receive_stage_weights(std::span<Communicator* const> groups, const TransferPlan& plan,
                             int64_t version, ReceivedWeights* out, int shard_rank = 0,
                             int shard_size = 1);

// P2P transport: every trainer rank of data-parallel replica 0 sends its own tensor-parallel shards
// straight to the engine ranks that need them, bucket by bucket following the plan (no gather on
// the trainer side, no second hop inside an engine). An engine of `engine_tp` tensor-parallel ranks
// takes part with every rank: rank j receives exactly its shard (tensor_parallel.h's split over
// engine_tp), each piece from the trainer rank that holds it, then a checksum per piece (hashed
// on both sides while the pieces move). World
// ranks: the trainer's [0, trainer.world_size()) in its layout's order, then engine e's tensor-
// parallel ranks 0..engine_tp-1.
struct P2pRoles {
  ParallelLayout trainer;
  int num_engines = 1;
  int engine_tp = 1;
  int engine_rank(int e, int j = 0) const { return trainer.world_size() + e * engine_tp + j; }
  int world_size() const { return trainer.world_size() + num_engines * engine_tp; }
};
// On a trainer rank: `local_shards` gives this rank's piece of a tensor of its stage (the whole
// tensor without tensor parallelism). Ranks with dp > 0 return at once.
Status p2p_send_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                        const TensorSource& local_shards, const P2pRoles& roles);
// On an engine rank: stages this rank's part of the version into `out`: the full tensors when
// engine_tp is 1, else this rank's shard of each (local shapes); checksums are of those bytes.
Status p2p_receive_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                           const P2pRoles& roles, ReceivedWeights* out);

// The checksum a tensor-parallel engine whose ranks received their shards directly reports for a
// tensor (GET /weight_checksums): a replicated tensor's own xxh3-128 (every rank holds it whole);
// for a split one "tp<N>:" and the xxh3-128 of its N shards' checksums (hex, in rank order).
std::string sharded_checksum(const std::string& name, std::span<const std::string> shard_sums);
// The same from the full tensor (the trainer's side of a check), sliced as tensor_parallel::slice
// does; engine_tp 1 gives the plain xxh3-128.
std::string sharded_checksum_of(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const float> full, int engine_tp);

// ---- One interface over the transports ------------------------------------------------------
// A trainer rank holds a WeightSender, every engine a WeightReceiver, both made once for a plan.
// After each optimizer step the trainer calls send(v) and each engine receive(v) → apply_to_engine.
class WeightSender {
 public:
  virtual ~WeightSender() = default;
  // Publishes `version` of the tensors `source` gives (the rank's own share, per transport).
  virtual Status send(int64_t version, const TensorSource& source) = 0;
};

class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;
  // Stages `version` completely, every checksum verified; an error leaves nothing applied.
  virtual Result<ReceivedWeights> receive(int64_t version) = 0;
};

std::unique_ptr<WeightSender> make_broadcast_sender(Communicator& group, TransferPlan plan,
                                                    BroadcastOptions options = {});
std::unique_ptr<WeightReceiver> make_broadcast_receiver(Communicator& group, TransferPlan plan,
                                                        BroadcastOptions options = {});
std::unique_ptr<WeightSender> make_p2p_sender(Communicator& world, TransferPlan plan,
                                              P2pRoles roles);
std::unique_ptr<WeightReceiver> make_p2p_receiver(Communicator& world, TransferPlan plan,
                                                  P2pRoles roles);
// Disk-delta (disk_delta.h) under `dir`: the sender publishes the plan's tensors (full or delta);
// the receiver advances its copy along the chain (or loads from the latest full version first).
std::unique_ptr<WeightSender> make_disk_delta_sender(const std::string& dir, TransferPlan plan,
                                                     DiskDeltaOptions options = {});
std::unique_ptr<WeightReceiver> make_disk_delta_receiver(const std::string& dir, TransferPlan plan);

// Verifies every checksum of a staged version (hashing the bytes again unless the set was
// `verified` as it arrived) and that it holds every tensor of the plan; then pauses nothing
// itself: call between Engine::begin_weight_update and end (apply_to_engine does).
Status verify_received_weights(const ReceivedWeights& set, const TransferPlan& plan);

// check_weights: compares the checksums an engine holds for its current version with the
// trainer's tensors (xxh3-128 of each). OK when every tensor of the plan matches; else an error
// naming the first differing tensors (at most 5) and how many differ.
Status check_weights(const std::map<std::string, std::string>& engine_checksums,
                     const TransferPlan& plan, const TensorSource& trainer);

// The engine side of an update: verify, build the model, then begin → update_weights →
// update_weight_version → end. On any error the engine keeps its current weights and version.
Status apply_to_engine(Engine& engine, const ModelConfig& config, const ReceivedWeights& set,
                       const TransferPlan& plan, ThreadPool* pool);
// The same for a runner already built over a version whose every piece was verified on arrival
// (a tensor-parallel engine whose ranks received their own shards).
Status apply_runner_to_engine(Engine& engine, std::unique_ptr<ModelRunner> runner, int64_t version);

}  // namespace miles
