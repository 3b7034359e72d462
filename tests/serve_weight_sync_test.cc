// `miles serve`'s weight-sync endpoints over real sockets: a trainer publishes disk-delta versions;
// the server advances to each on POST /update_weights_from_disk_delta, reports the new version, and
// its checksums equal the trainer's (/weight_checksums, /check_weights); bad requests and broken
// chains get a 4xx with a message and the engine keeps its version. The broadcast group: the test
// is rank 0 of a Gloo group the server joins (POST /join_weight_group) and sends versions that the
// server receives on POST /update_weights_from_group; a join that cannot form fails the update and
// the engine keeps its version.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdint>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>

#include "llama_weights_fixture.h"
#include "miles/comm.h"
#include "miles/json_text.h"
#include "miles/rollout/engine.h"
#include "miles/rollout/http_server.h"
#include "miles/tcp_store.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"
#include "miles/weight_sync/engine_weights.h"
#include "miles/weight_sync/serve_routes.h"
#include "miles/weight_sync/weight_sync.h"
#include "test_paths.h"
#include "weight_sync/route_bodies.h"

namespace miles {
namespace {

using nlohmann::json;

json post(httplib::Client& c, const std::string& path, const json& body, int* status) {
  auto r = c.Post(path, body.dump(), "application/json");
  *status = r ? r->status : -1;
  return r ? json::parse(r->body, nullptr, false) : json();
}

// The test llama model served like `miles serve` does: an engine, its weight lifecycle, and its
// HTTP server with the weight-sync routes.
struct Served : test::LlamaEngine {
  std::unique_ptr<rollout::HttpServer> server;

  Status start() {
    MILES_RETURN_IF_ERROR(start_engine());
    rollout::ServerOptions so;
    so.port = 0;
    so.extra_routes = [this](httplib::Server& s, rollout::EngineDriver&) {
      register_weight_sync_routes(s, weights);
    };
    server =
        std::make_unique<rollout::HttpServer>(*driver, files->config, nullptr, nullptr, &pool, so);
    return server->start();
  }
  ~Served() {
    if (server) server->stop();
  }
};

using test::train_once;

json checksums_of(const Trainer& t, const ParamLayout& layout) {
  return json(test::trainer_checksums(t, layout));
}

TEST(ServeWeightSync, DiskDeltaVersionsReachTheServerAndItsChecksumsMatchTheTrainer) {
  Served served;
  ASSERT_TRUE(served.start().ok());
  auto& files = served.files;
  ThreadPool& pool = served.pool;
  rollout::HttpServer& server = *served.server;
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
  int status = 0;
  for (int64_t v = 1; v <= 2; ++v) {
    train_once(**tr);
    ASSERT_TRUE(sender->send(v, source).ok());
    json j =
        post(c, "/update_weights_from_disk_delta", {{"dir", dir}, {"weight_version", v}}, &status);
    ASSERT_EQ(status, 200) << j.dump();
    auto info = c.Get("/get_model_info");
    ASSERT_TRUE(info);
    EXPECT_EQ(json::parse(info->body)["weight_version"], std::to_string(v));
  }
  // The server's checksums are the trainer's.
  const json trainer_sums = checksums_of(**tr, *layout);
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
  EXPECT_EQ(json::parse(info->body)["weight_version"], "2");
}

// The server's version and checksums (GET /weight_checksums).
std::pair<int64_t, json> held(httplib::Client& c) {
  auto r = c.Get("/weight_checksums");
  if (!r || r->status != 200) return {-2, json()};
  json j = json::parse(r->body);
  return {j["weight_version"].get<int64_t>(), j["checksums"]};
}

// What every weight-group test starts from: a served engine, a client with a long read timeout, a
// trainer on the same weights (lr 1e-2) whose tensors are the source, and a rendezvous store.
struct GroupTest {
  Served served;
  std::unique_ptr<httplib::Client> client;
  std::unique_ptr<Trainer> trainer;
  std::shared_ptr<const ParamLayout> layout;
  std::unique_ptr<TcpStoreServer> store;
  TensorSource source = [this](const std::string& n) { return trainer->params().get(n); };

