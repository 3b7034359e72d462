// The HTTP adapter onto EngineWeights (serve_routes.h): JSON in, the typed step, JSON out.
#include "miles/weight_sync/serve_routes.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "miles/json_text.h"
#include "miles/weight_sync/engine_weights.h"

namespace miles {

using nlohmann::json;

namespace {

void reply_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

void reply_failure(httplib::Response& res, int status, const std::string& message) {
  reply_json(res, status, json{{"success", false}, {"message", message}});
}

int http_status(WeightFault f) {
  switch (f) {
    case WeightFault::kNone:
      return 200;
    case WeightFault::kInvalid:
      return 400;
    case WeightFault::kForbidden:
      return 403;
    case WeightFault::kConflict:
      return 409;
    case WeightFault::kInternal:
      return 500;
  }
  return 500;
}

// A step's reply: {"success": true, "weight_version": v} or the failure.
void reply(httplib::Response& res, const WeightReply& r) {
  if (!r.ok()) return reply_failure(res, http_status(r.fault), r.message);
  reply_json(res, 200, json{{"success", true}, {"weight_version", r.version}});
}

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

// A join's spec from its request body, or why it is not one.
Result<GroupJoinSpec> join_spec(const json& body) {
  using T = json::value_t;
  const char* usage =
      "join_weight_group needs {\"store\": \"host:port\", \"prefix\": string, \"rank\": integer, "
      "\"world_size\": integer, optional \"timeout_s\": number, \"host\": string, "
      "\"plan_digest\": string, \"stage\": integer, \"stages\": integer, \"transport\": "
      "\"broadcast\" | \"p2p\", \"trainer_layout\": \"dp=A,pp=B,tp=C\", \"engine_tp\": integer, "
      "\"comm\": \"gloo\" | \"shm\"}";
  if (body.is_discarded() || !body.is_object() || !has(body, "store", T::string) ||
      !has(body, "prefix", T::string) || !has(body, "rank", T::number_integer) ||
      !has(body, "world_size", T::number_integer) ||
      !optional(body, "timeout_s", T::number_float) || !optional(body, "host", T::string) ||
      !optional(body, "plan_digest", T::string) || !optional(body, "stage", T::number_integer) ||
      !optional(body, "stages", T::number_integer) || !optional(body, "transport", T::string) ||
      !optional(body, "trainer_layout", T::string) ||
      !optional(body, "engine_tp", T::number_integer) || !optional(body, "comm", T::string))
    return Status::Error(usage);
  for (const char* key : {"rank", "world_size", "stage", "stages", "engine_tp"})
    if (body.contains(key) && (body[key].get<int64_t>() < -(int64_t{1} << 30) ||
                               body[key].get<int64_t>() > (int64_t{1} << 30)))
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

void register_update_routes(httplib::Server& s, const std::shared_ptr<EngineWeights>& w) {
  s.Post(
      "/update_weights_from_disk_delta", [w](const httplib::Request& req, httplib::Response& res) {
        const json body = parse_json_or_discarded(req.body);
        if (body.is_discarded() || !body.is_object() || !has(body, "dir", json::value_t::string) ||
            !has(body, "weight_version", json::value_t::number_integer))
          return reply_failure(res, 400,
                               "update_weights_from_disk_delta needs {\"dir\": string, "
                               "\"weight_version\": integer}");
        reply(res, w->update_from_disk_delta(body["dir"].get<std::string>(),
                                             body["weight_version"].get<int64_t>()));
      });

  s.Post("/join_weight_group", [w](const httplib::Request& req, httplib::Response& res) {
    auto spec = join_spec(parse_json_or_discarded(req.body));
    if (!spec.ok()) return reply_failure(res, 400, spec.message());
    const WeightReply r = w->join_group(*spec);
    if (!r.ok()) return reply(res, r);
    reply_json(res, 200,
               json{{"success", true},
                    {"prefix", spec->prefix},
                    {"stage", spec->trainer_layout.empty() ? spec->stage : 0}});
  });

  s.Post("/update_weights_from_group", [w](const httplib::Request& req, httplib::Response& res) {
    const json body = parse_json_or_discarded(req.body);
    if (body.is_discarded() || !body.is_object() ||
        !has(body, "weight_version", json::value_t::number_integer))
      return reply_failure(res, 400,
                           "update_weights_from_group needs {\"weight_version\": integer}");
    reply(res, w->update_from_group(body["weight_version"].get<int64_t>()));
  });
}

void register_checksum_routes(httplib::Server& s, const std::shared_ptr<EngineWeights>& w) {
  s.Get("/weight_checksums", [w](const httplib::Request&, httplib::Response& res) {
    auto sums = w->checksums();
    if (!sums.ok()) return reply_failure(res, 500, sums.message());
    reply_json(res, 200, json{{"weight_version", sums->version}, {"checksums", sums->checksums}});
  });

  s.Post("/check_weights", [w](const httplib::Request& req, httplib::Response& res) {
    const json body = parse_json_or_discarded(req.body);
    if (body.is_discarded() || !body.is_object() || !has(body, "checksums", json::value_t::object))
      return reply_failure(res, 400, "check_weights needs {\"checksums\": {name: xxh3-128 hex}}");
    std::map<std::string, std::string> theirs;
    for (auto it = body["checksums"].begin(); it != body["checksums"].end(); ++it)
      theirs[it.key()] = it->is_string() ? it->get<std::string>() : std::string();  // "": differs
    auto c = w->check(theirs);
    if (!c.ok()) return reply_failure(res, 500, c.message());
    reply_json(
        res, 200,
        json{{"success", c->match}, {"weight_version", c->version}, {"message", c->message}});
  });
}

}  // namespace

void register_weight_sync_routes(httplib::Server& s, std::shared_ptr<EngineWeights> weights) {
  register_update_routes(s, weights);
  register_checksum_routes(s, weights);
}

}  // namespace miles
