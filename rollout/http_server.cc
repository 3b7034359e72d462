// HttpServer: native SGLang-style endpoints. Each request runs on an httplib worker thread and
// talks to the engine only through the EngineDriver.
#include "miles/rollout/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "miles/thread_pool.h"
#include "rollout/generate_api.h"
#include "rollout/http_common.h"
#include "miles/rollout/http_transport.h"
#include "rollout/openai_api.h"
#include "miles/rollout/sessions.h"

namespace miles::rollout {

using nlohmann::json;

bool is_admin_route(const std::string& path) {
  static const std::set<std::string> kAdmin = {
      "/pause_generation",         "/continue_generation",        "/flush_cache",
      "/update_weights_from_disk", "/update_weights_from_disk_delta",
      "/update_weights_from_group", "/update_weight_version",     "/join_weight_group",
      "/begin_weight_update",      "/end_weight_update",          "/release_memory_occupation",
      "/resume_memory_occupation", "/check_weights",              "/init_weights_update_group",
      "/update_weights_from_distributed", "/update_weights_from_tensor",
      "/destroy_weights_update_group", "/abort_request"};
  return kAdmin.count(path) > 0;
}

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
      svr_(make_bounded_server(opt_.connections, opt_.ssl_certfile, opt_.ssl_keyfile, &transport_)),
      sessions_(std::make_unique<SessionStore>(opt_.max_sessions)) {
  if (opt_.max_body_bytes > 0) svr_->set_payload_max_length(opt_.max_body_bytes);
  svr_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    request_headers_received();
    const auto handled = [] {  // answered before the body was read: it must not be parsed next
      close_after_response();
      return httplib::Server::HandlerResponse::Handled;
    };
    // GET /health stays open (liveness probes cannot carry a secret; it answers "ok", nothing more).
    const bool open = !opt_.keys.any() || (req.method == "GET" && req.path == "/health");
    const std::string header = req.get_header_value("Authorization");
    const std::string_view token = bearer_token(header);
    if (open || opt_.keys.allows(token, is_admin_route(req.path))) {
      if (!body_too_large(req)) return httplib::Server::HandlerResponse::Unhandled;
      reply_error(res, 413,
                  "the request body is too large (Content-Length " +
                      req.get_header_value("Content-Length") + " > " +
                      std::to_string(opt_.max_body_bytes) + " bytes, --max-body-bytes)",
                  http_errors_);
      return handled();
    }
    ++http_errors_;
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_content(json{{"error",
                          {{"message", token.empty() ? "missing \"Authorization: Bearer <key>\""
                                                     : is_admin_route(req.path)
                                                           ? "this route needs the admin key"
                                                           : "wrong API key"},
                           {"type", "authentication_error"},
                           {"code", 401}}}}
                        .dump(),
                    "application/json");
    return handled();
  });
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
    if (request_timed_out()) res.status = 408;  // the connection closes after this reply
    const std::string message =
        res.status == 408
            ? "the request did not arrive in time (--header-timeout " +
                  json(opt_.connections.header_timeout_s).dump() + " s, --body-timeout " +
                  json(opt_.connections.body_timeout_s).dump() + " s)"
        : res.status == 404 ? "no route " + req.method + " " + req.path
        : res.status == 405 ? "method " + req.method + " not allowed on " + req.path
        : res.status == 413 ? "the request body is too large"
                            : "HTTP " + std::to_string(res.status);
    res.set_content(json{{"error",
                          {{"message", message},
                           {"type", res.status < 500 ? "invalid_request_error" : "server_error"},
                           {"code", res.status}}}}
                        .dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  });
  routes();
}

HttpServer::~HttpServer() { stop(); }

bool HttpServer::body_too_large(const httplib::Request& req) const {
  if (opt_.max_body_bytes == 0 || !req.has_header("Content-Length")) return false;
  const std::string v = req.get_header_value("Content-Length");
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  return errno == ERANGE || n > opt_.max_body_bytes;
}