  Status start() {
    MILES_RETURN_IF_ERROR(served.start());
    client = std::make_unique<httplib::Client>("127.0.0.1", served.server->port());
    client->set_read_timeout(std::chrono::seconds(120));
    TrainerConfig tc;
    tc.lr.lr = 1e-2;
    MILES_ASSIGN_OR_RETURN(
        trainer, Trainer::create(served.files->config, served.files->weights, tc, &served.pool));
    layout = ParamLayout::for_model(served.files->config, &served.files->weights);
    MILES_ASSIGN_OR_RETURN(store, TcpStoreServer::start({}));
    return Status::Ok();
  }
  // The transfer plan of a sender with trainer layout `l`.
  Result<TransferPlan> plan(const ParallelLayout& l) const {
    return make_transfer_plan(served.files->config, *layout, l);
  }
  // Rank 0 (the sender) of the two-member group `prefix` whose rank 1 the engine joined.
  Result<std::unique_ptr<Communicator>> sender(const std::string& prefix) const {
    CommOptions o;
    o.rank = 0;
    o.world_size = 2;
    o.store_address = store->address();
    o.prefix = prefix;
    o.timeout = std::chrono::seconds(20);
    return connect_gloo(o);
  }
  // POST /update_weights_from_group for `version` on a thread of its own (the test sends
  // meanwhile): the status and the reply.
  std::future<std::pair<int, json>> update(int64_t version) {
    return std::async(std::launch::async, [this, version] {
      int st = 0;
      json r = post(*client, "/update_weights_from_group", {{"weight_version", version}}, &st);
      return std::make_pair(st, r);
    });
  }
  json trainer_sums() const { return checksums_of(*trainer, *layout); }
};

TEST(ServeWeightSync, BroadcastGroupBringsVersionsAndABadJoinKeepsTheVersion) {
  GroupTest g;
  ASSERT_TRUE(g.start().ok());
  httplib::Client& c = *g.client;
  auto plan = g.plan(ParallelLayout{});
  ASSERT_TRUE(plan.ok());
  const std::string digest = transfer_plan_digest(*plan);
  const json join = {{"store", g.store->address()},
                     {"prefix", "g1"},
                     {"rank", 1},
                     {"world_size", 2},
                     {"timeout_s", 20},
                     {"plan_digest", digest}};
  int status = 0;
  json j = post(c, "/join_weight_group", join, &status);
  ASSERT_EQ(status, 200) << j.dump();
  auto comm = g.sender("g1");
  ASSERT_TRUE(comm.ok()) << comm.message();
  auto sender = make_broadcast_sender(**comm, *plan);
  // Two versions over the same group: the test sends while the server receives.
  for (int64_t v = 1; v <= 2; ++v) {
    train_once(*g.trainer);
    auto update = g.update(v);
    ASSERT_TRUE(sender->send(v, g.source).ok());
    auto [st, r] = update.get();
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["weight_version"], v);
    auto [version, sums] = held(c);
    EXPECT_EQ(version, v);
    EXPECT_EQ(sums, g.trainer_sums()) << "version " << v;
  }

