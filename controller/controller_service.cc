// ControllerService (controller_service.h): RegisterEngine, JoinTrainer, GetStatus, Stop; and the
// engine's and the remote trainer rank's clients.
#include "miles/controller/controller_service.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

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
  Impl(std::function<void(pb::ControllerStatus*)> status, SeatFn seats, std::atomic<bool>& stop)
      : status_(std::move(status)), seats_(std::move(seats)), stop_(stop), token_(run_token()) {}

  void attach_engines(EnginePool& pool) { pool_ = &pool; }

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
    EnginePool* pool = pool_.load();
    if (!pool)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the controller is still loading its trainer; register again");
    EngineAddress a;
    a.host = in->host().empty() ? peer_host(ctx->peer()) : in->host();
    a.http_port = in->http_port();
    a.grpc_port = in->grpc_port();
    auto id = pool->on_register(a, in->engine_id(), in->pid());
    out->set_accepted(id.ok());
    out->set_message(id.ok() ? "registered" : id.message());
    out->set_engine_id(id.ok() ? *id : -1);
    return grpc::Status::OK;
  }

  grpc::Status JoinTrainer(grpc::ServerContext* ctx, const pb::JoinTrainerRequest* in,
                           pb::JoinTrainerResponse* out) override {
    if (grpc::Status a = authorize(ctx); !a.ok()) return a;
    const std::string peer = peer_host(ctx->peer());
    const SeatReply r = seats_(peer, in->pid(), in->hostname());
    if (r.kind == SeatReply::Kind::kNotYet)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, r.message);
    out->set_accepted(r.kind == SeatReply::Kind::kSeat);
    out->set_message(r.message);
    out->set_rank(r.seat.rank);
    out->set_world_size(r.seat.world_size);
    out->set_store_address(r.seat.store_address);
    out->set_config_yaml(r.seat.config_yaml);
    out->set_peer_host(peer);
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const pb::ControllerStatusRequest*,
                         pb::ControllerStatus* out) override {
    if (grpc::Status a = authorize(ctx); !a.ok()) return a;
    if (status_) status_(out);
    EnginePool* pool = pool_.load();
    if (!pool) return grpc::Status::OK;
    for (const EngineInfo& e : pool->snapshot()) {
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
  std::atomic<EnginePool*> pool_{nullptr};
  std::function<void(pb::ControllerStatus*)> status_;
  SeatFn seats_;
  std::atomic<bool>& stop_;
  std::string token_;
};

ControllerService::ControllerService(std::function<void(pb::ControllerStatus*)> status,
                                     SeatFn seats)
    : impl_(std::make_unique<Impl>(std::move(status), std::move(seats), stop_requested_)) {}

ControllerService::~ControllerService() { stop(); }

void ControllerService::attach_engines(EnginePool& pool) { impl_->attach_engines(pool); }

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

namespace {

// Calls the controller until it answers (`call` with a fresh context, the run token attached),
// retrying every 0.5 s up to `timeout_s` while it is unreachable or not ready; an answer that
// refuses (`accepted` false, a wrong token, an older controller without the call) ends at once.
template <typename Response, typename Call>
Result<Response> call_controller(const std::string& controller, const std::string& token,
                                 double timeout_s, const std::function<bool()>& stop,
                                 const Call& call) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    Response out;
    grpc::Status s = call(&ctx, &out);
    if (s.ok()) {
      if (!out.accepted())
        return Status::Error("the controller at " + controller + " refused: " + out.message());
      return out;
    }
    last = s.error_message();
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        s.error_code() == grpc::StatusCode::UNIMPLEMENTED)
      return Status::Error("the controller at " + controller + " refused: " + last);
    if (stop && stop())
      return Status::Error("stopped while calling the controller at " + controller);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return Status::Error("no controller answered at " + controller + " within " +
                       std::to_string(timeout_s) + " s (" + last + ")");
}

}  // namespace

Result<int64_t> register_with_controller(const std::string& controller,
                                         const EngineRegistration& reg, double timeout_s,
                                         const std::function<bool()>& stop) {
  auto stub =
      pb::Controller::NewStub(grpc::CreateChannel(controller, grpc::InsecureChannelCredentials()));
  pb::RegisterEngineRequest in;
  in.set_host(reg.host);
  in.set_http_port(reg.http_port);
  in.set_grpc_port(reg.grpc_port);
  in.set_engine_id(reg.engine_id);
  in.set_pid(reg.pid);
  in.set_weight_version(reg.weight_version);
  MILES_ASSIGN_OR_RETURN(pb::RegisterEngineResponse out,
                         call_controller<pb::RegisterEngineResponse>(
                             controller, reg.token, timeout_s, stop,
                             [&](grpc::ClientContext* ctx, pb::RegisterEngineResponse* out) {
                               return stub->RegisterEngine(ctx, in, out);
                             }));
  return out.engine_id();
}

Result<JoinedSeat> join_trainer_group(const std::string& controller, const std::string& token,
                                      double timeout_s) {
  const size_t colon = controller.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == controller.size())
    return Status::Error("--controller " + controller + " is not HOST:PORT");
  auto stub =
      pb::Controller::NewStub(grpc::CreateChannel(controller, grpc::InsecureChannelCredentials()));
  pb::JoinTrainerRequest in;
  in.set_pid(getpid());
  char hostname[256] = {};
  if (gethostname(hostname, sizeof hostname - 1) == 0) in.set_hostname(hostname);
  MILES_ASSIGN_OR_RETURN(pb::JoinTrainerResponse out,
                         call_controller<pb::JoinTrainerResponse>(
                             controller, token, timeout_s, nullptr,
                             [&](grpc::ClientContext* ctx, pb::JoinTrainerResponse* out) {
                               return stub->JoinTrainer(ctx, in, out);
                             }));
  JoinedSeat j;
  j.seat.rank = out.rank();
  j.seat.world_size = out.world_size();
  j.seat.store_address = out.store_address();
  j.seat.config_yaml = out.config_yaml();
  j.peer_host = out.peer_host();
  return j;
}

}  // namespace miles::controller
