// HttpServer: native SGLang-style endpoints. Each request runs on an httplib worker thread and
// talks to the engine only through the EngineDriver.
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
  // Every 4xx / 5xx has a JSON body: routes that exist fill their own; this covers the rest (an
  // unknown path, a wrong method, a body over the limit).
  svr_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ++http_errors_;
    const std::string message = res.status == 404 ? "no route " + req.method + " " + req.path
                                : res.status == 405
                                    ? "method " + req.method + " not allowed on " + req.path
                                : res.status == 413 ? "the request body is too large"
                                                    : "HTTP " + std::to_string(res.status);
    res.set_content(json{{"error",
                          {{"message", message},
                           {"type", res.status < 500 ? "invalid_request_error" : "server_error"},
                           {"code", res.status}}}}
                        .dump(),
                    "application/json");
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

std::string HttpServer::version_label(int64_t v) const {
  std::lock_guard<std::mutex> lock(version_mu_);
  auto it = version_labels_.find(v);
  return it != version_labels_.end() ? it->second : std::to_string(v);
}

ReplyContext HttpServer::reply_context() const {
  ReplyContext ctx;
  ctx.tok = tok_.get();
  ctx.moe_layers = config_.num_moe_layers();
  ctx.experts_per_token = ctx.moe_layers * config_.moe.top_k;
  ctx.version_label = [this](int64_t v) { return version_label(v); };
  return ctx;
}

// Submits every prompt of a /generate body, then answers with their samples (prompt-major, n per
// prompt: SGLang's order), at the end or as one SSE stream whose chunks carry that index.
void HttpServer::serve_generate(GenerateBatch batch, httplib::Response& res) {
  auto stream = std::make_shared<RequestStream>();
  struct Job {
    GenerateCall call;
    uint64_t engine_id = 0;
    int32_t first = 0;  // index of its first sample in the response
  };
  auto jobs = std::make_shared<std::vector<Job>>();
  int32_t total = 0;
  for (GenerateCall& c : batch.calls) {
    if (c.rid.empty()) c.rid = "miles-" + std::to_string(next_rid_++);
    auto id = driver_.submit(c.request, stream);
    if (!id.ok()) {
      for (const Job& j : *jobs) {
        driver_.call<bool>([&](Engine& e) { return e.abort(j.engine_id); });
        forget_rid(j.call.rid);
      }
      return reply_error(res, 400, id.message(), http_errors_);
    }
    register_rid(c.rid, *id);
    jobs->push_back({std::move(c), *id, total});
    total += jobs->back().call.request.n;
  }
  auto job_of = [jobs](uint64_t engine_id) -> Job& {
    for (Job& j : *jobs)
      if (j.engine_id == engine_id) return j;
    return jobs->front();
  };
  const ReplyContext ctx = reply_context();
  if (!batch.stream) {
    json out = json::array();
    for (int32_t i = 0; i < total; ++i) out.push_back(nullptr);
    for (int32_t done = 0; done < total;) {
      SampleEvent ev;
      if (!stream->next(ev, 1000) || !ev.finished) continue;
      const Job& j = job_of(ev.request_id);
      out[j.first + ev.sample_index] = sample_json(j.call, ev.output, &ev, ctx);
      ++done;
    }
    for (const Job& j : *jobs) forget_rid(j.call.rid);
    res.set_content(dump_json(total == 1 && !batch.batched ? out[0] : out), "application/json");
    return;
  }
  auto outputs = std::make_shared<std::vector<std::vector<TokenOutput>>>(total);
  auto finished = std::make_shared<int32_t>(0);
  auto abort_all_jobs = [this, jobs] {
    for (const Job& j : *jobs) {
      const uint64_t id = j.engine_id;
      driver_.call<bool>([id](Engine& e) { return e.abort(id); });
      forget_rid(j.call.rid);
    }
  };
  res.set_chunked_content_provider(
      "text/event-stream", [this, stream, jobs, job_of, outputs, finished, total, ctx,
                            abort_all_jobs](size_t, httplib::DataSink& sink) {
        if (*finished == total) {
          sink.write("data: [DONE]\n\n", 14);
          sink.done();
          return true;
        }
        SampleEvent ev;
        if (!stream->next(ev, 200)) {
          if (!sink.is_writable()) {  // client gone: free its KV blocks now
            abort_all_jobs();
            return false;
          }
          return true;
        }
        const Job& j = job_of(ev.request_id);
        const int32_t index = j.first + ev.sample_index;
        auto& out = (*outputs)[index];
        out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
        json chunk = sample_json(j.call, out, ev.finished ? &ev : nullptr, ctx);
        chunk["index"] = index;
        const std::string line = "data: " + dump_json(chunk) + "\n\n";
        if (ev.finished && ++*finished == total)
          for (const Job& done : *jobs) forget_rid(done.call.rid);
        if (!sink.write(line.data(), line.size())) {
          abort_all_jobs();
          return false;
        }
        return true;
      });
}

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  s.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto batch = parse_generate(*body, tok_.get());
    if (!batch.ok()) return reply_error(res, 400, batch.message(), http_errors_);
    serve_generate(std::move(batch).value(), res);
  });

  s.Post("/abort_request", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    const bool all = body->is_object() && body->value("abort_all", false) == true;
    const bool has_rid = body->is_object() && body->contains("rid") && (*body)["rid"].is_string();
    if (!all && !has_rid)
      return reply_error(res, 400, "abort_request needs {\"rid\": string} or {\"abort_all\": true}",
                         http_errors_);
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(rid_mu_);
      // SGLang matches by prefix ("abc" also aborts "abc_0") and answers an unknown rid with 200
      // (it may have finished already): so do we.
      const std::string prefix = all ? "" : (*body)["rid"].get<std::string>();
      for (auto it = rids_.lower_bound(prefix);
           it != rids_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
        ids.push_back(it->second);
    }
    if (all) {  // also requests of other front ends (OpenAI, gRPC)
      driver_.run_sync([](Engine& e) { e.abort_all(); });
    } else {
      for (uint64_t id : ids) driver_.call<bool>([id](Engine& e) { return e.abort(id); });
    }
    res.set_content(json{{"success", true}, {"aborted", ids.size()}}.dump(), "application/json");
  });

  register_control_routes();
  register_openai_routes();
  register_session_routes();
  if (opt_.extra_routes) opt_.extra_routes(*svr_, driver_);
}

}  // namespace miles::rollout