  // Malformed joins and another plan: 400 at once.
  json bad = join;
  bad["rank"] = 0;
  post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400);
  bad = join;
  bad.erase("store");
  post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400);
  bad = join;
  bad["plan_digest"] = std::string(32, '0');
  j = post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(j["message"].get<std::string>().find("transfer plan"), std::string::npos) << j.dump();

  // A join that cannot form (no store there): the update fails and the engine keeps version 2; the
  // group is dropped, so the next update is told to join first.
  bad = join;
  bad["store"] = "127.0.0.1:1";
  bad["prefix"] = "g2";
  bad["timeout_s"] = 1;
  post(c, "/join_weight_group", bad, &status);
  ASSERT_EQ(status, 200);
  j = post(c, "/update_weights_from_group", {{"weight_version", 3}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(j["message"].get<std::string>().find("g2"), std::string::npos) << j.dump();
  j = post(c, "/update_weights_from_group", {{"weight_version", 3}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(j["message"].get<std::string>().find("join_weight_group first"), std::string::npos)
      << j.dump();
  post(c, "/update_weights_from_group", {{"nope", 3}}, &status);
  EXPECT_EQ(status, 400);
  auto [version, sums] = held(c);
  EXPECT_EQ(version, 2);
  EXPECT_EQ(sums, g.trainer_sums());
}

// One group per pipeline stage: the engine joins stage 0's and stage 1's groups of a two-stage
// sender; two senders (each rank 0 of its group, as the stage leaders are) send their stages at
// once and the engine swaps in the whole version. A partial or inconsistent join is refused.
TEST(ServeWeightSync, JoinsReachOnlyStoresOnThisMachineOrTrustedHosts) {
  Served served;
  served.trust.store_hosts = {"192.0.2.7"};  // TEST-NET-1: trusted here, and nobody answers
  ASSERT_TRUE(served.start().ok());
  httplib::Client c("127.0.0.1", served.server->port());
  const json join = {{"prefix", "g"}, {"rank", 1}, {"world_size", 2}, {"timeout_s", 0.2}};
  int status = 0;
  for (const char* store : {"192.0.2.8:1234", "no-such-host.invalid:1234", "[2001:db8::1]:80"}) {
    json body = join;
    body["store"] = store;
    json r = post(c, "/join_weight_group", body, &status);
    EXPECT_EQ(status, 403) << store << " " << r.dump();
    EXPECT_NE(r.dump().find(store), std::string::npos) << r.dump();
  }
  for (const char* store : {"127.0.0.1:1", "192.0.2.7:1234"}) {  // accepted: the join starts
    json body = join;
    body["store"] = store;
    post(c, "/join_weight_group", body, &status);
    EXPECT_EQ(status, 200) << store;
  }
  // A timeout whose milliseconds overflow int64 (UB in the conversion) is refused by its bound.
  for (double t : {1e300, 86400.5, -1.0}) {
    json body = join;
    body["store"] = "127.0.0.1:1";
    body["timeout_s"] = t;
    json r = post(c, "/join_weight_group", body, &status);
    EXPECT_EQ(status, 400) << t;
    EXPECT_NE(r.dump().find("timeout_s must be in (0, 86400]"), std::string::npos) << r.dump();
  }
}

// A route body parser applied to the text of a body, as serve_routes.cc does.
template <typename Parse>
auto route(Parse parse, const std::string& text) {
  return parse(parse_json_or_discarded(text));
}

// The routes' bodies as route_bodies.h reads them: types, ranges and usages, with no server.
TEST(ServeWeightSync, RouteBodiesAreTypedAndBounded) {
  auto join = route(parse_join_weight_group,
                    R"({"store": "h:1", "prefix": "g", "rank": 2, "world_size": 3, "timeout_s": 1.5,
          "transport": "p2p", "trainer_layout": "dp=2,pp=1,tp=1", "comm": "shm"})");
  ASSERT_TRUE(join.ok()) << join.message();
  EXPECT_EQ(join->rank, 2);
  EXPECT_EQ(join->world_size, 3);
  EXPECT_EQ(join->timeout_s, 1.5);
  EXPECT_EQ(join->trainer_layout, "dp=2,pp=1,tp=1");
  EXPECT_EQ(join->comm, "shm");
  EXPECT_EQ(join->host, "127.0.0.1");
  // Integers past int64 (JSON's unsigned) used to wrap to small ones; now out of range.
  for (const char* body :
       {R"({"store": "h:1", "prefix": "g", "rank": 18446744073709551615, "world_size": 2})",
        R"({"store": "h:1", "prefix": "g", "rank": 1, "world_size": 2, "stage": -2000000000})"}) {
    auto r = route(parse_join_weight_group, body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.message().find("is out of range"), std::string::npos) << r.message();
  }
  EXPECT_NE(route(parse_join_weight_group, R"({"store": "h:1", "prefix": "g", "rank": 1,
                                       "world_size": 2, "transport": "p2p"})")
                .message()
                .find("needs \"trainer_layout\""),
            std::string::npos);
  EXPECT_NE(route(parse_join_weight_group, "[1]").message().find("join_weight_group needs"),
            std::string::npos);

  auto delta =
      route(parse_disk_delta_update, R"({"dir": "w", "weight_version": 9223372036854775807})");
  ASSERT_TRUE(delta.ok()) << delta.message();
  EXPECT_EQ(delta->dir, "w");
  EXPECT_EQ(delta->weight_version, INT64_MAX);
  for (const char* v : {"-1", "9223372036854775808", "18446744073709551615", "1.5", "\"3\""}) {
    const std::string body = std::string(R"({"dir": "w", "weight_version": )") + v + "}";
    EXPECT_FALSE(route(parse_disk_delta_update, body).ok()) << body;
    EXPECT_FALSE(route(parse_group_update, std::string(R"({"weight_version": )") + v + "}").ok())
        << v;
  }
  auto group = route(parse_group_update, R"({"weight_version": 0})");
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(*group, 0);

  auto sums = route(parse_check_weights, R"({"checksums": {"a": "00ff", "b": 7}})");
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(*sums, (std::map<std::string, std::string>{{"a", "00ff"}, {"b", ""}}));
  EXPECT_FALSE(route(parse_check_weights, R"({"checksums": ["a"]})").ok());
  EXPECT_FALSE(route(parse_check_weights, std::string(600, '[') + std::string(600, ']')).ok());
}

TEST(ServeWeightSync, OneBroadcastGroupPerPipelineStage) {
  GroupTest g;
  ASSERT_TRUE(g.start().ok());
  httplib::Client& c = *g.client;
  auto two = ParallelLayout::create(1, 2, 1);
  ASSERT_TRUE(two.ok());
  auto plan = g.plan(*two);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan_stages(*plan), 2);
  const std::string digest = transfer_plan_digest(*plan);
  json join = {{"store", g.store->address()},
               {"rank", 1},
               {"world_size", 2},
               {"timeout_s", 20},
               {"stages", 2},
               {"plan_digest", digest}};
  int status = 0;
  // Refused: a stage past the count, and a one-stage plan's digest for two stages.
  json bad = join;
  bad["prefix"] = "x";
  bad["stage"] = 2;
  json j = post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400) << j.dump();
  bad["stage"] = 0;
  auto one = g.plan(ParallelLayout{});
  ASSERT_TRUE(one.ok());
  bad["plan_digest"] = transfer_plan_digest(*one);
  j = post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400) << j.dump();
  // Only stage 1 joined: the update is refused, naming stage 0.
  join["prefix"] = "p-s1";
  join["stage"] = 1;
  j = post(c, "/join_weight_group", join, &status);
  ASSERT_EQ(status, 200) << j.dump();
  j = post(c, "/update_weights_from_group", {{"weight_version", 1}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(j["message"].get<std::string>().find("stage 0"), std::string::npos) << j.dump();
  // Both stages: each sender is rank 0 of its own group.
  for (int st = 0; st < 2; ++st) {
    join["prefix"] = "q-s" + std::to_string(st);
    join["stage"] = st;
    j = post(c, "/join_weight_group", join, &status);
    ASSERT_EQ(status, 200) << j.dump();
  }
  std::unique_ptr<Communicator> groups[2];
  for (int st = 0; st < 2; ++st) {
    auto comm = g.sender("q-s" + std::to_string(st));
    ASSERT_TRUE(comm.ok()) << comm.message();
    groups[st] = std::move(comm).value();
  }
  train_once(*g.trainer);
  auto update = g.update(1);
  auto stage1 = std::async(std::launch::async,
                           [&] { return send_stage_weights(*groups[1], *plan, 1, 1, g.source); });
  ASSERT_TRUE(send_stage_weights(*groups[0], *plan, 0, 1, g.source).ok());
  ASSERT_TRUE(stage1.get().ok());
  auto [st, r] = update.get();
  ASSERT_EQ(st, 200) << r.dump();
  auto [version, sums] = held(c);
  EXPECT_EQ(version, 1);
  EXPECT_EQ(sums, g.trainer_sums());
}

// p2p: the engine joins one group with the trainer's ranks (here one: dp=1,pp=1,tp=1) as rank 1;
// the trainer rank sends its shards (the whole tensors) and the engine swaps in the version. A rank
// inside the trainer's range and an unknown transport are refused.
TEST(ServeWeightSync, P2pGroupBringsAVersion) {
  GroupTest g;
  ASSERT_TRUE(g.start().ok());
  httplib::Client& c = *g.client;
  auto plan = g.plan(ParallelLayout{});
  ASSERT_TRUE(plan.ok());
  json join = {{"store", g.store->address()},
               {"prefix", "p"},
               {"rank", 1},
               {"world_size", 2},
               {"timeout_s", 20},
               {"transport", "p2p"},
               {"trainer_layout", "dp=1,pp=1,tp=1"},
               {"plan_digest", transfer_plan_digest(*plan)}};
  int status = 0;
  json bad = join;
  bad["trainer_layout"] = "dp=1,pp=1,tp=2";  // rank 1 is a trainer rank then
  json j = post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_NE(j["message"].get<std::string>().find("trainer rank"), std::string::npos) << j.dump();
  bad = join;
  bad["transport"] = "carrier-pigeon";
  j = post(c, "/join_weight_group", bad, &status);
  EXPECT_EQ(status, 400) << j.dump();
  j = post(c, "/join_weight_group", join, &status);
  ASSERT_EQ(status, 200) << j.dump();
  auto comm = g.sender("p");
  ASSERT_TRUE(comm.ok()) << comm.message();
  train_once(*g.trainer);
  auto update = g.update(1);
  ASSERT_TRUE(p2p_send_weights(**comm, *plan, 1, g.source, P2pRoles{ParallelLayout{}, 1}).ok());
  auto [st, r] = update.get();
  ASSERT_EQ(st, 200) << r.dump();
  auto [version, sums] = held(c);
  EXPECT_EQ(version, 1);
  EXPECT_EQ(sums, g.trainer_sums());
}

}  // namespace
}  // namespace miles
