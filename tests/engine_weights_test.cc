// The engine's weight lifecycle (EngineWeights) as a component, without HTTP or gRPC: join a Gloo
// group, receive a version the test sends, verify and adopt it, report and check checksums; every
// refusal typed (invalid, forbidden) and the engine keeps its version. Then the gRPC adapter
// (EngineWeights service beside RolloutEngine): the same steps over a real channel, refusals as
// gRPC codes, keys enforced.
#include "miles/weight_sync/engine_weights.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <limits>

#include "llama_weights_fixture.h"
#include "miles/comm.h"
#include "miles/rollout/engine.h"
#include "miles/rollout/grpc_server.h"
#include "miles/tcp_store.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"
#include "miles/v1/weights.grpc.pb.h"
#include "miles/weight_sync/grpc_weights.h"
#include "miles/weight_sync/weight_sync.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace pb = ::miles::v1;

// The test llama model on an engine with its lifecycle, a trainer on the same weights whose
// tensors are the source, and a rendezvous store.
struct Lifecycle : test::LlamaEngine {
  std::unique_ptr<Trainer> trainer;
  std::shared_ptr<const ParamLayout> layout;
  std::unique_ptr<TcpStoreServer> store;
  TensorSource source = [this](const std::string& n) { return trainer->params().get(n); };

  Status start() {
    MILES_RETURN_IF_ERROR(start_engine());
    TrainerConfig tc;
    tc.lr.lr = 1e-2;
    MILES_ASSIGN_OR_RETURN(trainer, Trainer::create(files->config, files->weights, tc, &pool));
    layout = ParamLayout::for_model(files->config, &files->weights);
    MILES_ASSIGN_OR_RETURN(store, TcpStoreServer::start({}));
    return Status::Ok();
  }
  void train_once() { test::train_once(*trainer); }
  std::map<std::string, std::string> trainer_sums() const {
    return test::trainer_checksums(*trainer, *layout);
  }
  GroupJoinSpec join(const std::string& prefix) const {
    GroupJoinSpec j;
    j.store = store->address();
    j.prefix = prefix;
    j.timeout_s = 20;
    return j;
  }
  // Rank 0 of the two-member group `prefix`: sends version v while `receive` runs.
  Status send(const std::string& prefix, int64_t v) const {
    CommOptions o;
    o.rank = 0;
    o.world_size = 2;
    o.store_address = store->address();
    o.prefix = prefix;
    o.timeout = std::chrono::seconds(20);
    MILES_ASSIGN_OR_RETURN(auto comm, connect_gloo(o));
    MILES_ASSIGN_OR_RETURN(TransferPlan plan,
                           make_transfer_plan(files->config, *layout, ParallelLayout{}));
    return make_broadcast_sender(*comm, plan)->send(v, source);
  }
};

TEST(EngineWeights, JoinReceiveVerifyAdoptAndCheckWithoutAServer) {
  Lifecycle l;
  ASSERT_TRUE(l.start().ok());
  auto v0 = l.weights->checksums();
  ASSERT_TRUE(v0.ok()) << v0.message();
  EXPECT_EQ(v0->version, 0);
  EXPECT_EQ(v0->checksums, l.trainer_sums());  // the served weights are the trainer's start

  GroupJoinSpec spec = l.join("g1");
  spec.plan_digest = l.weights->plan_digest();
  ASSERT_TRUE(l.weights->join_group(spec).ok());
  l.train_once();
  auto sent = std::async(std::launch::async, [&] { return l.send("g1", 1); });
  const WeightReply r = l.weights->update_from_group(1);
  ASSERT_TRUE(sent.get().ok());
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.version, 1);
  auto v1 = l.weights->checksums();
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(v1->version, 1);
  EXPECT_EQ(v1->checksums, l.trainer_sums());

  auto same = l.weights->check(l.trainer_sums());
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->match) << same->message;
  auto off = l.trainer_sums();
  off["model.norm.weight"] = std::string(32, '0');
  auto differs = l.weights->check(off);
  ASSERT_TRUE(differs.ok());
  EXPECT_FALSE(differs->match);
  EXPECT_NE(differs->message.find("model.norm.weight"), std::string::npos) << differs->message;

  // A whole checkpoint swapped in: the checksums follow (the start-up weights again).
  const WeightReply loaded = l.weights->load_checkpoint(l.model_dir);
  ASSERT_TRUE(loaded.ok()) << loaded.message;
  auto back = l.weights->checksums();
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->checksums, v0->checksums);
}

