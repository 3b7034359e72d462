// The gRPC RolloutEngine service over a real loopback socket: Generate streams the same tokens and
// logprobs as HTTP /generate computes, bad input is INVALID_ARGUMENT, cancellation frees blocks, and the
// lifecycle RPCs work.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"
#include "miles/v1/rollout.grpc.pb.h"
#include "miles/rollout/grpc_server.h"
#include "test_paths.h"

namespace miles::rollout {
namespace {

namespace pb = ::miles::v1;

struct GrpcServed {
  std::shared_ptr<const Model> model;
  ThreadPool pool{2};
  std::unique_ptr<EngineDriver> driver;
  std::unique_ptr<GrpcServer> server;
  std::unique_ptr<pb::RolloutEngine::Stub> stub;
  explicit GrpcServed(EngineOptions eo) {
    auto m = Model::load(test::data_dir() + "/models/qwen3_moe");
    EXPECT_TRUE(m.ok());
    model = std::shared_ptr<const Model>(std::move(m).value());
    driver = std::make_unique<EngineDriver>(std::make_unique<Engine>(make_model_runner(model, &pool), eo));
    server = std::make_unique<GrpcServer>(*driver, model->config(), nullptr, &pool, "qwen3_moe");
    EXPECT_TRUE(server->start("127.0.0.1", 0).ok());
    stub = pb::RolloutEngine::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server->port()), grpc::InsecureChannelCredentials()));
  }
};

pb::GenerateRequest request(std::vector<int> ids, int max_new, uint64_t seed, int n = 1) {
  pb::GenerateRequest r;
  for (int id : ids) r.add_input_ids(id);
  r.mutable_sampling_params()->set_temperature(0.8f);
  r.mutable_sampling_params()->set_max_new_tokens(max_new);
  r.mutable_sampling_params()->set_seed(seed);
  r.mutable_sampling_params()->set_n(n);
  r.set_return_routed_experts(true);
  return r;
}

TEST(GrpcServer, GenerateMatchesTheEngineBitForBit) {
  GrpcServed s(EngineOptions{.num_blocks = 128, .block_tokens = 8});
  grpc::ClientContext ctx;
  auto reader = s.stub->Generate(&ctx, request({5, 9, 33, 100, 7, 8, 1000}, 10, 4));
  pb::GenerateResponse msg;
  std::vector<pb::Token> tokens;
  pb::GenerateResponse last;
  while (reader->Read(&msg)) {
    for (const auto& t : msg.new_tokens()) tokens.push_back(t);
    last = msg;
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(last.finished());
  EXPECT_EQ(last.finish_reason(), "length");
  ASSERT_EQ(tokens.size(), 10u);
  EXPECT_EQ(last.routed_experts_shape(0), 16);

  Engine e(make_model_runner(s.model, nullptr), EngineOptions{.num_blocks = 64, .block_tokens = 8});
  GenerateRequest g;
  g.input_ids = {5, 9, 33, 100, 7, 8, 1000};
  g.sampling.temperature = 0.8f;
  g.sampling.seed = 4;
  g.max_new_tokens = 10;
  SampleEvent fin;
  ASSERT_TRUE(e.submit(g, [&](const SampleEvent& ev) { if (ev.finished) fin = ev; }).ok());
  while (!e.idle()) e.step();
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(tokens[i].id(), fin.output[i].id);
    const float lp = tokens[i].raw_logprob();
    EXPECT_EQ(std::memcmp(&lp, &fin.output[i].raw_logprob, 4), 0);
  }
  EXPECT_TRUE(std::equal(fin.routed_experts.begin(), fin.routed_experts.end(),
                         last.routed_experts().begin()));
}

TEST(GrpcServer, BadInputIsInvalidArgumentAndCancelFreesBlocks) {
  GrpcServed s(EngineOptions{.num_blocks = 64, .block_tokens = 8, .enable_prefix_cache = false});
  {
    grpc::ClientContext ctx;
    auto reader = s.stub->Generate(&ctx, request({1, 99999}, 4, 1));
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {}
    auto st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("vocabulary"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    auto reader = s.stub->Generate(&ctx, request({1, 2, 3, 4, 5, 6, 7, 8, 9}, 200, 1));
    pb::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    ctx.TryCancel();
    while (reader->Read(&msg)) {}
    reader->Finish();
  }
  pb::EngineStats st;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext c;
    ASSERT_TRUE(s.stub->GetStats(&c, pb::Empty(), &st).ok());
    if (st.free_blocks() == 64) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(st.free_blocks(), 64);
}

TEST(GrpcServer, LifecycleRpcs) {
  GrpcServed s(EngineOptions{.num_blocks = 64, .block_tokens = 8});
  pb::StatusResponse r;
  {
    grpc::ClientContext c;
    pb::PauseRequest p;
    p.set_mode(pb::PauseRequest::RETRACT);
    ASSERT_TRUE(s.stub->PauseGeneration(&c, p, &r).ok());
  }
  {
    grpc::ClientContext c;
    ASSERT_TRUE(s.stub->FlushCache(&c, pb::Empty(), &r).ok());
  }
  {
    grpc::ClientContext c;
    ASSERT_TRUE(s.stub->BeginWeightUpdate(&c, pb::Empty(), &r).ok());
  }
  {
    grpc::ClientContext c;
    pb::UpdateWeightsFromDiskRequest u;
    u.set_model_path("/no/such/model");
    auto st = s.stub->UpdateWeightsFromDisk(&c, u, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    pb::UpdateWeightsFromDiskRequest u;
    u.set_model_path(test::data_dir() + "/models/qwen3_moe");
    u.set_set_weight_version(true);
    u.set_weight_version(3);
    ASSERT_TRUE(s.stub->UpdateWeightsFromDisk(&c, u, &r).ok());
  }
  {
    grpc::ClientContext c;
    ASSERT_TRUE(s.stub->EndWeightUpdate(&c, pb::Empty(), &r).ok());
  }
  {
    grpc::ClientContext c;
    EXPECT_EQ(s.stub->EndWeightUpdate(&c, pb::Empty(), &r).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext c;
    ASSERT_TRUE(s.stub->ContinueGeneration(&c, pb::Empty(), &r).ok());
  }
  grpc::ClientContext ctx;
  auto reader = s.stub->Generate(&ctx, request({1, 2, 3}, 3, 1));
  pb::GenerateResponse msg;
  while (reader->Read(&msg))
    for (const auto& t : msg.new_tokens()) EXPECT_EQ(t.weight_version(), 3);
  ASSERT_TRUE(reader->Finish().ok());
  grpc::ClientContext c;
  pb::ModelInfo info;
  ASSERT_TRUE(s.stub->GetModelInfo(&c, pb::Empty(), &info).ok());
  EXPECT_EQ(info.architecture(), "Qwen3MoeForCausalLM");
  EXPECT_EQ(info.weight_version(), 3);
}

}  // namespace
}  // namespace miles::rollout
