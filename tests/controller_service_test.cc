// The controller's gRPC service without a run: a remote trainer rank's JoinTrainer (retried while
// the group is not formed, refused by name, authenticated by the run token) and an engine that
// registers before the engine pool exists.
#include "miles/controller/controller_service.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <string>

namespace miles::controller {
namespace {

constexpr const char* kToken = "controller-service-test-token";

// The service on a free loopback port, the run token in the environment (as `miles run` sets it).
struct Service {
  explicit Service(SeatFn seats) {
    ::setenv("MILES_RUN_TOKEN", kToken, 1);
    service = std::make_unique<ControllerService>(nullptr, std::move(seats));
    EXPECT_TRUE(service->start("127.0.0.1", 0).ok());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(service->port()); }
  std::unique_ptr<ControllerService> service;
};

TEST(ControllerService, RemoteRankWaitsForTheGroupThenTakesItsSeat) {
  std::atomic<int> calls{0};
  std::string seen_peer;
  Service s([&](const std::string& peer, int64_t pid, const std::string& hostname) {
    SeatReply r;
    if (++calls < 3) {
      r.message = "the controller is still starting its trainer group";
      return r;  // kNotYet: the worker asks again
    }
    seen_peer = peer;
    EXPECT_GT(pid, 0);
    EXPECT_FALSE(hostname.empty());
    r.kind = SeatReply::Kind::kSeat;
    r.seat = {
        .rank = 3, .world_size = 4, .store_address = "10.1.2.3:4242", .config_yaml = "model: {}\n"};
    return r;
  });
  auto j = join_trainer_group(s.address(), kToken, 30);
  ASSERT_TRUE(j.ok()) << j.message();
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(j->seat.rank, 3);
  EXPECT_EQ(j->seat.world_size, 4);
  EXPECT_EQ(j->seat.config_yaml, "model: {}\n");
  EXPECT_EQ(j->seat.store_address, "10.1.2.3:4242");
  EXPECT_EQ(j->peer_host, "127.0.0.1");
  EXPECT_EQ(seen_peer, "127.0.0.1");
}

TEST(ControllerService, RefusalAndWrongTokenAreErrorsAtOnce) {
  Service s([](const std::string&, int64_t, const std::string&) {
    SeatReply r;
    r.kind = SeatReply::Kind::kRefused;
    r.message = "this run has no remote trainer ranks (parallel.remote_ranks: 0)";
    return r;
  });
  auto refused = join_trainer_group(s.address(), kToken, 30);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("refused: this run has no remote trainer ranks"),
            std::string::npos)
      << refused.message();
  auto wrong = join_trainer_group(s.address(), "not-the-token", 30);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("run's token"), std::string::npos) << wrong.message();
  auto bad = join_trainer_group("no-port-here", kToken, 30);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("is not HOST:PORT"), std::string::npos) << bad.message();
}

// Engines may start first: until the pool is attached, RegisterEngine says to come back.
TEST(ControllerService, EngineRegisteringBeforeThePoolIsToldToRetry) {
  Service s([](const std::string&, int64_t, const std::string&) { return SeatReply{}; });
  EngineRegistration reg;
  reg.http_port = 1;
  reg.grpc_port = 2;
  reg.token = kToken;
  auto r = register_with_controller(s.address(), reg, 1.5);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("still loading its trainer"), std::string::npos) << r.message();
}

}  // namespace
}  // namespace miles::controller
