// HttpServer: the engine over HTTP — SGLang-compatible native endpoints (/generate, /abort_request,
// /pause_generation, /continue_generation, /flush_cache, /update_weights_from_disk,
// /get_model_info, /health, /metrics) and the OpenAI-compatible /v1/completions and
// /v1/chat/completions, and the TITO sessions of agentic rollouts (/sessions, see sessions.h).
//
// Why: RL frameworks and agents speak these APIs. Every handler validates its input and answers a
// 4xx with a message on bad input; the engine keeps serving.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "miles/rollout/engine.h"
#include "miles/rollout/engine_driver.h"
#include "miles/rollout/http_transport.h"
#include "miles/secret.h"
#include "miles/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace miles {
class ThreadPool;
class ChatTemplate;
}  // namespace miles

namespace miles::rollout {

struct OpenAiCall;
struct GenerateBatch;
struct ReplyContext;
struct SubmittedPrompts;
class SessionStore;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;        // 0: any free port (see HttpServer::port())
  // Open connections (one thread each) and the deadlines for reading a request: http_transport.h.
  ConnectionLimits connections;
  std::string model_path;  // reported by /get_model_info
  std::string served_model_name = "miles";
  size_t max_sessions = 4096;  // /sessions kept at once; creating one more drops the least recent
  // Reported by /get_server_info and the load routes.
  int64_t block_tokens = 16;
  int tp_size = 1;
  std::optional<uint64_t> random_seed;  // --random-seed (null: seeded at random at start-up)
  std::string version = "miles";
  // HTTPS with this certificate and private key (PEM files); empty: plain HTTP.
  std::string ssl_certfile, ssl_keyfile;
  // Directories weight updates may load from (/update_weights_from_disk, disk deltas); empty: any
  // path (a library default; `miles serve` always names the model's directory and --weights-dir).
  std::vector<std::string> weight_dirs;
  // Bearer keys (none: open). Admin routes: is_admin_route.
  ApiKeys keys;
  // Request bodies above this are refused (413) before they are read; 0: no limit.
  size_t max_body_bytes = 8u << 20;
  // Per request: n x (prompt + max_new_tokens) above this is refused (400); and while this many
  // samples already wait for prefill, new requests get 429 with Retry-After. 0: no limit.
  int64_t max_request_tokens = int64_t{1} << 22;
  int64_t max_waiting_samples = 4096;
  // More routes, registered after the built-in ones (e.g. include/miles/weight_sync/serve_routes.h: receiving new
  // weight versions and reporting checksums), so that rollout/ depends on nothing above it.
  std::function<void(httplib::Server&, EngineDriver&)> extra_routes;
  // Swaps in a whole checkpoint for POST /update_weights_from_disk: `miles serve` passes its
  // weight lifecycle's (EngineWeights::load_checkpoint), so that its checksums follow the swap;
  // unset: load_checkpoint_into.
  CheckpointLoader load_checkpoint;
};

// Routes that change the engine (weights, versions, pause, cache, groups, memory, aborts): they
// take the admin key when one is set.
bool is_admin_route(const std::string& path);

class HttpServer {
 public:
  HttpServer(EngineDriver& driver, const ModelConfig& config,
             std::shared_ptr<const Tokenizer> tokenizer, std::shared_ptr<const ChatTemplate> chat,
             ThreadPool* model_pool, ServerOptions options);
  ~HttpServer();
  // Binds and starts serving on a background thread; an error when the address is taken.
  Status start();
  void stop();
  int port() const { return port_; }

 private:
  void routes();
  // A Content-Length over max_body_bytes (refused before the body is read).
  bool body_too_large(const httplib::Request& req) const;
  // A body the limit cannot hold to (compressed: 415; chunked: 411), as (status, message); a body
  // with neither length nor transfer coding is declared empty.
  static std::optional<std::pair<int, std::string>> body_framing_error(const httplib::Request& req);
  void register_control_routes();    // http_control.cc: the three below and http_load.cc's
  void register_lifecycle_routes();  // pause, continue, flush, weight updates and versions
  void register_info_routes();       // model info, health, metrics
  void register_load_routes();     // http_load.cc: health_generate, get_load, v1/loads, server info
  void register_memory_routes();   // http_load.cc: release / resume_memory_occupation
  static Result<std::string> read_version(const nlohmann::json& body, const char* key,
                                          bool required);
  int64_t adopt_version(const std::string& label, bool abort_all_requests);
  void register_openai_routes();   // http_openai.cc
  void register_session_routes();  // http_sessions.cc
  void serve_openai(OpenAiCall call, bool chat, httplib::Response& res);  // http_openai.cc
  void serve_generate(GenerateBatch batch, httplib::Response& res);
  // Admits the requests (the server's bounds, admit) and submits one engine request per prompt;
  // null when the request was answered with an error (a refused submission aborts the prompts
  // already submitted).
  std::shared_ptr<const SubmittedPrompts> submit_prompts(std::vector<GenerateRequest> requests,
                                                         httplib::Response& res);
  void abort_prompts(const SubmittedPrompts& submitted);
  // false (and the 400 / 429 answered) when the requests exceed the server's bounds.
  bool admit(const std::vector<const GenerateRequest*>& requests, httplib::Response& res);
  // SGLang types weight versions as strings: the label /update_weight_version gave version v, or
  // its decimal digits.
  std::string version_label(int64_t v) const;
  ReplyContext reply_context() const;
  uint64_t register_rid(const std::string& rid, uint64_t id);
  void forget_rid(const std::string& rid);

  EngineDriver& driver_;
  ModelConfig config_;
  std::shared_ptr<const Tokenizer> tok_;
  std::shared_ptr<const ChatTemplate> chat_;
  ThreadPool* model_pool_;
  ServerOptions opt_;
  TransportCounters transport_;  // declared before svr_, which points at it
  std::unique_ptr<httplib::Server> svr_;
  std::unique_ptr<SessionStore> sessions_;
  std::thread thread_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::mutex rid_mu_;
  std::map<std::string, uint64_t> rids_;
  std::atomic<uint64_t> next_rid_{1};
  mutable std::mutex version_mu_;
  std::map<int64_t, std::string> version_labels_;
  std::atomic<uint64_t> http_requests_{0}, http_errors_{0};
};

}  // namespace miles::rollout
