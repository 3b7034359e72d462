// EngineClient (engine_client.h): generation, control and the weight lifecycle over gRPC.
#include "controller/engine_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "miles/host_port.h"
#include "miles/secret.h"
#include "miles/v1/rollout.grpc.pb.h"
#include "miles/v1/weights.grpc.pb.h"

namespace miles::controller {

namespace pb = ::miles::v1;

namespace {

void set_deadline(grpc::ClientContext& ctx, double seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

Status from_grpc(const grpc::Status& s, const std::string& what) {
  if (!s.ok()) return Status::Error(what + ": " + s.error_message());
  return Status::Ok();
}

Status from_grpc(const grpc::Status& s, const pb::StatusResponse& r, const std::string& what) {
  MILES_RETURN_IF_ERROR(from_grpc(s, what));
  if (!r.success()) return Status::Error(what + ": " + r.message());
  return Status::Ok();
}

// The run token (secret.h) on every call to an engine.
void authorize(grpc::ClientContext& ctx) {
  if (const std::string t = run_token(); !t.empty())
    ctx.AddMetadata("authorization", "Bearer " + t);
}

}  // namespace

EngineClient::EngineClient(EngineAddress address) : address_(std::move(address)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  channel_ = grpc::CreateCustomChannel(host_port(address_.host, address_.grpc_port),
                                       grpc::InsecureChannelCredentials(), args);
}

EngineClient::~EngineClient() { cancel_all(); }

Result<std::vector<GeneratedSample>> EngineClient::generate(const GroupRequest& request) {
  pb::GenerateRequest in;
  in.mutable_input_ids()->Add(request.input_ids.begin(), request.input_ids.end());
  pb::SamplingParams* sp = in.mutable_sampling_params();
  sp->set_temperature(static_cast<float>(request.temperature));
  sp->set_top_p(static_cast<float>(request.top_p));
  sp->set_top_k(static_cast<int32_t>(request.top_k));
  sp->set_seed(request.seed);
  sp->set_max_new_tokens(request.max_new_tokens);
  sp->set_n(request.n);
  for (const std::string& s : request.stop) sp->add_stop(s);
  in.set_return_routed_experts(request.return_routed_experts);

  grpc::ClientContext ctx;

  authorize(ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.insert(&ctx);
  }
  std::vector<GeneratedSample> samples(request.n);
  int32_t finished = 0;
  std::string error;
  {
    auto stub = pb::RolloutEngine::NewStub(channel_);
    auto reader = stub->Generate(&ctx, in);
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.sample_index() < 0 || msg.sample_index() >= request.n) {
        error = "sample index " + std::to_string(msg.sample_index()) + " out of range";
        ctx.TryCancel();
        break;
      }
      GeneratedSample& s = samples[msg.sample_index()];
      s.index = msg.sample_index();
      for (const pb::Token& t : msg.new_tokens())
        s.tokens.push_back({t.id(), t.logprob(), t.raw_logprob(), t.weight_version()});
      if (msg.finished()) {
        ++finished;
        s.finish_reason = msg.finish_reason();
        s.prompt_tokens = msg.prompt_tokens();
        s.routed_experts.assign(msg.routed_experts().begin(), msg.routed_experts().end());
      }
    }
    grpc::Status st = reader->Finish();
    if (error.empty() && !st.ok()) error = st.error_message();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(&ctx);
  }
  if (error.empty() && finished != request.n)
    error = std::to_string(finished) + " of " + std::to_string(request.n) + " samples finished";
  if (!error.empty()) return Status::Error("generate on " + address_.http() + ": " + error);
  return samples;
}

void EngineClient::cancel_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (grpc::ClientContext* c : calls_) c->TryCancel();
}

int64_t EngineClient::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(calls_.size());
}

Status EngineClient::health(double timeout_s) const {
  auto stub = pb::RolloutEngine::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, timeout_s);
  pb::StatusResponse r;
  return from_grpc(stub->Health(&ctx, pb::Empty(), &r), r, "health of " + address_.http());
}

Result<SpecCounters> EngineClient::spec_counters() const {
  auto stub = pb::RolloutEngine::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, 10);
  pb::EngineStats r;
  MILES_RETURN_IF_ERROR(
      from_grpc(stub->GetStats(&ctx, pb::Empty(), &r), "stats of " + address_.http()));
  return SpecCounters{r.spec_verifies(), r.spec_draft_tokens(), r.spec_accepted_tokens(),
                      r.spec_emitted_tokens()};
}

Status EngineClient::pause(PauseMode mode) const {
  auto stub = pb::RolloutEngine::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, 30);
  pb::PauseRequest in;
  in.set_mode(mode == PauseMode::kRetract   ? pb::PauseRequest::RETRACT
              : mode == PauseMode::kInPlace ? pb::PauseRequest::IN_PLACE
                                            : pb::PauseRequest::ABORT);
  pb::StatusResponse r;
  return from_grpc(stub->PauseGeneration(&ctx, in, &r), r, "pause " + address_.http());
}

Status EngineClient::resume() const {
  auto stub = pb::RolloutEngine::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, 30);
  pb::StatusResponse r;
  return from_grpc(stub->ContinueGeneration(&ctx, pb::Empty(), &r), r,
                   "continue " + address_.http());
}

Status EngineClient::update_weights_from_disk_delta(const std::string& dir, int64_t version) const {
  auto stub = pb::EngineWeights::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, 300);
  pb::UpdateWeightsFromDiskDeltaRequest in;
  in.set_dir(dir);
  in.set_weight_version(version);
  pb::WeightVersion out;
  return from_grpc(stub->UpdateWeightsFromDiskDelta(&ctx, in, &out),
                   "update_weights_from_disk_delta on " + address_.http());
}

Status EngineClient::join_weight_group(const GroupJoinSpec& j) const {
  auto stub = pb::EngineWeights::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, 30);
  pb::JoinWeightGroupRequest in;
  in.set_store(j.store);
  in.set_prefix(j.prefix);
  in.set_rank(j.rank);
  in.set_world_size(j.world_size);
  in.set_timeout_s(j.timeout_s);
  in.set_host(j.host);
  in.set_plan_digest(j.plan_digest);
  in.set_stage(j.stage);
  in.set_stages(j.stages);
  in.set_trainer_layout(j.trainer_layout);
  in.set_engine_tp(j.engine_tp);
  if (j.comm != "gloo") in.set_comm(j.comm);
  pb::WeightVersion out;
  return from_grpc(stub->JoinWeightGroup(&ctx, in, &out),
                   "join_weight_group on " + address_.http());
}

Status EngineClient::update_weights_from_group(int64_t version, double timeout_s) const {
  auto stub = pb::EngineWeights::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, timeout_s);
  pb::UpdateWeightsFromGroupRequest in;
  in.set_weight_version(version);
  pb::WeightVersion out;
  return from_grpc(stub->UpdateWeightsFromGroup(&ctx, in, &out),
                   "update_weights_from_group on " + address_.http());
}

Result<WeightChecksums> EngineClient::weight_checksums() const {
  auto stub = pb::EngineWeights::NewStub(channel_);
  grpc::ClientContext ctx;
  authorize(ctx);
  set_deadline(ctx, 120);
  pb::WeightChecksums out;
  MILES_RETURN_IF_ERROR(
      from_grpc(stub->GetWeightChecksums(&ctx, pb::WeightChecksumsRequest(), &out),
                "weight_checksums on " + address_.http()));
  return WeightChecksums{out.weight_version(), {out.checksums().begin(), out.checksums().end()}};
}

}  // namespace miles::controller
