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
// follower's bounded wait tells a silent rank 0 from an idle one), stop. Every command is issued
// under one mutex, so runners on several threads (the engine loop, a weight update) interleave
// whole commands.
#pragma once

#include <memory>
#include <string>

#include "miles/comm.h"
#include "miles/engine.h"
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

// Ranks 1..n-1: serves rank 0's commands until it says stop (Ok) or the group breaks (an error
// naming the command).
Status run_tp_engine_follower(Communicator& comm, ThreadPool* pool);

}  // namespace miles::rollout
