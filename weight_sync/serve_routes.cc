// The HTTP adapter onto EngineWeights (serve_routes.h): a body parsed (route_bodies.h), the typed
// step, JSON out.
#include "miles/weight_sync/serve_routes.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "miles/json_text.h"
#include "miles/weight_sync/engine_weights.h"
#include "weight_sync/route_bodies.h"

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

void register_update_routes(httplib::Server& s, const std::shared_ptr<EngineWeights>& w) {
  s.Post("/update_weights_from_disk_delta",
         [w](const httplib::Request& req, httplib::Response& res) {
           auto update = parse_disk_delta_update(parse_json_or_discarded(req.body));
           if (!update.ok()) return reply_failure(res, 400, update.message());
           reply(res, w->update_from_disk_delta(update->dir, update->weight_version));
         });

  s.Post("/join_weight_group", [w](const httplib::Request& req, httplib::Response& res) {
    auto spec = parse_join_weight_group(parse_json_or_discarded(req.body));
    if (!spec.ok()) return reply_failure(res, 400, spec.message());
    const WeightReply r = w->join_group(*spec);
    if (!r.ok()) return reply(res, r);
    reply_json(res, 200,
               json{{"success", true},
                    {"prefix", spec->prefix},
                    {"stage", spec->trainer_layout.empty() ? spec->stage : 0}});
  });

  s.Post("/update_weights_from_group", [w](const httplib::Request& req, httplib::Response& res) {
    auto version = parse_group_update(parse_json_or_discarded(req.body));
    if (!version.ok()) return reply_failure(res, 400, version.message());
    reply(res, w->update_from_group(*version));
  });
}

void register_checksum_routes(httplib::Server& s, const std::shared_ptr<EngineWeights>& w) {
  s.Get("/weight_checksums", [w](const httplib::Request&, httplib::Response& res) {
    auto sums = w->checksums();
    if (!sums.ok()) return reply_failure(res, 500, sums.message());
    reply_json(res, 200, json{{"weight_version", sums->version}, {"checksums", sums->checksums}});
  });

  s.Post("/check_weights", [w](const httplib::Request& req, httplib::Response& res) {
    auto theirs = parse_check_weights(parse_json_or_discarded(req.body));
    if (!theirs.ok()) return reply_failure(res, 400, theirs.message());
    auto c = w->check(*theirs);
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
