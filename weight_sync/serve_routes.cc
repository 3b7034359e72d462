// The weight-sync endpoints of `miles serve` (serve_routes.h).
#include "weight_sync/serve_routes.h"

#include <httplib.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "miles/engine.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/weight_sync.h"

namespace miles {

using nlohmann::json;

struct WeightSyncRoutes {
  ModelConfig config;
  std::string model_path;
  ThreadPool* pool = nullptr;
  TransferPlan plan;
  std::mutex mu;         // one update at a time; guards the fields below
  int64_t version = -1;  // of `checksums` (-1: not computed yet)
  std::map<std::string, std::string> checksums;
  std::map<std::string, std::unique_ptr<WeightReceiver>> receivers;  // by delta directory

  // Checksums of the weights loaded at start-up (float32, as the trainer holds them).
  Status initial_checksums() {
    if (version >= 0) return Status::Ok();
    MILES_ASSIGN_OR_RETURN(ModelFiles f, load_model_files(model_path));
    auto layout = ParamLayout::for_model(f.config, &f.weights);
    MILES_ASSIGN_OR_RETURN(FlatTensors t, FlatTensors::from_tensor_map(layout, f.weights));
    for (const ParamSpec& s : layout->specs()) {
      std::span<const float> v = std::as_const(t).get(s.name);
      checksums[s.name] = xxh3_128_hex(v.data(), v.size_bytes());
    }
    version = 0;
    return Status::Ok();
  }
};

namespace {

void reply(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}
void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, json{{"success", false}, {"message", message}});
}

}  // namespace

std::shared_ptr<WeightSyncRoutes> register_weight_sync_routes(httplib::Server& s,
                                                              rollout::EngineDriver& driver,
                                                              const ModelConfig& config,
                                                              const std::string& model_path,
                                                              ThreadPool* pool) {
  auto st = std::make_shared<WeightSyncRoutes>();
  st->config = config;
  st->model_path = model_path;
  st->pool = pool;
  auto layout = ParamLayout::for_model(config);
  auto plan = make_transfer_plan(config, *layout, ParallelLayout{});
  if (plan.ok()) st->plan = std::move(*plan);

  s.Post("/update_weights_from_disk_delta",
         [st, &driver](const httplib::Request& req, httplib::Response& res) {
           const json body = json::parse(req.body, nullptr, false);
           if (body.is_discarded() || !body.is_object() || !body.contains("dir") ||
               !body["dir"].is_string() || !body.contains("weight_version") ||
               !body["weight_version"].is_number_integer())
             return reply_error(res, 400,
                                "update_weights_from_disk_delta needs {\"dir\": string, "
                                "\"weight_version\": integer}");
           const std::string dir = body["dir"].get<std::string>();
           const int64_t v = body["weight_version"].get<int64_t>();
           std::lock_guard<std::mutex> lock(st->mu);
           auto& rx = st->receivers[dir];
           if (!rx) rx = make_disk_delta_receiver(dir, st->plan);
           auto got = rx->receive(v);
           if (!got.ok()) {
             st->receivers.erase(dir);  // start over from the latest full version next time
             return reply_error(res, 400, got.message());
           }
           Status applied;
           driver.run_sync([&](Engine& e) {
             applied = apply_to_engine(e, st->config, *got, st->plan, st->pool);
           });
           if (!applied.ok()) {
             st->receivers.erase(dir);
             const bool busy = applied.message().find("pause it first") != std::string::npos;
             return reply_error(res, busy ? 409 : 400, applied.message());
           }
           st->checksums = got->checksums;
           st->version = v;
           reply(res, 200, json{{"success", true}, {"weight_version", v}});
         });

  s.Get("/weight_checksums", [st](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(st->mu);
    if (Status e = st->initial_checksums(); !e.ok()) return reply_error(res, 500, e.message());
    reply(res, 200, json{{"weight_version", st->version}, {"checksums", st->checksums}});
  });

  s.Post("/check_weights", [st](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("checksums") ||
        !body["checksums"].is_object())
      return reply_error(res, 400, "check_weights needs {\"checksums\": {name: xxh3-128 hex}}");
    std::lock_guard<std::mutex> lock(st->mu);
    if (Status e = st->initial_checksums(); !e.ok()) return reply_error(res, 500, e.message());
    std::vector<std::string> bad;
    for (const auto& [name, sum] : st->checksums) {
      auto it = body["checksums"].find(name);
      if (it == body["checksums"].end() || !it->is_string() || it->get<std::string>() != sum)
        bad.push_back(name);
    }
    for (auto it = body["checksums"].begin(); it != body["checksums"].end(); ++it)
      if (!st->checksums.count(it.key())) bad.push_back(it.key());
    std::string msg = bad.empty() ? "all " + std::to_string(st->checksums.size()) + " tensors match"
                                  : std::to_string(bad.size()) + " tensors differ, e.g. " + bad[0];
    reply(res, 200,
          json{{"success", bad.empty()}, {"weight_version", st->version}, {"message", msg}});
  });
  return st;
}

}  // namespace miles
