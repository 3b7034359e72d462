// HttpServer: native SGLang-style endpoints. Each request runs on an httplib worker thread and talks to
// the engine only through the EngineDriver.
#include "rollout/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "miles/thread_pool.h"
#include "rollout/generate_api.h"
#include "rollout/http_common.h"
#include "rollout/openai_api.h"
#include "rollout/sessions.h"

namespace miles::rollout {

using nlohmann::json;

HttpServer::HttpServer(EngineDriver& driver, const ModelConfig& config,
                       std::shared_ptr<const Tokenizer> tokenizer,
                       std::shared_ptr<const ChatTemplate> chat, ThreadPool* model_pool,
                       ServerOptions options)
    : driver_(driver),
      config_(config),
      tok_(std::move(tokenizer)),
      chat_(std::move(chat)),
      model_pool_(model_pool),
      opt_(std::move(options)),
      svr_(std::make_unique<httplib::Server>()),
      sessions_(std::make_unique<SessionStore>(opt_.max_sessions)) {
  const int threads = opt_.http_threads;
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_payload_max_length(64 << 20);
  // httplib listens with a backlog of 5, which drops connections when hundreds of clients arrive at
  // once; remember the listening socket so start() can raise it.
  svr_->set_socket_options([this](int sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  routes();
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  if (opt_.port == 0) {
    port_ = svr_->bind_to_any_port(opt_.host);
    if (port_ <= 0) return Status::Error("cannot bind " + opt_.host + " to any port");
  } else {
    if (!svr_->bind_to_port(opt_.host, opt_.port))
      return Status::Error("cannot bind " + opt_.host + ":" + std::to_string(opt_.port) +
                           " (in use, or not an address of this machine)");
    port_ = opt_.port;
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 4096);
  thread_ = std::thread([this] { svr_->listen_after_bind(); });
  return Status::Ok();
}

void HttpServer::stop() {
  if (svr_) svr_->stop();
  if (thread_.joinable()) thread_.join();
}

uint64_t HttpServer::register_rid(const std::string& rid, uint64_t id) {
  std::lock_guard<std::mutex> lock(rid_mu_);
  rids_[rid] = id;
  return id;
}

void HttpServer::forget_rid(const std::string& rid) {
  std::lock_guard<std::mutex> lock(rid_mu_);
  rids_.erase(rid);
}

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  const int64_t experts_per_token = config_.num_moe_layers() * config_.moe.top_k;
  const int64_t moe_layers = config_.num_moe_layers();

  s.Post("/generate", [this, experts_per_token, moe_layers](const httplib::Request& req,
                                                            httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto call = parse_generate(*body, tok_.get());
    if (!call.ok()) return reply_error(res, 400, call.message(), http_errors_);
    if (call->rid.empty()) call->rid = "miles-" + std::to_string(next_rid_++);
    auto stream = std::make_shared<RequestStream>();
    auto id = driver_.submit(call->request, stream);
    if (!id.ok()) return reply_error(res, 400, id.message(), http_errors_);
    register_rid(call->rid, *id);
    const int32_t n = call->request.n;
    if (!call->stream) {
      const std::vector<SampleEvent> finals = stream->wait_finished(n);
      forget_rid(call->rid);
      json out = json::array();
      for (int32_t i = 0; i < n; ++i)
        out.push_back(sample_json(*call, finals[i].output, &finals[i], tok_.get(),
                                  experts_per_token, moe_layers));
      res.set_content(dump_json(n == 1 ? out[0] : out), "application/json");
      return;
    }
    auto shared_call = std::make_shared<GenerateCall>(std::move(call).value());
    auto outputs = std::make_shared<std::vector<std::vector<TokenOutput>>>(n);
    auto finished = std::make_shared<int32_t>(0);
    const uint64_t engine_id = *id;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, shared_call, stream, outputs, finished, n, engine_id, experts_per_token,
         moe_layers](size_t, httplib::DataSink& sink) {
          SampleEvent ev;
          if (*finished == n) {
            sink.write("data: [DONE]\n\n", 14);
            sink.done();
            return true;
          }
          if (!stream->next(ev, 200)) {
            if (!sink.is_writable()) {  // client gone: free its KV blocks now
              driver_.call<bool>([engine_id](Engine& e) { return e.abort(engine_id); });
              forget_rid(shared_call->rid);
              return false;
            }
            return true;
          }
          auto& out = (*outputs)[ev.sample_index];
          out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
          json chunk = sample_json(*shared_call, out, ev.finished ? &ev : nullptr, tok_.get(),
                                   experts_per_token, moe_layers);
          chunk["index"] = ev.sample_index;
          const std::string line = "data: " + dump_json(chunk) + "\n\n";
          if (ev.finished) ++*finished;
          if (*finished == n) forget_rid(shared_call->rid);
          if (!sink.write(line.data(), line.size())) {
            driver_.call<bool>([engine_id](Engine& e) { return e.abort(engine_id); });
            forget_rid(shared_call->rid);
            return false;
          }
          return true;
        });
  });

  s.Post("/abort_request", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    if (!body->is_object() || !body->contains("rid") || !(*body)["rid"].is_string())
      return reply_error(res, 400, "abort_request needs {\"rid\": string}", http_errors_);
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(rid_mu_);
      auto it = rids_.find((*body)["rid"].get<std::string>());
      if (it == rids_.end()) return reply_error(res, 404, "no running request with that rid", http_errors_);
      id = it->second;
    }
    const bool ok = driver_.call<bool>([id](Engine& e) { return e.abort(id); });
    res.set_content(json{{"success", ok}}.dump(), "application/json");
  });

  register_control_routes();
  register_openai_routes();
  register_session_routes();
  if (opt_.extra_routes) opt_.extra_routes(*svr_, driver_);
}

}  // namespace miles::rollout
