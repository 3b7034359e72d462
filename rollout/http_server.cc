// HttpServer: native SGLang-style endpoints. Each request runs on an httplib worker thread and
// talks to the engine only through the EngineDriver.
#include "miles/rollout/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "miles/rollout/http_transport.h"
#include "miles/rollout/sessions.h"
#include "miles/thread_pool.h"
#include "rollout/generate_api.h"
#include "rollout/http_common.h"
#include "rollout/http_reply.h"
#include "rollout/openai_api.h"

namespace miles::rollout {

using nlohmann::json;

namespace {

// Content codings are case-insensitive tokens (RFC 9110 8.4.1): "Identity" is "identity".
bool is_identity_coding(std::string_view coding) {
  constexpr std::string_view kIdentity = "identity";
  if (coding.size() != kIdentity.size()) return false;
  for (size_t i = 0; i < coding.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(coding[i])) != kIdentity[i]) return false;
  return true;
}

}  // namespace

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
      if (auto refused = body_framing_error(req)) {
        reply_error(res, refused->first, refused->second, http_errors_);
        return handled();
      }
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

// The body limit holds only for a body whose length is stated and whose bytes are the JSON. httplib
// reads a chunked body, or one without Content-Length, to its end with no bound, and inflates a
// gzip or brotli one after checking the compressed length (measured: 20 MB read through each).
std::optional<std::pair<int, std::string>> HttpServer::body_framing_error(
    const httplib::Request& req) {
  if (req.has_header("Content-Encoding") &&
      !is_identity_coding(req.get_header_value("Content-Encoding")))
    return std::pair{415, "Content-Encoding " + req.get_header_value("Content-Encoding") +
                              " is not accepted: send the body uncompressed"};
  if (req.has_header("Transfer-Encoding"))
    return std::pair{411, "a body in Transfer-Encoding " +
                              req.get_header_value("Transfer-Encoding") +
                              " is not accepted: send it with a Content-Length"};
  // No length and no transfer coding: the request has no body (RFC 9112 6.3), where httplib would
  // read one until the client closes. Saying so lets it read zero bytes (`curl -X POST` with no
  // data: an empty body, as SGLang takes it). The request is not const in httplib's routing; only
  // this handler's view of it is.
  if (!req.has_header("Content-Length") && (req.method == "POST" || req.method == "PUT" ||
                                            req.method == "PATCH" || req.method == "DELETE"))
    const_cast<httplib::Request&>(req).set_header("Content-Length", "0");
  return std::nullopt;
}

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

std::shared_ptr<const SubmittedPrompts> HttpServer::submit_prompts(
    std::vector<GenerateRequest> requests, httplib::Response& res) {
  std::vector<const GenerateRequest*> bounded;
  for (const GenerateRequest& r : requests) bounded.push_back(&r);
  if (!admit(bounded, res)) return nullptr;
  auto sub = std::make_shared<SubmittedPrompts>();
  for (GenerateRequest& r : requests) {
    const int32_t n = r.n;
    auto id = driver_.submit(std::move(r), sub->stream);
    if (!id.ok()) {
      abort_prompts(*sub);
      reply_error(res, 400, id.message(), http_errors_);
      return nullptr;
    }
    sub->engine_ids.push_back(*id);
    sub->first.push_back(sub->total);
    sub->total += n;
  }
  return sub;
}

void HttpServer::abort_prompts(const SubmittedPrompts& sub) {
  for (uint64_t e : sub.engine_ids) driver_.call<bool>([e](Engine& en) { return en.abort(e); });
}

namespace {

// What the replies of one /generate body are built from.
struct GenerateReply {
  std::shared_ptr<const SubmittedPrompts> sub;
  std::shared_ptr<const std::vector<GenerateCall>> calls;  // per prompt
  ReplyContext ctx;
  std::chrono::steady_clock::time_point start;
  std::function<void()> forget_rids;
  const GenerateCall& call_of(const SampleEvent& ev) const {
    return (*calls)[sub->prompt_of(ev.request_id)];
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// One JSON body at the end: the sample's object when the body asked for one sample of one prompt
// (not a batch), else the array of every sample.
void generate_at_end(httplib::Response& res, ReplySamples samples, const GenerateReply& r,
                     bool single) {
  auto out = std::make_shared<json>(json::array());
  for (int32_t i = 0; i < r.sub->total; ++i) out->push_back(nullptr);
  reply_at_end(
      res, std::move(samples),
      [r, out](SampleEvent& ev) {
        json& sample = (*out)[r.sub->index_of(ev)];
        sample = sample_json(r.call_of(ev), ev.output, &ev, r.ctx);
        sample["meta_info"]["e2e_latency"] = r.seconds();
      },
      [r, out, single] {
        r.forget_rids();
        return dump_json(single ? (*out)[0] : *out);
      });
}

// Each event as a chunk of its sample's output so far, with the sample's index.
void generate_events(httplib::Response& res, ReplySamples samples, const GenerateReply& r) {
  auto outputs = std::make_shared<std::vector<std::vector<TokenOutput>>>(r.sub->total);
  SseReply reply;
  reply.on_event = [r, outputs](const SampleEvent& ev) {
    const int32_t index = r.sub->index_of(ev);
    auto& out = (*outputs)[index];
    out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
    json chunk = sample_json(r.call_of(ev), out, ev.finished ? &ev : nullptr, r.ctx);
    chunk["index"] = index;
    if (ev.finished) chunk["meta_info"]["e2e_latency"] = r.seconds();
    return sse_line(chunk);
  };
  reply.all_finished = r.forget_rids;
  reply_as_events(res, std::move(samples), std::move(reply));
}

}  // namespace

// Submits every prompt of a /generate body, then answers with their samples (prompt-major, n per
// prompt: SGLang's order), at the end or as one SSE stream whose chunks carry that index.
void HttpServer::serve_generate(GenerateBatch batch, httplib::Response& res) {
  GenerateReply r;
  r.start = std::chrono::steady_clock::now();
  std::vector<GenerateRequest> requests;
  for (const GenerateCall& c : batch.calls) requests.push_back(c.request);
  r.sub = submit_prompts(std::move(requests), res);
  if (!r.sub) return;
  auto calls = std::make_shared<std::vector<GenerateCall>>(std::move(batch.calls));
  for (size_t p = 0; p < calls->size(); ++p) {
    GenerateCall& c = (*calls)[p];
    if (c.rid.empty()) c.rid = "miles-" + std::to_string(next_rid_++);
    register_rid(c.rid, r.sub->engine_ids[p]);
  }
  r.calls = calls;
  r.ctx = reply_context();
  r.forget_rids = [this, calls] {
    for (const GenerateCall& c : *calls) forget_rid(c.rid);
  };
  ReplySamples samples{r.sub, [this, r] {
                         abort_prompts(*r.sub);
                         r.forget_rids();
                       }};
  if (batch.stream) return generate_events(res, std::move(samples), r);
  generate_at_end(res, std::move(samples), r, r.sub->total == 1 && !batch.batched);
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
