// EngineClient (engine_client.h): gRPC generation and health, HTTP weight updates.
#include "controller/engine_client.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "miles/host_port.h"
#include "miles/secret.h"
#include "miles/v1/rollout.grpc.pb.h"

namespace miles::controller {

namespace pb = ::miles::v1;
using nlohmann::json;

namespace {

void set_deadline(grpc::ClientContext& ctx, double seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

Status from_grpc(const grpc::Status& s, const pb::StatusResponse& r, const std::string& what) {
  if (!s.ok()) return Status::Error(what + ": " + s.error_message());
  if (!r.success()) return Status::Error(what + ": " + r.message());
  return Status::Ok();
}

// The run token (secret.h) on every call to an engine: HTTP and gRPC.
void authorize(httplib::Client& c) {
  if (const std::string t = run_token(); !t.empty()) c.set_bearer_token_auth(t.c_str());
}

void authorize(grpc::ClientContext& ctx) {
  if (const std::string t = run_token(); !t.empty())
    ctx.AddMetadata("authorization", "Bearer " + t);
}

// POSTs JSON over HTTP; the reply must be 200 with {"success": true}.
Status post_json(const EngineAddress& a, const std::string& path, const json& body,
                 double timeout_s) {
  httplib::Client c(a.host, a.http_port);
  authorize(c);
  c.set_connection_timeout(std::chrono::milliseconds(2000));
  c.set_read_timeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  auto res = c.Post(path, body.dump(), "application/json");
  if (!res) return Status::Error(path + " on " + a.http() + ": " + httplib::to_string(res.error()));
  const json reply = json::parse(res->body, nullptr, false);
  if (res->status != 200 || !reply.is_object() || !reply.value("success", false))
    return Status::Error(path + " on " + a.http() + ": HTTP " + std::to_string(res->status) + " " +
                         (reply.is_object() ? reply.value("message", res->body) : res->body));
  return Status::Ok();
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
  return post_json(address_, "/update_weights_from_disk_delta",
                   json{{"dir", dir}, {"weight_version", version}}, 300);
}

Status EngineClient::join_weight_group(const GroupJoin& j) const {
  json body = {{"store", j.store},
               {"prefix", j.prefix},
               {"rank", j.rank},
               {"world_size", j.world_size},
               {"timeout_s", j.timeout_s},
               {"host", j.host},
               {"plan_digest", j.plan_digest}};
  if (j.trainer_layout.empty()) {
    body["stage"] = j.stage;
    body["stages"] = j.stages;
  } else {
    body["transport"] = "p2p";
    body["trainer_layout"] = j.trainer_layout;
  }
  if (j.engine_tp > 1) body["engine_tp"] = j.engine_tp;
  return post_json(address_, "/join_weight_group", body, 30);
}

Status EngineClient::update_weights_from_group(int64_t version, double timeout_s) const {
  return post_json(address_, "/update_weights_from_group", json{{"weight_version", version}},
                   timeout_s);
}

Result<std::pair<int64_t, std::map<std::string, std::string>>> EngineClient::weight_checksums()
    const {
  httplib::Client c(address_.host, address_.http_port);
  authorize(c);
  c.set_read_timeout(std::chrono::seconds(120));
  auto res = c.Get("/weight_checksums");
  if (!res)
    return Status::Error("weight_checksums on " + address_.http() + ": " +
                         httplib::to_string(res.error()));
  const json j = json::parse(res->body, nullptr, false);
  if (res->status != 200 || !j.is_object() || !j.contains("checksums"))
    return Status::Error("weight_checksums on " + address_.http() + ": HTTP " +
                         std::to_string(res->status) + " " + res->body);
  std::map<std::string, std::string> sums;
  for (auto it = j["checksums"].begin(); it != j["checksums"].end(); ++it)
    sums[it.key()] = it->get<std::string>();
  return std::make_pair(j.value("weight_version", int64_t{-1}), std::move(sums));
}

}  // namespace miles::controller
