// EngineClient: the controller's connection to one rollout engine (`miles serve`), all over gRPC:
// generation and control (rollout.proto, one streaming call per group) and the weight lifecycle
// (weights.proto, EngineWeights in include/miles/weight_sync/engine_weights.h).
//
// Why: the RL loop sees an engine as "give me n samples of this prompt" plus the weight lifecycle;
// the wire formats stay here. Every call has a deadline, so a dead engine turns into an error,
// never a hang; generate() calls in flight can be cancelled from another thread (the engine pool
// does it when a health check fails) and then return an error the caller re-dispatches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "miles/host_port.h"
#include "miles/rollout/engine.h"
#include "miles/status.h"
#include "miles/weight_sync/engine_weights.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace miles::controller {

struct EngineAddress {
  std::string host = "127.0.0.1";
  int http_port = 0;
  int grpc_port = 0;
  std::string http() const { return host_port(host, http_port); }
};

// One prompt, n samples (a GRPO group).
struct GroupRequest {
  std::vector<int32_t> input_ids;
  int32_t n = 1;
  int64_t max_new_tokens = 64;
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;  // sample i draws with seed + i · golden ratio (engine.cc)
  std::vector<std::string> stop;
  bool return_routed_experts = false;
};

// An engine's speculative-decoding counters since it started (EngineStats' spec_*).
struct SpecCounters {
  uint64_t verifies = 0, draft_tokens = 0, accepted_tokens = 0, emitted_tokens = 0;
};

struct GeneratedSample {
  int32_t index = 0;                // within the group
  std::vector<TokenOutput> tokens;  // id, logprobs, weight version of each output token
  std::string finish_reason;        // stop | length | abort
  int64_t prompt_tokens = 0;
  std::vector<int32_t> routed_experts;  // (prompt + output − 1, moe layers, top_k) for MoE models
};

class EngineClient {
 public:
  explicit EngineClient(EngineAddress address);
  ~EngineClient();
  const EngineAddress& address() const { return address_; }

  // Blocks until every sample of the group finished (an engine paused with kAbort finishes them as
  // "abort"). Errors: the engine is unreachable or died, the call was cancelled (cancel_all), or
  // the group is incomplete.
  Result<std::vector<GeneratedSample>> generate(const GroupRequest& request);
  // Cancels every generate() in flight on this client (their requests are aborted engine-side).
  void cancel_all();
  int64_t in_flight() const;

  Status health(double timeout_s) const;  // gRPC Health
  // The engine's speculative-decoding counters (gRPC GetStats).
  Result<SpecCounters> spec_counters() const;
  Status pause(PauseMode mode) const;
  Status resume() const;
  // UpdateWeightsFromDiskDelta: the engine advances to `version` of the chain in `dir`.
  Status update_weights_from_disk_delta(const std::string& dir, int64_t version) const;
  // JoinWeightGroup: the engine starts joining the group; it replies before the group forms.
  Status join_weight_group(const GroupJoinSpec& join) const;
  // UpdateWeightsFromGroup: the engine receives `version` over its group (the caller sends it
  // meanwhile) and swaps it in; returns when it did, or failed.
  Status update_weights_from_group(int64_t version, double timeout_s) const;
  // GetWeightChecksums: the engine's version and the xxh3-128 of each of its tensors.
  Result<WeightChecksums> weight_checksums() const;

 private:
  EngineAddress address_;
  std::shared_ptr<grpc::Channel> channel_;
  mutable std::mutex mu_;
  std::set<grpc::ClientContext*> calls_;  // generate() calls in flight
};

}  // namespace miles::controller
