// The weight-sync endpoints of `miles serve` (serve_routes.h): disk-delta and checksums; the
// broadcast group's are in serve_group_routes.cc.
#include "miles/weight_sync/serve_routes.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "miles/rollout/engine.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/path_guard.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/serve_state.h"

namespace miles {

using nlohmann::json;

WeightSyncRoutes::~WeightSyncRoutes() {
  std::lock_guard<std::mutex> lock(group_mu);
  for (JoinThread& j : joins)
    if (j.thread.joinable()) j.thread.join();
}

Status WeightSyncRoutes::initial_checksums() {
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

int WeightSyncRoutes::apply(rollout::EngineDriver& driver, const ReceivedWeights& got,
                            std::string* error) {
  Status applied;
  driver.run_sync([&](Engine& e) { applied = apply_to_engine(e, config, got, plan, pool); });
  return record(applied, got.version, got.checksums, error);
}

int WeightSyncRoutes::apply_runner(rollout::EngineDriver& driver,
                                   std::unique_ptr<ModelRunner> runner, int64_t v,
                                   std::map<std::string, std::string> sums, std::string* error) {
  Status applied;
  driver.run_sync([&](Engine& e) { applied = apply_runner_to_engine(e, std::move(runner), v); });
  return record(applied, v, std::move(sums), error);
}

int WeightSyncRoutes::record(const Status& applied, int64_t v,
                             std::map<std::string, std::string> sums, std::string* error) {
  if (!applied.ok()) {
    *error = applied.message();
    return applied.message().find("pause it first") != std::string::npos ? 409 : 400;
  }
  checksums = std::move(sums);
  version = v;
  return 200;
}

void WeightSyncRoutes::drop_groups(const std::vector<std::shared_ptr<WeightGroupJoin>>& gs) {
  std::lock_guard<std::mutex> lock(group_mu);
  if (groups == gs) groups.clear();
}

Result<const TransferPlan*> WeightSyncRoutes::plan_for(const ParallelLayout& layout) {
  const std::string key = layout.to_string();
  auto it = plans.find(key);
  if (it != plans.end()) return &it->second;
  auto params = ParamLayout::for_model(config);
  MILES_ASSIGN_OR_RETURN(TransferPlan plan, make_transfer_plan(config, *params, layout));
  return &plans.emplace(key, std::move(plan)).first->second;
}

std::shared_ptr<WeightSyncRoutes> register_weight_sync_routes(
    httplib::Server& s, rollout::EngineDriver& driver, const ModelConfig& config,
    const std::string& model_path, ThreadPool* pool,
    std::shared_ptr<rollout::TpShardIntake> tp_intake, WeightSyncTrust trust) {
  auto st = std::make_shared<WeightSyncRoutes>();
  st->store_hosts = trust.store_hosts;
  const std::vector<std::string> weight_dirs = std::move(trust.weight_dirs);
  st->tp_intake = std::move(tp_intake);
  st->config = config;
  st->model_path = model_path;
  st->pool = pool;
  auto layout = ParamLayout::for_model(config);
  auto plan = make_transfer_plan(config, *layout, ParallelLayout{});
  if (plan.ok()) st->plan = std::move(*plan);
  st->plan_digest = transfer_plan_digest(st->plan);
  register_group_routes(s, st, driver);

  s.Post("/update_weights_from_disk_delta",
         [st, &driver, weight_dirs](const httplib::Request& req, httplib::Response& res) {
           const json body = json::parse(req.body, nullptr, false);
           if (body.is_discarded() || !body.is_object() || !body.contains("dir") ||
               !body["dir"].is_string() || !body.contains("weight_version") ||
               !body["weight_version"].is_number_integer())
             return reply_failure(res, 400,
                                  "update_weights_from_disk_delta needs {\"dir\": string, "
                                  "\"weight_version\": integer}");
           const std::string dir = body["dir"].get<std::string>();
           const int64_t v = body["weight_version"].get<int64_t>();
           if (Status c = confine_path(dir, weight_dirs, "--weights-dir"); !c.ok())
             return reply_failure(res, 403, c.message());
           std::lock_guard<std::mutex> lock(st->mu);
           auto& rx = st->receivers[dir];
           if (!rx) rx = make_disk_delta_receiver(dir, st->plan);
           auto got = rx->receive(v);
           if (!got.ok()) {
             st->receivers.erase(dir);  // start over from the latest full version next time
             return reply_failure(res, 400, got.message());
           }
           std::string error;
           if (int code = st->apply(driver, *got, &error); code != 200) {
             st->receivers.erase(dir);
             return reply_failure(res, code, error);
           }
           reply_json(res, 200, json{{"success", true}, {"weight_version", v}});
         });

  s.Get("/weight_checksums", [st](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(st->mu);
    if (Status e = st->initial_checksums(); !e.ok()) return reply_failure(res, 500, e.message());
    reply_json(res, 200, json{{"weight_version", st->version}, {"checksums", st->checksums}});
  });

  s.Post("/check_weights", [st](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("checksums") ||
        !body["checksums"].is_object())
      return reply_failure(res, 400, "check_weights needs {\"checksums\": {name: xxh3-128 hex}}");
    std::lock_guard<std::mutex> lock(st->mu);
    if (Status e = st->initial_checksums(); !e.ok()) return reply_failure(res, 500, e.message());
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
    reply_json(res, 200,
               json{{"success", bad.empty()}, {"weight_version", st->version}, {"message", msg}});
  });
  return st;
}

}  // namespace miles
