// The engine's servers as an attacker on the same network meets them, over real sockets: bearer
// keys on every HTTP route and gRPC call (an admin key for the routes that change the engine), a
// 50 MB body refused before it is read, per-request and queue bounds (429 with Retry-After), a
// non-streamed client that goes away freeing its KV blocks, and HTTPS.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "miles/engine.h"
#include "miles/path_guard.h"
#include "miles/secret.h"
#include "miles/thread_pool.h"
#include "miles/v1/rollout.grpc.pb.h"
#include "rollout/grpc_server.h"
#include "rollout/http_server.h"
#include "test_paths.h"

namespace miles::rollout {
namespace {

using nlohmann::json;

struct Served {
  std::shared_ptr<const Model> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<EngineDriver> driver;
  std::unique_ptr<HttpServer> server;
  int64_t blocks = 64;

  explicit Served(ServerOptions so) {
    auto m = Model::load(test::data_dir() + "/models/qwen3_moe");
    EXPECT_TRUE(m.ok()) << m.message();
    model = std::shared_ptr<const Model>(std::move(m).value());
    pool = std::make_unique<ThreadPool>(1);
    driver = std::make_unique<EngineDriver>(std::make_unique<Engine>(
        make_model_runner(model, pool.get()),
        EngineOptions{.num_blocks = blocks, .block_tokens = 8, .enable_prefix_cache = false}));
    so.port = 0;
    server =
        std::make_unique<HttpServer>(*driver, model->config(), nullptr, nullptr, pool.get(), so);
    Status s = server->start();
    EXPECT_TRUE(s.ok()) << s.message();
  }
  httplib::Client client(const std::string& key = "") const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(60, 0);
    if (!key.empty()) c.set_bearer_token_auth(key.c_str());
    return c;
  }
  EngineStats stats() const {
    return driver->call<EngineStats>([](Engine& e) { return e.stats(); });
  }
};

const std::string kGen =
    R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "sampling_seed": 1}})";

int status_of(httplib::Client& c, const std::string& path, const std::string& body = "") {
  auto r = body.empty() ? c.Get(path.c_str()) : c.Post(path.c_str(), body, "application/json");
  return r ? r->status : -1;
}

TEST(ServerSecurity, EveryRouteTakesTheKeyAndAdminRoutesTheAdminKey) {
  ServerOptions so;
  so.keys = {"user-key", "admin-key"};
  Served s(so);
  auto none = s.client(), user = s.client("user-key"), admin = s.client("admin-key"),
       wrong = s.client("guess");
  EXPECT_EQ(status_of(none, "/health"), 200);  // liveness probes carry no secret
  for (const char* path :
       {"/health_generate", "/get_model_info", "/v1/models", "/metrics", "/no_such"}) {
    auto r = none.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error") << r->body;
  }
  EXPECT_EQ(status_of(none, "/generate", kGen), 401);
  EXPECT_EQ(status_of(wrong, "/generate", kGen), 401);
  EXPECT_EQ(status_of(user, "/generate", kGen), 200);
  EXPECT_EQ(status_of(admin, "/generate", kGen), 200);  // the admin key covers every route
  for (const char* path :
       {"/pause_generation", "/flush_cache", "/update_weight_version", "/update_weights_from_disk",
        "/abort_request", "/release_memory_occupation"}) {
    EXPECT_EQ(status_of(user, path, "{}"), 401) << path;
  }
  EXPECT_EQ(status_of(admin, "/pause_generation", R"({"mode": "in_place"})"), 200);
  EXPECT_EQ(status_of(admin, "/continue_generation", "{}"), 200);
  EXPECT_TRUE(is_admin_route("/join_weight_group"));
  EXPECT_FALSE(is_admin_route("/generate"));
}

TEST(ServerSecurity, WithOnlyAnApiKeyAdminRoutesTakeIt) {
  ServerOptions so;
  so.keys = {"only-key", ""};
  Served s(so);
  auto c = s.client("only-key");
  EXPECT_EQ(status_of(c, "/pause_generation", R"({"mode": "in_place"})"), 200);
  EXPECT_EQ(status_of(c, "/continue_generation", "{}"), 200);
  auto none = s.client();
  EXPECT_EQ(status_of(none, "/continue_generation", "{}"), 401);
}

