// GrpcServer: each RPC validates its input (INVALID_ARGUMENT with the message on bad input) and
// talks to the engine through the EngineDriver. Generate streams one message per sample event; a
// cancelled call aborts its request so its KV blocks are freed.
#include "miles/rollout/grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "miles/host_port.h"
#include "miles/model.h"
#include "miles/path_guard.h"
#include "miles/secret.h"
#include "miles/v1/rollout.grpc.pb.h"
#include "rollout/grpc_wire.h"

namespace miles::rollout {

namespace pb = ::miles::v1;

grpc::Status authorize_grpc_call(const grpc::ServerContext& ctx, const ApiKeys& keys, bool admin) {
  if (!keys.any()) return grpc::Status::OK;
  std::string_view token;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end())
    token = bearer_token(std::string_view(it->second.data(), it->second.size()));
  if (keys.allows(token, admin)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      token.empty() ? "missing \"authorization: Bearer <key>\" metadata"
                                    : "wrong key for this call");
}

class RolloutService final : public pb::RolloutEngine::Service {
 public:
  RolloutService(EngineDriver& d, const ModelConfig& c, std::shared_ptr<const Tokenizer> tok,
                 ThreadPool* pool, std::string model_path, ApiKeys keys,
                 std::vector<std::string> weight_dirs)
      : driver_(d),
        config_(c),
        tok_(std::move(tok)),
        pool_(pool),
        model_path_(std::move(model_path)),
        keys_(std::move(keys)),
        weight_dirs_(std::move(weight_dirs)) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* in,
                        grpc::ServerWriter<pb::GenerateResponse>* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/false); !a.ok()) return a;
    auto req = generate_request_from_proto(*in, tok_.get());
    if (!req.ok()) return invalid(req.message());
    const GenerateRequest& r = *req;
    const std::string rid = in->rid().empty() ? "grpc-" + std::to_string(next_rid_++) : in->rid();
    auto stream = std::make_shared<RequestStream>();
    auto id = driver_.submit(r, stream);
    if (!id.ok()) return invalid(id.message());
    remember(rid, *id);
    const int64_t per_token = config_.num_moe_layers() * config_.moe.top_k;
    int32_t finished = 0;
    SampleEvent ev;
    while (finished < r.n) {
      if (!stream->next(ev, 200)) {
        if (ctx->IsCancelled()) return cancel(*id, rid);
        continue;
      }
      pb::GenerateResponse msg;
      msg.set_rid(rid);
      msg.set_sample_index(ev.sample_index);
      for (const auto& t : ev.new_tokens) {
        pb::Token* tk = msg.add_new_tokens();
        tk->set_id(t.id);
        tk->set_logprob(t.logprob);
        tk->set_raw_logprob(t.raw_logprob);
        tk->set_weight_version(t.weight_version);
      }
      if (ev.finished) {
        ++finished;
        msg.set_finished(true);
        msg.set_finish_reason(finish_reason_name(ev.finish_reason));
        msg.set_matched_stop(ev.matched_stop);
        msg.set_prompt_tokens(ev.prompt_tokens);
        msg.set_cached_tokens(ev.cached_tokens);
        msg.set_sampling_seed(ev.seed);
        if (in->return_routed_experts() && per_token > 0) {
          msg.mutable_routed_experts()->Add(ev.routed_experts.begin(), ev.routed_experts.end());
          msg.add_routed_experts_shape(static_cast<int64_t>(ev.routed_experts.size()) / per_token);
          msg.add_routed_experts_shape(config_.num_moe_layers());
          msg.add_routed_experts_shape(config_.moe.top_k);
        }
      }
      if (!out->Write(msg)) return cancel(*id, rid);
    }
    forget(rid);
    return grpc::Status::OK;
  }

  grpc::Status Abort(grpc::ServerContext* ctx, const pb::AbortRequest* in,
                     pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = rids_.find(in->rid());
      if (it == rids_.end())
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            "no running request with rid '" + in->rid() + "'");
      id = it->second;
    }
    out->set_success(driver_.call<bool>([id](Engine& e) { return e.abort(id); }));
    return grpc::Status::OK;
  }

  grpc::Status PauseGeneration(grpc::ServerContext* ctx, const pb::PauseRequest* in,
                               pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    const PauseMode m = pause_mode_from_proto(*in);
    driver_.run_sync([m](Engine& e) { e.pause(m); });
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status ContinueGeneration(grpc::ServerContext* ctx, const pb::Empty*,
                                  pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    driver_.run_sync([](Engine& e) { e.resume(); });
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status FlushCache(grpc::ServerContext* ctx, const pb::Empty*,
                          pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    Status st;
    driver_.run_sync([&](Engine& e) { st = e.flush_cache(); });
    if (!st.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, st.message());
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status BeginWeightUpdate(grpc::ServerContext* ctx, const pb::Empty*,
                                 pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    return bracket(true, out);
  }
  grpc::Status EndWeightUpdate(grpc::ServerContext* ctx, const pb::Empty*,
                               pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    return bracket(false, out);
  }

  grpc::Status UpdateWeightsFromDisk(grpc::ServerContext* ctx,
                                     const pb::UpdateWeightsFromDiskRequest* in,
                                     pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    // Only from trusted directories, and the error names the path, never what it holds.
    if (Status c = confine_path(in->model_path(), weight_dirs_, "--weights-dir"); !c.ok())
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, c.message());
    const Status st = load_checkpoint_ ? load_checkpoint_(in->model_path())
                                       : load_checkpoint_into(driver_, in->model_path());
    if (!st.ok()) {
      const bool generating = st.message().find("pause it first") != std::string::npos;
      return generating ? grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, st.message())
                        : invalid(st.message());
    }
    // A swap always moves the version: the one given, else the next number.
    const int64_t version = driver_.call<int64_t>([&](Engine& e) {
      const int64_t v =
          in->set_weight_version() ? in->weight_version() : e.stats().weight_version + 1;
      e.update_weight_version(v);
      return v;
    });
    out->set_success(true);
    out->set_message("weight_version " + std::to_string(version));
    return grpc::Status::OK;
  }

  grpc::Status UpdateWeightVersion(grpc::ServerContext* ctx,
                                   const pb::UpdateWeightVersionRequest* in,
                                   pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/true); !a.ok()) return a;
    const int64_t v = in->new_version();
    driver_.run_sync([v](Engine& e) { e.update_weight_version(v); });
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const pb::Empty*,
                            pb::ModelInfo* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/false); !a.ok()) return a;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    out->set_model_path(model_path_);
    out->set_architecture(config_.arch_name);
    out->set_vocab_size(config_.vocab_size);
    out->set_max_position_embeddings(config_.max_position_embeddings);
    out->set_num_moe_layers(config_.num_moe_layers());
    out->set_moe_top_k(config_.moe.top_k);
    out->set_weight_version(st.weight_version);
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext* ctx, const pb::Empty*, pb::EngineStats* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/false); !a.ok()) return a;
    const EngineStats s = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    out->set_free_blocks(s.free_blocks);
    out->set_total_blocks(s.total_blocks);
    out->set_cached_blocks(s.cached_blocks);
    out->set_waiting(s.waiting);
    out->set_running(s.running);
    out->set_weight_version(s.weight_version);
    out->set_paused(s.paused);
    out->set_iterations(s.iterations);
    out->set_generated_tokens(s.generated_tokens);
    out->set_prompt_tokens(s.prompt_tokens);
    out->set_cached_prompt_tokens(s.cached_prompt_tokens);
    out->set_spec_verifies(s.spec_verifies);
    out->set_spec_draft_tokens(s.spec_draft_tokens);
    out->set_spec_accepted_tokens(s.spec_accepted_tokens);
    out->set_spec_emitted_tokens(s.spec_emitted_tokens);
    return grpc::Status::OK;
  }

  void set_checkpoint_loader(CheckpointLoader load) { load_checkpoint_ = std::move(load); }

  grpc::Status Health(grpc::ServerContext* ctx, const pb::Empty*,
                      pb::StatusResponse* out) override {
    if (grpc::Status a = authorize(ctx, /*admin=*/false); !a.ok()) return a;
    out->set_success(true);
    out->set_message("ok");
    return grpc::Status::OK;
  }

 private:
  grpc::Status authorize(grpc::ServerContext* ctx, bool admin) const {
    return authorize_grpc_call(*ctx, keys_, admin);
  }
  grpc::Status bracket(bool begin, pb::StatusResponse* out) {
    Status st;
    driver_.run_sync(
        [&](Engine& e) { st = begin ? e.begin_weight_update() : e.end_weight_update(); });
    if (!st.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, st.message());
    out->set_success(true);
    return grpc::Status::OK;
  }
  static grpc::Status invalid(const std::string& m) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, m);
  }
  grpc::Status cancel(uint64_t id, const std::string& rid) {
    driver_.call<bool>([id](Engine& e) { return e.abort(id); });
    forget(rid);
    return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled; request aborted");
  }
  void remember(const std::string& rid, uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    rids_[rid] = id;
  }
  void forget(const std::string& rid) {
    std::lock_guard<std::mutex> lock(mu_);
    rids_.erase(rid);
  }

  EngineDriver& driver_;
  CheckpointLoader load_checkpoint_;
  ModelConfig config_;
  std::shared_ptr<const Tokenizer> tok_;
  ThreadPool* pool_;
  std::string model_path_;
  ApiKeys keys_;
  std::vector<std::string> weight_dirs_;
  std::mutex mu_;
  std::map<std::string, uint64_t> rids_;
  std::atomic<uint64_t> next_rid_{1};
};

