// ControllerService (controller_service.h): RegisterEngine, GetStatus, Stop; and the engine's
// client.
#include "miles/controller/controller_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <thread>

#include "controller/engine_pool.h"
#include "miles/host_port.h"
#include "miles/secret.h"
#include "miles/v1/controller.grpc.pb.h"

namespace miles::controller {

namespace pb = ::miles::v1;

namespace {

// "ipv4:10.0.0.2:5555" / "ipv6:[::1]:5555" → the host part.
std::string peer_host(const std::string& peer) {
  std::string p = peer;
  if (p.rfind("ipv4:", 0) == 0) p = p.substr(5);
  if (p.rfind("ipv6:", 0) == 0) p = p.substr(5);
  const size_t colon = p.rfind(':');
  if (colon != std::string::npos) p = p.substr(0, colon);
  return unbracket(p);
}

}  // namespace

class ControllerService::Impl final : public pb::Controller::Service {
 public:
  Impl(EnginePool& pool, std::function<void(pb::ControllerStatus*)> status, std::atomic<bool>& stop)
      : pool_(pool), status_(std::move(status)), stop_(stop), token_(run_token()) {}

  // Every call presents the run token ("authorization: Bearer <token>") when the run has one.
  grpc::Status authorize(grpc::ServerContext* ctx) const {
    if (token_.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string_view token =
        it == md.end() ? std::string_view()
                       : bearer_token(std::string_view(it->second.data(), it->second.size()));
    if (!token.empty() && secret_equal(token, token_)) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the controller needs the run's token (MILES_RUN_TOKEN on the controller, "
                        "MILES_API_KEY on the engine)");
  }

  grpc::Status RegisterEngine(grpc::ServerContext* ctx, const pb::RegisterEngineRequest* in,
                              pb::RegisterEngineResponse* out) override {
    if (grpc::Status a = authorize(ctx); !a.ok()) return a;
    if (in->http_port() <= 0 || in->grpc_port() <= 0)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "RegisterEngine needs http_port and grpc_port > 0");
    EngineAddress a;
    a.host = in->host().empty() ? peer_host(ctx->peer()) : in->host();
    a.http_port = in->http_port();
    a.grpc_port = in->grpc_port();
    auto id = pool_.on_register(a, in->engine_id(), in->pid());
    out->set_accepted(id.ok());
    out->set_message(id.ok() ? "registered" : id.message());
    out->set_engine_id(id.ok() ? *id : -1);
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const pb::ControllerStatusRequest*,
                         pb::ControllerStatus* out) override {
    if (grpc::Status a = authorize(ctx); !a.ok()) return a;
    if (status_) status_(out);
    for (const EngineInfo& e : pool_.snapshot()) {
      pb::EngineState* s = out->add_engines();
      s->set_engine_id(e.id);
      s->set_address(e.address);
      s->set_state(e.state);
      s->set_pid(e.pid);
      s->set_restarts(e.restarts);
      s->set_in_flight(e.in_flight);
    }
    return grpc::Status::OK;
  }

  grpc::Status Stop(grpc::ServerContext* ctx, const pb::StopRequest*,
                    pb::StopResponse* out) override {
    if (grpc::Status a = authorize(ctx); !a.ok()) return a;
    stop_ = true;
    out->set_accepted(true);
    return grpc::Status::OK;
  }

 private:
  EnginePool& pool_;
  std::function<void(pb::ControllerStatus*)> status_;
  std::atomic<bool>& stop_;
  std::string token_;
};

ControllerService::ControllerService(EnginePool& pool,
                                     std::function<void(pb::ControllerStatus*)> status)
    : impl_(std::make_unique<Impl>(pool, std::move(status), stop_requested_)) {}

ControllerService::~ControllerService() { stop(); }

Status ControllerService::start(const std::string& host, int port) {
  grpc::ServerBuilder b;
  b.AddListeningPort(host_port(host, port), grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(impl_.get());
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0)
    return Status::Error("cannot listen on " + host_port(host, port) +
                         " for the controller's gRPC service");
  return Status::Ok();
}

void ControllerService::stop() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

Result<int64_t> register_with_controller(const std::string& controller,
                                         const EngineRegistration& reg, double timeout_s,
                                         const std::function<bool()>& stop) {
  auto channel = grpc::CreateChannel(controller, grpc::InsecureChannelCredentials());
  auto stub = pb::Controller::NewStub(channel);
  pb::RegisterEngineRequest in;
  in.set_host(reg.host);
  in.set_http_port(reg.http_port);
  in.set_grpc_port(reg.grpc_port);
  in.set_engine_id(reg.engine_id);
  in.set_pid(reg.pid);
  in.set_weight_version(reg.weight_version);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!reg.token.empty()) ctx.AddMetadata("authorization", "Bearer " + reg.token);
    pb::RegisterEngineResponse out;
    grpc::Status s = stub->RegisterEngine(&ctx, in, &out);
    if (s.ok()) {
      if (!out.accepted())
        return Status::Error("the controller at " + controller + " refused: " + out.message());
      return out.engine_id();
    }
    last = s.error_message();
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
      return Status::Error("the controller at " + controller + " refused: " + last);
    if (stop && stop()) return Status::Error("stopped while registering with " + controller);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return Status::Error("no controller answered at " + controller + " within " +
                       std::to_string(timeout_s) + " s (" + last + ")");
}

}  // namespace miles::controller
