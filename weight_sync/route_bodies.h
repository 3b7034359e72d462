// The request bodies of the engine's weight-sync routes (serve_routes.h), as parsed JSON (discarded
// when the body was not JSON: parse_json_or_discarded) → the typed request each route acts on, or
// the route's usage as the error. Kept apart from the routes so that the fuzzers reach them without
// httplib or an engine.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "miles/status.h"
#include "miles/weight_sync/engine_weights.h"

namespace miles {

// POST /update_weights_from_disk_delta {"dir": DIR, "weight_version": N}
struct DiskDeltaUpdateRequest {
  std::string dir;
  int64_t weight_version = 0;
};
Result<DiskDeltaUpdateRequest> parse_disk_delta_update(const nlohmann::json& body);

// POST /join_weight_group {"store", "prefix", "rank", "world_size", optional "timeout_s", "host",
// "plan_digest", "stage", "stages", "transport", "trainer_layout", "engine_tp", "comm"}: the types
// and the transport; EngineWeights::join_group checks the values against each other.
Result<GroupJoinSpec> parse_join_weight_group(const nlohmann::json& body);

// POST /update_weights_from_group {"weight_version": N}: N.
Result<int64_t> parse_group_update(const nlohmann::json& body);

// POST /check_weights {"checksums": {name: xxh3-128 hex}}: the checksums by name (a value that is
// not a string is kept as "", which matches no tensor).
Result<std::map<std::string, std::string>> parse_check_weights(const nlohmann::json& body);

}  // namespace miles