TEST(EngineWeights, RefusalsAreTypedAndTheEngineKeepsItsVersion) {
  Lifecycle l;
  l.trust.weight_dirs = {test::data_dir() + "/models"};
  ASSERT_TRUE(l.start().ok());
  auto fault_of = [](const WeightReply& r) { return r.fault; };

  GroupJoinSpec rank0 = l.join("g");
  rank0.rank = 0;
  EXPECT_EQ(fault_of(l.weights->join_group(rank0)), WeightFault::kInvalid);
  GroupJoinSpec far = l.join("g");
  far.store = "192.0.2.8:1234";
  const WeightReply forbidden = l.weights->join_group(far);
  EXPECT_EQ(forbidden.fault, WeightFault::kForbidden);
  EXPECT_NE(forbidden.message.find("192.0.2.8"), std::string::npos) << forbidden.message;
  GroupJoinSpec other = l.join("g");
  other.plan_digest = std::string(32, '0');
  const WeightReply plan = l.weights->join_group(other);
  EXPECT_EQ(plan.fault, WeightFault::kInvalid);
  EXPECT_NE(plan.message.find("transfer plan"), std::string::npos) << plan.message;
  GroupJoinSpec stage = l.join("g");
  stage.stage = 1;  // of 1
  EXPECT_EQ(fault_of(l.weights->join_group(stage)), WeightFault::kInvalid);
  GroupJoinSpec layout = l.join("g");
  layout.trainer_layout = "dp=two";
  EXPECT_EQ(fault_of(l.weights->join_group(layout)), WeightFault::kInvalid);

  const WeightReply no_group = l.weights->update_from_group(1);
  EXPECT_EQ(no_group.fault, WeightFault::kInvalid);
  EXPECT_NE(no_group.message.find("join_weight_group first"), std::string::npos);

  // A join that cannot form: the update fails, the groups are dropped.
  GroupJoinSpec nobody = l.join("g2");
  nobody.store = "127.0.0.1:1";
  nobody.timeout_s = 1;
  ASSERT_TRUE(l.weights->join_group(nobody).ok());
  const WeightReply failed = l.weights->update_from_group(1);
  EXPECT_EQ(failed.fault, WeightFault::kInvalid);
  EXPECT_NE(failed.message.find("g2"), std::string::npos) << failed.message;
  EXPECT_NE(l.weights->update_from_group(1).message.find("join_weight_group first"),
            std::string::npos);

  EXPECT_EQ(fault_of(l.weights->update_from_disk_delta("/tmp", 1)), WeightFault::kForbidden);
  EXPECT_EQ(fault_of(l.weights->load_checkpoint("/etc")), WeightFault::kForbidden);
  const WeightReply missing =
      l.weights->update_from_disk_delta(test::data_dir() + "/models/no_such_chain", 1);
  EXPECT_EQ(missing.fault, WeightFault::kInvalid);
  auto sums = l.weights->checksums();
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(sums->version, 0);
  EXPECT_EQ(sums->checksums, l.trainer_sums());
}

// The gRPC adapter: the engine's port serves EngineWeights beside RolloutEngine.
struct GrpcLifecycle : Lifecycle {
  std::unique_ptr<rollout::GrpcServer> server;
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<pb::EngineWeights::Stub> stub;

  Status serve(ApiKeys keys) {
    MILES_RETURN_IF_ERROR(start());
    server = std::make_unique<rollout::GrpcServer>(*driver, files->config, nullptr, &pool,
                                                   model_dir, keys);
    service = make_weights_service(weights, keys);
    server->add_service(service.get());
    MILES_RETURN_IF_ERROR(server->start("127.0.0.1", 0));
    stub = pb::EngineWeights::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server->port()), grpc::InsecureChannelCredentials()));
    return Status::Ok();
  }
  ~GrpcLifecycle() {
    if (server) server->stop();
  }
};