TEST(ServerSecurity, GrpcCallsNeedTheKeyInTheirMetadata) {
  ServerOptions so;
  Served s(so);
  GrpcServer grpc(*s.driver, s.model->config(), nullptr, s.pool.get(), "m", ApiKeys{"k", "adm"});
  ASSERT_TRUE(grpc.start("127.0.0.1", 0).ok());
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc.port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = ::miles::v1::RolloutEngine::NewStub(channel);
  auto call = [&](const std::string& key, bool pause) {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    ::miles::v1::StatusResponse r;
    if (pause) {
      ::miles::v1::PauseRequest in;
      in.set_mode(::miles::v1::PauseRequest::IN_PLACE);
      return stub->PauseGeneration(&ctx, in, &r).error_code();
    }
    return stub->Health(&ctx, ::miles::v1::Empty(), &r).error_code();
  };
  EXPECT_EQ(call("", false), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("k", false), grpc::StatusCode::OK);
  EXPECT_EQ(call("k", true), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("adm", true), grpc::StatusCode::OK);
  grpc.stop();
}

TEST(ServerSecurity, AFiftyMegabyteBodyIsRefusedBeforeItIsRead) {
  ServerOptions so;  // default limit: 8 MiB
  Served s(so);
  auto c = s.client();
  const std::string body(50u << 20, ' ');
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Post("/generate", body, "application/json");
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The server answers 413 from the Content-Length; the client may still be writing and see the
  // connection closed instead. Either way it is quick, and the server keeps serving.
  if (r) {
    EXPECT_EQ(r->status, 413);
    EXPECT_NE(r->body.find("too large"), std::string::npos) << r->body;
  }
  EXPECT_LT(ms, 1000.0);
  EXPECT_EQ(status_of(c, "/generate", kGen), 200);
}

