// GrpcServer: each RPC validates its input (INVALID_ARGUMENT with the message on bad input) and talks
// to the engine through the EngineDriver. Generate streams one message per sample event; a cancelled
// call aborts its request so its KV blocks are freed.
#include "miles/host_port.h"
#include "rollout/grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <mutex>

#include "miles/v1/rollout.grpc.pb.h"
#include "miles/model.h"

namespace miles::rollout {

namespace pb = ::miles::v1;

class RolloutService final : public pb::RolloutEngine::Service {
 public:
  RolloutService(EngineDriver& d, const ModelConfig& c, std::shared_ptr<const Tokenizer> tok,
                 ThreadPool* pool, std::string model_path)
      : driver_(d), config_(c), tok_(std::move(tok)), pool_(pool), model_path_(std::move(model_path)) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* in,
                        grpc::ServerWriter<pb::GenerateResponse>* out) override {
    GenerateRequest r;
    if (!in->text().empty()) {
      if (!in->input_ids().empty())
        return invalid("give exactly one of text and input_ids");
      if (!tok_) return invalid("text prompts need a tokenizer; this server has none (send input_ids)");
      r.input_ids = tok_->encode(in->text(), /*add_special=*/true);
    } else {
      r.input_ids.assign(in->input_ids().begin(), in->input_ids().end());
    }
    const pb::SamplingParams& sp = in->sampling_params();
    r.sampling.temperature = sp.temperature();
    r.sampling.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
    r.sampling.top_k = sp.top_k();
    r.sampling.min_p = sp.min_p();
    r.sampling.seed = sp.seed();
    r.draw_seed = !sp.has_seed();
    r.max_new_tokens = sp.max_new_tokens();
    r.stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
    r.stop_strings.assign(sp.stop().begin(), sp.stop().end());
    r.ignore_eos = sp.ignore_eos();
    r.n = sp.n() == 0 ? 1 : sp.n();
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

  grpc::Status Abort(grpc::ServerContext*, const pb::AbortRequest* in, pb::StatusResponse* out) override {
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = rids_.find(in->rid());
      if (it == rids_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no running request with rid '" + in->rid() + "'");
      id = it->second;
    }
    out->set_success(driver_.call<bool>([id](Engine& e) { return e.abort(id); }));
    return grpc::Status::OK;
  }

  grpc::Status PauseGeneration(grpc::ServerContext*, const pb::PauseRequest* in,
                               pb::StatusResponse* out) override {
    PauseMode m = PauseMode::kAbort;
    if (in->mode() == pb::PauseRequest::RETRACT) m = PauseMode::kRetract;
    if (in->mode() == pb::PauseRequest::IN_PLACE) m = PauseMode::kInPlace;
    driver_.run_sync([m](Engine& e) { e.pause(m); });
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status ContinueGeneration(grpc::ServerContext*, const pb::Empty*, pb::StatusResponse* out) override {
    driver_.run_sync([](Engine& e) { e.resume(); });
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status FlushCache(grpc::ServerContext*, const pb::Empty*, pb::StatusResponse* out) override {
    Status st;
    driver_.run_sync([&](Engine& e) { st = e.flush_cache(); });
    if (!st.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, st.message());
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status BeginWeightUpdate(grpc::ServerContext*, const pb::Empty*, pb::StatusResponse* out) override {
    return bracket(true, out);
  }
  grpc::Status EndWeightUpdate(grpc::ServerContext*, const pb::Empty*, pb::StatusResponse* out) override {
    return bracket(false, out);
  }

  grpc::Status UpdateWeightsFromDisk(grpc::ServerContext*, const pb::UpdateWeightsFromDiskRequest* in,
                                     pb::StatusResponse* out) override {
    auto files = load_model_files(in->model_path());
    if (!files.ok()) return invalid(files.message());
    Status st;
    driver_.run_sync([&](Engine& e) {
      st = e.update_weights(files->weights);
      if (st.ok() && in->set_weight_version()) e.update_weight_version(in->weight_version());
    });
    if (!st.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, st.message());
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status UpdateWeightVersion(grpc::ServerContext*, const pb::UpdateWeightVersionRequest* in,
                                   pb::StatusResponse* out) override {
    const int64_t v = in->new_version();
    driver_.run_sync([v](Engine& e) { e.update_weight_version(v); });
    out->set_success(true);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext*, const pb::Empty*, pb::ModelInfo* out) override {
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

  grpc::Status GetStats(grpc::ServerContext*, const pb::Empty*, pb::EngineStats* out) override {
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
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const pb::Empty*, pb::StatusResponse* out) override {
    out->set_success(true);
    out->set_message("ok");
    return grpc::Status::OK;
  }

 private:
  grpc::Status bracket(bool begin, pb::StatusResponse* out) {
    Status st;
    driver_.run_sync([&](Engine& e) { st = begin ? e.begin_weight_update() : e.end_weight_update(); });
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
  ModelConfig config_;
  std::shared_ptr<const Tokenizer> tok_;
  ThreadPool* pool_;
  std::string model_path_;
  std::mutex mu_;
  std::map<std::string, uint64_t> rids_;
  std::atomic<uint64_t> next_rid_{1};
};

GrpcServer::GrpcServer(EngineDriver& driver, const ModelConfig& config,
                       std::shared_ptr<const Tokenizer> tok, ThreadPool* model_pool,
                       std::string model_path)
    : service_(std::make_unique<RolloutService>(driver, config, std::move(tok), model_pool,
                                                std::move(model_path))) {}

GrpcServer::~GrpcServer() { stop(); }

Status GrpcServer::start(const std::string& host, int port) {
  grpc::ServerBuilder b;
  b.AddListeningPort(host_port(host, port), grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(service_.get());
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