Status HttpServer::start() {
  if (!svr_->is_valid())
    return Status::Error("TLS: cannot use the certificate " + opt_.ssl_certfile + " with the key " +
                         opt_.ssl_keyfile + " (PEM files, the key matching the certificate)");
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

// The server's bounds on one request (HTTP only; the controller's gRPC calls are trusted):
// n x (prompt + max_new_tokens) tokens per request, and the samples already waiting.
bool HttpServer::admit(const std::vector<const GenerateRequest*>& requests, httplib::Response& res) {
  int64_t tokens = 0;
  for (const GenerateRequest* r : requests)
    tokens += static_cast<int64_t>(r->n) *
              (static_cast<int64_t>(r->input_ids.size()) + std::max<int64_t>(0, r->max_new_tokens));
  if (opt_.max_request_tokens > 0 && tokens > opt_.max_request_tokens) {
    reply_error(res, 400,
                "the request asks for up to " + std::to_string(tokens) +
                    " tokens (n x (prompt + max_new_tokens), summed over its prompts); this server "
                    "takes at most " + std::to_string(opt_.max_request_tokens) +
                    " per request (--max-request-tokens)",
                http_errors_);
    return false;
  }
  if (opt_.max_waiting_samples > 0) {
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    if (st.waiting >= opt_.max_waiting_samples) {
      res.set_header("Retry-After", "1");
      reply_error(res, 429,
                  std::to_string(st.waiting) + " samples are waiting for prefill (the limit is " +
                      std::to_string(opt_.max_waiting_samples) + ", --max-waiting-samples); retry",
                  http_errors_);
      return false;
    }
  }
  return true;
}

// Submits every prompt of a /generate body, then answers with their samples (prompt-major, n per
// prompt: SGLang's order), at the end or as one SSE stream whose chunks carry that index.
void HttpServer::serve_generate(GenerateBatch batch, httplib::Response& res) {
  auto stream = std::make_shared<RequestStream>();
  const auto start = std::chrono::steady_clock::now();
  auto seconds_since = [start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  struct Job {
    GenerateCall call;
    uint64_t engine_id = 0;
    int32_t first = 0;  // index of its first sample in the response
  };
  auto jobs = std::make_shared<std::vector<Job>>();
  std::vector<const GenerateRequest*> requests;
  for (const GenerateCall& c : batch.calls) requests.push_back(&c.request);
  if (!admit(requests, res)) return;
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
  auto abort_all_jobs = [this, jobs] {
    for (const Job& j : *jobs) {
      const uint64_t id = j.engine_id;
      driver_.call<bool>([id](Engine& e) { return e.abort(id); });
      forget_rid(j.call.rid);
    }
  };
  if (!batch.stream) {
    // One JSON body at the end; meanwhile a space (JSON allows leading whitespace) every second,
    // so that a client that has gone is noticed and its request aborted (its KV blocks freed).
    auto out = std::make_shared<json>(json::array());
    for (int32_t i = 0; i < total; ++i) out->push_back(nullptr);
    auto done = std::make_shared<int32_t>(0);
    const bool single = total == 1 && !batch.batched;
    res.set_chunked_content_provider(
        "application/json", [this, stream, jobs, job_of, out, done, total, single, ctx,
                             abort_all_jobs, seconds_since](size_t, httplib::DataSink& sink) {
          const auto beat = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          while (*done < total && std::chrono::steady_clock::now() < beat) {
            SampleEvent ev;
            if (!stream->next(ev, 200) || !ev.finished) continue;
            const Job& j = job_of(ev.request_id);
            (*out)[j.first + ev.sample_index] = sample_json(j.call, ev.output, &ev, ctx);
            (*out)[j.first + ev.sample_index]["meta_info"]["e2e_latency"] = seconds_since();
            ++*done;
          }
          if (*done < total) {
            if (sink.write(" ", 1)) return true;
            abort_all_jobs();
            return false;
          }
          for (const Job& j : *jobs) forget_rid(j.call.rid);
          const std::string body = dump_json(single ? (*out)[0] : *out);
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        });
    return;
  }
  auto outputs = std::make_shared<std::vector<std::vector<TokenOutput>>>(total);
  auto finished = std::make_shared<int32_t>(0);
  res.set_chunked_content_provider(
      "text/event-stream", [this, stream, jobs, job_of, outputs, finished, total, ctx,
                            abort_all_jobs, seconds_since](size_t, httplib::DataSink& sink) {
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
        if (ev.finished) chunk["meta_info"]["e2e_latency"] = seconds_since();
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
      for (auto it = rids_.lower_bound(prefix); (all || !prefix.empty()) &&
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