TEST(ServerSecurity, RequestAndQueueBounds) {
  ServerOptions so;
  so.max_request_tokens = 1000;
  so.max_waiting_samples = 2;
  Served s(so);
  auto c = s.client();
  auto r =
      c.Post("/generate",
             R"({"input_ids": [1, 2, 3], "sampling_params": {"n": 16, "max_new_tokens": 100}})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("max-request-tokens"), std::string::npos) << r->body;
  // Paused in place: requests wait; past two waiting samples the server answers 429.
  ASSERT_EQ(status_of(c, "/pause_generation", R"({"mode": "in_place"})"), 200);
  std::vector<std::thread> held;
  for (int i = 0; i < 2; ++i)
    held.emplace_back([&] {
      auto hc = s.client();
      hc.Post("/generate", kGen, "application/json");
    });
  for (int i = 0; i < 200 && s.stats().waiting < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto busy = c.Post("/generate", kGen, "application/json");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 429);
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  EXPECT_FALSE(json::parse(busy->body, nullptr, false).is_discarded());
  ASSERT_EQ(status_of(c, "/continue_generation", "{}"), 200);
  for (auto& t : held) t.join();
}

TEST(ServerSecurity, ANonStreamedClientThatLeavesFreesItsBlocks) {
  ServerOptions so;
  Served s(so);
  const int64_t idle = s.stats().free_blocks;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", s.server->port());
    c.set_read_timeout(0, 700000);  // gives up before the server's first one-second heartbeat
    c.Post("/generate",
           R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],
               "sampling_params": {"max_new_tokens": 200, "ignore_eos": true}})",
           "application/json");
  });
  // Hold the request mid-generation (paused in place keeps its blocks) until the client is gone.
  for (int i = 0; i < 500 && s.stats().running == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  s.driver->run_sync([](Engine& e) { e.pause(PauseMode::kInPlace); });
  EXPECT_LT(s.stats().free_blocks, idle);
  client.join();
  for (int i = 0; i < 100 && s.stats().free_blocks != idle; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(s.stats().free_blocks, idle);
  s.driver->run_sync([](Engine& e) { e.resume(); });
}

TEST(ServerSecurity, WeightPathsStayInsideTheTrustedDirectories) {
  namespace fs = std::filesystem;
  const std::string trusted = test::binary_dir() + "/server_security_trusted";
  fs::remove_all(trusted);
  fs::create_directories(trusted);
  fs::create_symlink("/etc", trusted + "/escape");
  ServerOptions so;
  so.weight_dirs = {trusted, test::data_dir() + "/models/qwen3_moe"};
  Served s(so);
  auto c = s.client();
  for (const std::string& path : {std::string("/etc/shadow"), trusted + "/escape/passwd",
                                  trusted + "/../../etc", test::data_dir() + "/models/llama"}) {
    auto r =
        c.Post("/update_weights_from_disk", json{{"model_path", path}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << path << " " << r->body;
    EXPECT_NE(r->body.find("--weights-dir"), std::string::npos) << r->body;
    EXPECT_EQ(r->body.find("root:"), std::string::npos) << r->body;
  }
  // Inside: loads, and the version always moves (here to the next number).
  auto ok = c.Post("/update_weights_from_disk",
                   json{{"model_path", test::data_dir() + "/models/qwen3_moe"}}.dump(),
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["weight_version"], "1");
  EXPECT_EQ(s.stats().weight_version, 1);
}

TEST(PathGuard, ResolvesBeforeComparing) {
  EXPECT_TRUE(confine_path("/a/b/c", {}, "--x").ok());  // nothing trusted named: no confinement
  EXPECT_TRUE(confine_path("/tmp/x/../x/y", {"/tmp/x"}, "--x").ok());
  EXPECT_FALSE(confine_path("/tmp/xy", {"/tmp/x"}, "--x").ok());  // a prefix, not a parent
  EXPECT_FALSE(confine_path("/tmp/x/../z", {"/tmp/x"}, "--x").ok());
  EXPECT_TRUE(confine_path("/tmp/x", {"/tmp/x/"}, "--x").ok());
}

TEST(ServerSecurity, Https) {
  const std::string dir = test::binary_dir() + "/server_security_tls";
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout " + dir +
      "/key.pem -out " + dir + "/cert.pem >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "no openssl command";
  ServerOptions so;
  so.ssl_certfile = dir + "/cert.pem";
  so.ssl_keyfile = dir + "/key.pem";
  Served s(so);
  httplib::SSLClient tls("127.0.0.1", s.server->port());
  tls.enable_server_certificate_verification(false);
  auto r = tls.Post("/generate", kGen, "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  httplib::Client plain("127.0.0.1", s.server->port());
  plain.set_read_timeout(2, 0);
  auto p = plain.Get("/health");
  EXPECT_TRUE(!p || p->status != 200);

  ServerOptions bad;
  bad.ssl_certfile = dir + "/missing.pem";
  bad.ssl_keyfile = dir + "/key.pem";
  ThreadPool pool(1);
  auto m = Model::load(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(m.ok());
  std::shared_ptr<const Model> model(std::move(m).value());
  EngineDriver d(std::make_unique<Engine>(make_model_runner(model, &pool), EngineOptions{}));
  HttpServer server(d, model->config(), nullptr, nullptr, &pool, bad);
  Status st = server.start();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("certificate"), std::string::npos) << st.message();
}

TEST(Secrets, FileEnvFlagAndComparison) {
  const std::string f = test::binary_dir() + "/secret_test_key";
  {
    std::ofstream out(f);
    out << "from-file\n";
  }
  ::setenv("MILES_TEST_SECRET", "from-env", 1);
  EXPECT_EQ(*read_secret("flag", f, "MILES_TEST_SECRET"), "from-file");
  EXPECT_EQ(*read_secret("flag", "", "MILES_TEST_SECRET"), "from-env");
  ::unsetenv("MILES_TEST_SECRET");
  EXPECT_EQ(*read_secret("flag", "", "MILES_TEST_SECRET"), "flag");
  EXPECT_FALSE(read_secret("", "/no/such/file", nullptr).ok());
  EXPECT_TRUE(secret_equal("abc", "abc"));
  EXPECT_FALSE(secret_equal("abc", "abd"));
  EXPECT_FALSE(secret_equal("abc", "abcd"));
  EXPECT_EQ(fresh_token().size(), 64u);
  EXPECT_NE(fresh_token(), fresh_token());
  EXPECT_EQ(bearer_token("Bearer xyz"), "xyz");
  EXPECT_EQ(bearer_token("Basic xyz"), "");
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  ApiKeys k{"u", "a"};
  EXPECT_TRUE(k.allows("u", false));
  EXPECT_FALSE(k.allows("u", true));
  EXPECT_TRUE(k.allows("a", true));
  EXPECT_FALSE(k.allows("", false));
  EXPECT_TRUE(ApiKeys{}.allows("", true));
}

}  // namespace
}  // namespace miles::rollout
