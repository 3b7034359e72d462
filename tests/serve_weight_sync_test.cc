// `miles serve`'s weight-sync endpoints over real sockets: a trainer publishes disk-delta versions;
// the server advances to each on POST /update_weights_from_disk_delta, reports the new version, and
// its checksums equal the trainer's (/weight_checksums, /check_weights); bad requests and broken
// chains get a 4xx with a message and the engine keeps its version.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "miles/engine.h"
#include "miles/thread_pool.h"
#include "miles/trainer.h"
#include "miles/weight_sync.h"
#include "rollout/http_server.h"
#include "test_paths.h"
#include "weight_sync/serve_routes.h"

namespace miles {
namespace {

using nlohmann::json;

json post(httplib::Client& c, const std::string& path, const json& body, int* status) {
  auto r = c.Post(path, body.dump(), "application/json");
  *status = r ? r->status : -1;
  return r ? json::parse(r->body, nullptr, false) : json();
}

TEST(ServeWeightSync, DiskDeltaVersionsReachTheServerAndItsChecksumsMatchTheTrainer) {
  const std::string model_dir = test::data_dir() + "/models/llama";
  auto files = load_model_files(model_dir);
  ASSERT_TRUE(files.ok());
  ThreadPool pool(1);
  auto model = Model::from_weights(files->config, files->weights);
  ASSERT_TRUE(model.ok());
  rollout::EngineDriver driver(std::make_unique<Engine>(
      make_model_runner(std::shared_ptr<const Model>(std::move(*model)), &pool),
      EngineOptions{.num_blocks = 64, .block_tokens = 8}));
  std::shared_ptr<WeightSyncRoutes> routes;
  rollout::ServerOptions so;
  so.port = 0;
  so.http_threads = 4;
  so.extra_routes = [&](httplib::Server& s, rollout::EngineDriver& d) {
    routes = register_weight_sync_routes(s, d, files->config, model_dir, &pool);
  };
  rollout::HttpServer server(driver, files->config, nullptr, nullptr, &pool, so);
  ASSERT_TRUE(server.start().ok());
  httplib::Client c("127.0.0.1", server.port());

  // Version 0: the checksums of the loaded weights.
  auto r0 = c.Get("/weight_checksums");
  ASSERT_TRUE(r0 && r0->status == 200);
  EXPECT_EQ(json::parse(r0->body)["weight_version"], 0);

  const std::string dir = test::binary_dir() + "/serve_weight_sync";
  std::filesystem::remove_all(dir);
  TrainerConfig tc;
  tc.lr.lr = 1e-2;
  auto tr = Trainer::create(files->config, files->weights, tc, &pool);
  ASSERT_TRUE(tr.ok());
  auto layout = ParamLayout::for_model(files->config, &files->weights);
  auto plan = make_transfer_plan(files->config, *layout, ParallelLayout{});
  ASSERT_TRUE(plan.ok());
  auto sender = make_disk_delta_sender(dir, *plan);
  const TensorSource source = [&](const std::string& n) { return (*tr)->params().get(n); };
  TrainSample x;
  x.tokens = {1, 17, 300, 42, 7, 99};
  x.response_length = 5;
  x.loss_mask.assign(5, 1.0f);
  std::vector<TrainSample> batch{x};
  int status = 0;
  for (int64_t v = 1; v <= 2; ++v) {
    ASSERT_TRUE((*tr)->step(batch, sft_objective(batch, 5)).ok());
    ASSERT_TRUE(sender->send(v, source).ok());
    json j =
        post(c, "/update_weights_from_disk_delta", {{"dir", dir}, {"weight_version", v}}, &status);
    ASSERT_EQ(status, 200) << j.dump();
    auto info = c.Get("/get_model_info");
    ASSERT_TRUE(info);
    EXPECT_EQ(json::parse(info->body)["weight_version"], v);
  }
  // The server's checksums are the trainer's.
  json trainer_sums;
  for (const ParamSpec& s : layout->specs()) {
    std::span<const float> t = (*tr)->params().get(s.name);
    trainer_sums[s.name] = xxh3_128_hex(t.data(), t.size_bytes());
  }
  auto r2 = c.Get("/weight_checksums");
  ASSERT_TRUE(r2 && r2->status == 200);
  EXPECT_EQ(json::parse(r2->body)["checksums"], trainer_sums);
  json ok = post(c, "/check_weights", {{"checksums", trainer_sums}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(ok["success"], true) << ok.dump();
  json off = trainer_sums;
  off["model.norm.weight"] = std::string(32, '0');
  json bad = post(c, "/check_weights", {{"checksums", off}}, &status);
  EXPECT_EQ(bad["success"], false);
  EXPECT_NE(bad["message"].get<std::string>().find("model.norm.weight"), std::string::npos);

  // A version that is not there, and malformed requests: 400, the engine stays at version 2.
  json missing =
      post(c, "/update_weights_from_disk_delta", {{"dir", dir}, {"weight_version", 7}}, &status);
  EXPECT_EQ(status, 400) << missing.dump();
  post(c, "/update_weights_from_disk_delta", {{"dir", dir}}, &status);
  EXPECT_EQ(status, 400);
  post(c, "/check_weights", {{"nope", 1}}, &status);
  EXPECT_EQ(status, 400);
  auto info = c.Get("/get_model_info");
  EXPECT_EQ(json::parse(info->body)["weight_version"], 2);
  server.stop();
}

}  // namespace
}  // namespace miles
