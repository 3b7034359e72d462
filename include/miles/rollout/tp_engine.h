// Tensor parallelism inside one rollout engine: rank 0 runs the scheduler, the KV block tables,
// sampling and the servers; ranks 1..n-1 (followers) hold a shard of the weights (attention heads,
// MLP columns, vocabulary rows: tensor_parallel.h) and of every KV block, and run each forward in
// lockstep with rank 0 over the engine's own Gloo group.
//
// Why: a model or a batch whose KV does not fit one process's memory or cores is split the way
// SGLang and Megatron split it, and the engine still returns the numbers the trainer computes: when
// tensor_parallel::bitwise_split(config, n) holds, every logit (and so every token and logprob) is
// bit for bit the single-process engine's.
//
// Protocol (rank 0 → each follower, in order, over the group's send/recv; every command is one
// fixed-size message: a header and the payload's first bytes, tp_wire.h): init (model config, KV
// geometry), load (a weight generation: the follower's shard of every tensor; then a status
// all-gather), forward (generation, partial-block copies since the last forward, tokens, spans,
// each span's block table, options; then the model's own collectives and an all-gather of the
// vocabulary-parallel logits; a follower that cannot run it leaves the group), drop (a generation
// no runner uses any more), ping (rank 0 is alive: sent after 5 s without a command, so a
// follower's bounded wait tells a silent rank 0 from an idle one), stop; and the direct weight
// intake: join intake (start joining a weight group), intake (receive this rank's shard of a
// version on a thread of its own, while forwards go on), adopt (build it as a new generation, then
// a status and a checksum all-gather). Every command is issued
// under one mutex, so runners on several threads (the engine loop, a weight update) interleave
// whole commands.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "miles/comm.h"
#include "miles/rollout/engine.h"
#include "miles/status.h"

namespace miles::rollout {

class TpEngineGroup;

// Rank 0: takes over `comm` (rank 0 of n >= 2), sends every follower the model's full config and
// the KV geometry (same num_blocks and block_tokens as the engine's own pool), and returns the
// runner holding the first weights `weights` (full tensors, HF names). Errors: a config that does
// not split over n (naming the dimension), a follower that cannot build its shard.
Result<std::unique_ptr<ModelRunner>> make_tp_model_runner(std::unique_ptr<Communicator> comm,
                                                          const ModelConfig& full,
                                                          const TensorMap& weights,
                                                          const EngineOptions& kv_geometry,
                                                          ThreadPool* pool);

// One rank's shard of a weight version as an intake delivers it: tensors in this rank's shapes (HF
// names) and the xxh3-128 hex of each.
struct ShardWeights {
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> checksums;
  TensorMap view() const;  // views of `tensors` for Model::from_weights
};

// Where a follower's weights come from when every rank receives its own shard straight from the
// trainer (weight_sync's p2p transport provides it; the engine only relays the opaque requests).
class FollowerIntake {
 public:
  virtual ~FollowerIntake() = default;
  // Starts joining the weight group `request` names, as tensor-parallel rank `tp_rank` of the
  // engine whose full model is `full`; returns at once (a failed join shows in receive()).
  virtual void join(const std::vector<uint8_t>& request, int tp_rank, const ModelConfig& full) = 0;
  // This rank's shard of the version `request` names, every piece's checksum verified (blocking;
  // waits for the join first).
  virtual Result<ShardWeights> receive(const std::vector<uint8_t>& request, int tp_rank) = 0;
};

// Rank 0's handle on its followers for a direct weight intake (valid while the engine's group is).
class TpShardIntake {
 public:
  // The handle of the group `runner` (a tensor-parallel runner of make_tp_model_runner) drives.
  static Result<std::shared_ptr<TpShardIntake>> of(const ModelRunner& runner);
  int size() const;  // tensor-parallel ranks
  // Whether the followers share this process's host (the group is a shared-memory one): weight
  // groups may then reach them over shared memory too.
  bool followers_on_host() const;
  // Tells every follower to start joining the weight group `request` names (their intakes join).
  Status join_followers(const std::vector<uint8_t>& request);
  // A new weight generation received by every rank at once: the followers' intakes receive
  // `request` on their own threads while `receive_mine` runs here (rank 0's shard); then every
  // rank builds its shard. Returns the runner over it and every tensor's shard checksums (rank
  // order), or the first error of any rank (the engine keeps its runner; nothing is left behind).
  struct Received {
    std::unique_ptr<ModelRunner> runner;
    std::map<std::string, std::vector<std::string>> shard_checksums;
  };
  Result<Received> receive(const std::vector<uint8_t>& request,
                           const std::function<Result<ShardWeights>()>& receive_mine);

  explicit TpShardIntake(std::shared_ptr<TpEngineGroup> group, ModelConfig full, ModelConfig local,
                         ThreadPool* pool)
      : group_(std::move(group)), full_(std::move(full)), local_(std::move(local)), pool_(pool) {}

 private:
  std::shared_ptr<TpEngineGroup> group_;
  ModelConfig full_, local_;
  ThreadPool* pool_;
};

// Ranks 1..n-1: serves rank 0's commands until it says stop (Ok) or the group breaks (an error
// naming the command). `intake`: where direct weight versions come from (null: none; an intake
// command then fails that step, not the loop).
Status run_tp_engine_follower(Communicator& comm, ThreadPool* pool,
                              FollowerIntake* intake = nullptr);

}  // namespace miles::rollout
