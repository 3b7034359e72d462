// The weight-sync routes' request bodies (route_bodies.h): JSON in, a typed request or the usage.
#include "weight_sync/route_bodies.h"

#include <limits>

namespace miles {

using nlohmann::json;

namespace {

bool has(const json& body, const char* key, json::value_t type) {
  if (!body.contains(key)) return false;
  const json& v = body[key];
  if (type == json::value_t::number_float) return v.is_number();
  if (type == json::value_t::number_integer) return v.is_number_integer();
  return v.type() == type;
}

bool optional(const json& body, const char* key, json::value_t type) {
  return !body.contains(key) || has(body, key, type);
}

// An integer field within [lo, hi]; JSON's unsigned integers above int64's range included.
bool in_range(const json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned())
    return hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
           static_cast<int64_t>(v.get<uint64_t>()) >= lo;
  return v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

// A weight version: a non-negative integer.
bool is_version(const json& body) {
  return has(body, "weight_version", json::value_t::number_integer) &&
         in_range(body["weight_version"], 0, std::numeric_limits<int64_t>::max());
}

}  // namespace

Result<DiskDeltaUpdateRequest> parse_disk_delta_update(const json& j) {
  if (!j.is_object() || !has(j, "dir", json::value_t::string) || !is_version(j))
    return Status::Error(
        "update_weights_from_disk_delta needs {\"dir\": string, \"weight_version\": integer >= "
        "0}");
  return DiskDeltaUpdateRequest{j["dir"].get<std::string>(), j["weight_version"].get<int64_t>()};
}

Result<GroupJoinSpec> parse_join_weight_group(const json& body) {
  using T = json::value_t;
  const char* usage =
      "join_weight_group needs {\"store\": \"host:port\", \"prefix\": string, \"rank\": integer, "
      "\"world_size\": integer, optional \"timeout_s\": number, \"host\": string, "
      "\"plan_digest\": string, \"stage\": integer, \"stages\": integer, \"transport\": "
      "\"broadcast\" | \"p2p\", \"trainer_layout\": \"dp=A,pp=B,tp=C\", \"engine_tp\": integer, "
      "\"comm\": \"gloo\" | \"shm\"}";
  if (!body.is_object() || !has(body, "store", T::string) || !has(body, "prefix", T::string) ||
      !has(body, "rank", T::number_integer) || !has(body, "world_size", T::number_integer) ||
      !optional(body, "timeout_s", T::number_float) || !optional(body, "host", T::string) ||
      !optional(body, "plan_digest", T::string) || !optional(body, "stage", T::number_integer) ||
      !optional(body, "stages", T::number_integer) || !optional(body, "transport", T::string) ||
      !optional(body, "trainer_layout", T::string) ||
      !optional(body, "engine_tp", T::number_integer) || !optional(body, "comm", T::string))
    return Status::Error(usage);
  for (const char* key : {"rank", "world_size", "stage", "stages", "engine_tp"})
    if (body.contains(key) && !in_range(body[key], -(int64_t{1} << 30), int64_t{1} << 30))
      return Status::Error(std::string("join_weight_group: ") + key + " is out of range");
  GroupJoinSpec s;
  s.store = body["store"].get<std::string>();
  s.prefix = body["prefix"].get<std::string>();
  s.rank = body["rank"].get<int>();
  s.world_size = body["world_size"].get<int>();
  s.host = body.value("host", std::string("127.0.0.1"));
  s.timeout_s = body.value("timeout_s", 60.0);
  s.plan_digest = body.value("plan_digest", std::string());
  s.stage = body.value("stage", 0);
  s.stages = body.value("stages", 1);
  s.engine_tp = body.value("engine_tp", 1);
  s.comm = body.value("comm", std::string("gloo"));
  const std::string transport = body.value("transport", std::string("broadcast"));
  if (transport != "broadcast" && transport != "p2p")
    return Status::Error("join_weight_group: transport '" + transport +
                         "' (known: broadcast, p2p)");
  if (transport == "p2p") {
    s.trainer_layout = body.value("trainer_layout", std::string());
    if (s.trainer_layout.empty())
      return Status::Error("join_weight_group: transport p2p needs \"trainer_layout\"");
  }
  return s;
}

Result<int64_t> parse_group_update(const json& j) {
  if (!j.is_object() || !is_version(j))
    return Status::Error("update_weights_from_group needs {\"weight_version\": integer >= 0}");
  return j["weight_version"].get<int64_t>();
}

Result<std::map<std::string, std::string>> parse_check_weights(const json& j) {
  if (!j.is_object() || !has(j, "checksums", json::value_t::object))
    return Status::Error("check_weights needs {\"checksums\": {name: xxh3-128 hex}}");
  std::map<std::string, std::string> theirs;
  for (auto it = j["checksums"].begin(); it != j["checksums"].end(); ++it)
    theirs[it.key()] = it->is_string() ? it->get<std::string>() : std::string();
  return theirs;
}

}  // namespace miles