TEST(EngineWeights, OverGrpcTheSameStepsAndRefusalsAsCodes) {
  GrpcLifecycle g;
  ApiKeys keys;
  keys.admin = "admin-key";
  ASSERT_TRUE(g.serve(keys).ok());
  auto call = [](grpc::ClientContext& ctx) {
    ctx.AddMetadata("authorization", "Bearer admin-key");
  };

  {  // without the key: UNAUTHENTICATED
    grpc::ClientContext ctx;
    pb::WeightChecksums out;
    EXPECT_EQ(g.stub->GetWeightChecksums(&ctx, pb::WeightChecksumsRequest(), &out).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  pb::JoinWeightGroupRequest join;
  join.set_store(g.store->address());
  join.set_prefix("g1");
  join.set_rank(1);
  join.set_world_size(2);
  join.set_timeout_s(20);
  join.set_plan_digest(g.weights->plan_digest());
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::WeightVersion out;
    ASSERT_TRUE(g.stub->JoinWeightGroup(&ctx, join, &out).ok());
  }
  g.train_once();
  auto sent = std::async(std::launch::async, [&] { return g.send("g1", 1); });
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::UpdateWeightsFromGroupRequest in;
    in.set_weight_version(1);
    pb::WeightVersion out;
    const grpc::Status st = g.stub->UpdateWeightsFromGroup(&ctx, in, &out);
    ASSERT_TRUE(sent.get().ok());
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(out.weight_version(), 1);
  }
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::WeightChecksums out;
    ASSERT_TRUE(g.stub->GetWeightChecksums(&ctx, pb::WeightChecksumsRequest(), &out).ok());
    EXPECT_EQ(out.weight_version(), 1);
    const std::map<std::string, std::string> held(out.checksums().begin(), out.checksums().end());
    EXPECT_EQ(held, g.trainer_sums());
  }
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::CheckWeightsRequest in;
    for (const auto& [name, sum] : g.trainer_sums()) (*in.mutable_checksums())[name] = sum;
    pb::CheckWeightsResponse out;
    ASSERT_TRUE(g.stub->CheckWeights(&ctx, in, &out).ok());
    EXPECT_TRUE(out.match()) << out.message();
  }
  {  // refusals: another plan, a store far away, a version that is not there
    grpc::ClientContext ctx;
    call(ctx);
    pb::JoinWeightGroupRequest bad = join;
    bad.set_plan_digest(std::string(32, '0'));
    pb::WeightVersion out;
    EXPECT_EQ(g.stub->JoinWeightGroup(&ctx, bad, &out).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::JoinWeightGroupRequest bad = join;
    bad.set_store("192.0.2.8:1234");
    pb::WeightVersion out;
    EXPECT_EQ(g.stub->JoinWeightGroup(&ctx, bad, &out).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::UpdateWeightsFromDiskDeltaRequest in;
    in.set_dir(test::binary_dir() + "/engine_weights_no_chain");
    in.set_weight_version(2);
    pb::WeightVersion out;
    EXPECT_EQ(g.stub->UpdateWeightsFromDiskDelta(&ctx, in, &out).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {  // a negative version, on either update, is refused by name before anything is received
    grpc::ClientContext ctx;
    call(ctx);
    pb::UpdateWeightsFromDiskDeltaRequest in;
    in.set_dir(test::binary_dir() + "/engine_weights_no_chain");
    in.set_weight_version(-1);
    pb::WeightVersion out;
    const grpc::Status st = g.stub->UpdateWeightsFromDiskDelta(&ctx, in, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("weight_version -1 is negative"), std::string::npos)
        << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    call(ctx);
    pb::UpdateWeightsFromGroupRequest in;
    in.set_weight_version(std::numeric_limits<int64_t>::min());
    pb::WeightVersion out;
    const grpc::Status st = g.stub->UpdateWeightsFromGroup(&ctx, in, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("is negative"), std::string::npos) << st.error_message();
  }
}

}  // namespace
}  // namespace miles