GrpcServer::GrpcServer(EngineDriver& driver, const ModelConfig& config,
                       std::shared_ptr<const Tokenizer> tok, ThreadPool* model_pool,
                       std::string model_path, ApiKeys keys, std::vector<std::string> weight_dirs)
    : service_(std::make_unique<RolloutService>(driver, config, std::move(tok), model_pool,
                                                std::move(model_path), std::move(keys),
                                                std::move(weight_dirs))) {}

GrpcServer::~GrpcServer() { stop(); }

void GrpcServer::set_checkpoint_loader(CheckpointLoader load) {
  service_->set_checkpoint_loader(std::move(load));
}

Status GrpcServer::start(const std::string& host, int port, const std::string& ssl_certfile,
                         const std::string& ssl_keyfile) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!ssl_certfile.empty()) {
    auto read = [](const std::string& path) -> Result<std::string> {
      std::ifstream in(path, std::ios::binary);
      if (!in) return Status::Error("gRPC TLS: cannot read " + path);
      std::ostringstream s;
      s << in.rdbuf();
      return s.str();
    };
    MILES_ASSIGN_OR_RETURN(std::string cert, read(ssl_certfile));
    MILES_ASSIGN_OR_RETURN(std::string key, read(ssl_keyfile));
    grpc::SslServerCredentialsOptions o;
    o.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(o);
  }
  grpc::ServerBuilder b;
  b.AddListeningPort(host_port(host, port), creds, &port_);
  b.RegisterService(service_.get());
  for (grpc::Service* extra : extra_services_) b.RegisterService(extra);
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0)
    return Status::Error("gRPC: cannot listen on " + host_port(host, port));
  return Status::Ok();
}

void GrpcServer::stop() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

}  // namespace miles::rollout
