// `miles serve`: the rollout engine behind SGLang- and OpenAI-compatible HTTP endpoints.
#include <fmt/ranges.h>
#include <grpcpp/impl/service_type.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/serve_tp.h"
#include "miles/chat_template.h"
#include "miles/controller/controller_service.h"
#include "miles/draft_head.h"
#include "miles/host_port.h"
#include "miles/rollout/drafter.h"
#include "miles/rollout/engine.h"
#include "miles/rollout/grpc_server.h"
#include "miles/rollout/http_server.h"
#include "miles/secret.h"
#include "miles/thread_pool.h"
#include "miles/weight_sync/draft_files.h"
#include "miles/weight_sync/engine_weights.h"
#include "miles/weight_sync/grpc_weights.h"
#include "miles/weight_sync/serve_routes.h"

namespace miles::cli {

namespace {

struct ServeOptions {
  std::string model, tokenizer, chat_template;
  rollout::ServerOptions server;
  EngineOptions engine;
  int threads = 0;
  int grpc_port = -1;          // -1: no gRPC server
  std::string controller;      // HOST:PORT of a `miles run` controller to register with
  int64_t engine_id = -1;      // given by the controller that started this engine
  std::string advertise_host;  // the host the controller should call (default: --host)
  ServeTpOptions tp;
  std::string device = "cpu";  // cpu | cuda | emulated (miles/device_model.h)
  int64_t random_seed = -1;    // -1: fresh seeds from a random start-up value
  std::string api_key, api_key_file, admin_api_key, admin_api_key_file;
  std::vector<std::string> weights_dirs;  // besides the model's own directory
  std::vector<std::string> store_hosts;   // besides this machine and the controller's host
  bool spec_draft_head = false;  // draft with the co-trained head (weight_sync/draft_files.h)
};

// --spec-draft-head: after each adopted version, the head of that version from the first
// --weights-dir that has one (none: no drafts until one comes).
EngineWeights::AdoptHook draft_head_hook(HeadDrafter* drafter, std::vector<std::string> dirs,
                                         ModelConfig config) {
  return [drafter, dirs, config](Engine&, int64_t version, const TensorMap* weights) {
    std::shared_ptr<const DraftHead> head;
    if (weights == nullptr)  // the head's frozen parts are the policy's whole tensors
      spdlog::error(
          "miles serve: version {} came as this engine's tensor-parallel shards (a weight "
          "group): the draft head needs the whole weights (a disk-delta version); no drafts",
          version);
    for (const std::string& dir : dirs) {
      if (weights == nullptr) break;
      auto h = read_draft_head(dir, version, config, *weights);
      if (!h.ok()) {
        spdlog::error("miles serve: the draft head of version {}: {}", version, h.message());
        break;
      }
      if ((head = std::move(h).value())) {
        spdlog::info("miles serve: draft head of weight version {} ({}; features of layer{} {})",
                     version, draft_head_path(dir, version),
                     head->feature_layers().size() > 1 ? "s" : "",
                     fmt::join(head->feature_layers(), ", "));
        break;
      }
    }
    if (!head) spdlog::info("miles serve: no draft head of weight version {}: no drafts", version);
    drafter->set_head(std::move(head));
  };
}

// The hosts whose stores weight-group joins may reach: --weight-store-host and the controller's.
std::vector<std::string> trusted_store_hosts(const ServeOptions& o) {
  std::vector<std::string> hosts = o.store_hosts;
  if (const size_t colon = o.controller.rfind(':'); colon != std::string::npos)
    hosts.push_back(unbracket(o.controller.substr(0, colon)));
  return hosts;
}

// The directories weight updates may load from: the served model's (its directory, or the file's)
// and every --weights-dir.
std::vector<std::string> trusted_weight_dirs(const ServeOptions& o) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs = o.weights_dirs;
  std::error_code ec;
  const fs::path model = fs::absolute(o.model, ec);
  dirs.push_back(fs::is_directory(model, ec) ? model.string() : model.parent_path().string());
  return dirs;
}

// The bearer keys: a file, else MILES_API_KEY / MILES_ADMIN_API_KEY, else the flag.
Result<ApiKeys> serve_keys(const ServeOptions& o) {
  ApiKeys keys;
  MILES_ASSIGN_OR_RETURN(keys.api, read_secret(o.api_key, o.api_key_file, "MILES_API_KEY"));
  MILES_ASSIGN_OR_RETURN(keys.admin,
                         read_secret(o.admin_api_key, o.admin_api_key_file, "MILES_ADMIN_API_KEY"));
  return keys;
}

// Each open connection is a descriptor; the usual soft limit (1024) would refuse connections (or
// fail an accept) well before --max-connections. Raises it toward the hard limit.
void raise_open_file_limit(int max_connections) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(max_connections) + 512;
  if (lim.rlim_cur >= want) return;
  lim.rlim_cur = std::min(want, lim.rlim_max);
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < want)
    spdlog::warn(
        "miles serve: the open-file limit ({}) is below --max-connections + 512; raise "
        "`ulimit -n`",
        static_cast<uint64_t>(lim.rlim_cur));
}

// SIGINT and SIGTERM blocked before any thread starts, so that only the sigwait (or sigtimedwait)
// of run_serve sees them.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// The forwards the engine runs: on a device, over tensor-parallel followers, or on this CPU.
struct ServedModel {
  ServeTpGroup tp_group;  // followers of a tensor-parallel engine (killed with this process)
  std::shared_ptr<rollout::TpShardIntake> tp_intake;  // their direct p2p weight intake
  std::unique_ptr<ModelRunner> runner;
};

Result<ServedModel> load_served_model(const ServeOptions& o, ThreadPool& pool) {
  ServedModel m;
  MILES_ASSIGN_OR_RETURN(const Device device, parse_device(o.device));
  if (device != Device::kCpu && o.tp.tp > 1)
    return Status::Error("--device " + o.device +
                         " with --tp > 1: tensor-parallel engines run on the CPU only for now");
  if (device != Device::kCpu) {
    MILES_ASSIGN_OR_RETURN(auto files, load_model_files(o.model));
    MILES_ASSIGN_OR_RETURN(
        m.runner, make_device_model_runner(device, files.config, files.weights, o.engine, &pool));
    spdlog::info("miles serve: forwards on {}, KV cache in device memory", o.device);
  } else if (o.tp.tp > 1) {
    MILES_ASSIGN_OR_RETURN(m.tp_group, start_serve_tp(o.model, o.tp, o.engine, &pool));
    m.runner = std::move(m.tp_group.runner);
    MILES_ASSIGN_OR_RETURN(m.tp_intake, rollout::TpShardIntake::of(*m.runner));
  } else {
    MILES_ASSIGN_OR_RETURN(auto model, Model::load(o.model));
    m.runner = make_model_runner(std::shared_ptr<const Model>(std::move(model)), &pool);
  }
  return m;
}

// The tokenizer and chat template: --tokenizer / --chat-template must load; the model directory's
// own are optional (without them only input_ids prompts, and no /v1/chat/completions).
struct TextTools {
  std::shared_ptr<const Tokenizer> tok;
  std::shared_ptr<const ChatTemplate> chat;
};

Result<TextTools> load_text_tools(const ServeOptions& o, const ModelConfig& config) {
  TextTools tools;
  auto t = find_tokenizer(o.model, o.tokenizer, static_cast<int32_t>(config.vocab_size));
  if (t.ok())
    tools.tok = std::move(t).value();
  else if (!o.tokenizer.empty())
    return t.status();
  else
    spdlog::warn("miles serve: no tokenizer ({}); only input_ids prompts", t.message());
  const std::string chat_source =
      !o.chat_template.empty() ? o.chat_template : o.model + "/tokenizer_config.json";
  if (!std::filesystem::exists(chat_source)) return tools;
  auto tmpl = ChatTemplate::from_tokenizer_config(chat_source);
  if (tmpl.ok())
    tools.chat = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
  else if (!o.chat_template.empty())
    return tmpl.status();
  else
    spdlog::warn("miles serve: no chat template ({})", tmpl.message());
  return tools;
}

// The server's options that follow from the others: the trusted weight directories, TLS, the
// keys (a warning when an exposed address has none), and what /get_server_info reports.
Status settle_server_options(ServeOptions& o) {
  o.server.model_path = o.model;
  o.server.weight_dirs = trusted_weight_dirs(o);
  if (o.server.ssl_certfile.empty() != o.server.ssl_keyfile.empty())
    return Status::Error("--ssl-certfile and --ssl-keyfile go together");
  MILES_ASSIGN_OR_RETURN(o.server.keys, serve_keys(o));
  if (!o.server.keys.any() && !is_loopback_host(o.server.host))
    spdlog::warn(
        "miles serve: listening on {} without an API key: anyone who can reach this address can "
        "generate, swap weights and pause the engine (set MILES_API_KEY / --api-key-file; "
        "docs/security.md)",
        o.server.host);
  o.server.block_tokens = o.engine.block_tokens;
  o.server.tp_size = o.tp.tp;
  o.server.random_seed = o.engine.random_seed;
  return Status::Ok();
}

void log_speculation(const ServeOptions& o) {
  if (!o.engine.speculative.enabled) return;
  spdlog::info(
      "miles serve: speculative decoding ({}, up to {} drafts per sample, {}): the same samples "
      "bit for bit",
      o.spec_draft_head ? "co-trained draft head of each weight version"
                        : "model-free suffix drafter",
      o.engine.speculative.max_draft_tokens,
      o.engine.speculative.adaptive ? "adaptive" : "every proposal verified");
}

// Registers with the `miles run` controller at --controller (retrying for up to 120 s). A stop
// signal while it tries is taken (sigtimedwait) and ends the wait: `stop_signal` gets it.
Status register_with(const ServeOptions& o, int http_port, int grpc_port,
                     const sigset_t& stop_signals, int& stop_signal) {
  controller::EngineRegistration reg;
  reg.host =
      o.advertise_host.empty() && o.server.host != "0.0.0.0" ? o.server.host : o.advertise_host;
  reg.http_port = http_port;
  reg.grpc_port = grpc_port;
  reg.engine_id = o.engine_id;
  reg.pid = getpid();
  reg.token = o.server.keys.admin.empty() ? o.server.keys.api : o.server.keys.admin;
  // an engine whose controller never answers still stops when told (scancel, pod deletion)
  const auto stop_pending = [&] {
    const timespec zero{0, 0};
    stop_signal = sigtimedwait(&stop_signals, nullptr, &zero);
    return stop_signal > 0;
  };
  MILES_ASSIGN_OR_RETURN(
      const int64_t id, controller::register_with_controller(o.controller, reg, 120, stop_pending));
  spdlog::info("miles serve: registered with the controller at {} as engine {}", o.controller, id);
  return Status::Ok();
}

int run_serve(ServeOptions o) {
  const sigset_t stop_signals = block_stop_signals();
  raise_open_file_limit(o.server.connections.max_connections);
  // Threads per process: a tensor-parallel engine shares the cores among its ranks.
  if (o.threads == 0 && o.tp.tp > 1)
    o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / o.tp.tp);
  o.tp.threads = o.threads;
  ThreadPool pool(o.threads);
  auto served = load_served_model(o, pool);
  if (!served.ok()) return fail("serve", served.message());
  const ModelConfig config = served->runner->config();
  auto tools = load_text_tools(o, config);
  if (!tools.ok()) return fail("serve", tools.message());
  if (o.random_seed >= 0) o.engine.random_seed = static_cast<uint64_t>(o.random_seed);
  auto engine = std::make_unique<Engine>(std::move(served->runner), o.engine, tools->tok);
  HeadDrafter* head_drafter = nullptr;
  if (o.spec_draft_head) {
    auto d = make_head_drafter(nullptr, &pool);
    head_drafter = d.get();
    engine->set_drafter(std::move(d));
  }
  rollout::EngineDriver driver(std::move(engine));
  if (Status s = settle_server_options(o); !s.ok()) return fail("serve", s.message());
  // The weight lifecycle: over HTTP (SGLang's routes) and gRPC (the controller's), one component.
  auto weights = std::make_shared<EngineWeights>(
      driver, config, o.model, &pool, served->tp_intake,
      WeightSyncTrust{o.server.weight_dirs, trusted_store_hosts(o)});
  if (head_drafter) weights->set_adopt_hook(draft_head_hook(head_drafter, o.weights_dirs, config));
  o.server.extra_routes = [weights](httplib::Server& s, rollout::EngineDriver&) {
    register_weight_sync_routes(s, weights);
  };
  const rollout::CheckpointLoader load_checkpoint = [weights](const std::string& path) {
    const WeightReply r = weights->load_checkpoint(path);
    return r.ok() ? Status::Ok() : Status::Error(r.message);
  };
  o.server.load_checkpoint = load_checkpoint;
  const std::unique_ptr<grpc::Service> weights_service =
      make_weights_service(weights, o.server.keys);
  rollout::HttpServer server(driver, config, tools->tok, tools->chat, &pool, o.server);
  if (Status s = server.start(); !s.ok()) return fail("serve", s.message());
  spdlog::info("miles serve: listening on http://{} (model {})",
               host_port(o.server.host, server.port()), o.model);
  log_speculation(o);
  std::unique_ptr<rollout::GrpcServer> grpc;
  if (!o.controller.empty() && o.grpc_port < 0)
    o.grpc_port = 0;  // the controller generates over gRPC
  if (o.grpc_port >= 0) {
    grpc = std::make_unique<rollout::GrpcServer>(driver, config, tools->tok, &pool, o.model,
                                                 o.server.keys, o.server.weight_dirs);
    grpc->add_service(weights_service.get());
    grpc->set_checkpoint_loader(load_checkpoint);
    if (Status s =
            grpc->start(o.server.host, o.grpc_port, o.server.ssl_certfile, o.server.ssl_keyfile);
        !s.ok())
      return fail("serve", s.message());
    spdlog::info("miles serve: gRPC on {}", host_port(o.server.host, grpc->port()));
  }
  int sig = 0;
  if (!o.controller.empty()) {
    if (Status s = register_with(o, server.port(), grpc->port(), stop_signals, sig); !s.ok()) {
      grpc->stop();
      server.stop();
      if (sig <= 0) return fail("serve", s.message());
      spdlog::info("miles serve: stopping (signal {}) before registering", sig);
      return 0;
    }
  }
  sigwait(&stop_signals, &sig);
  spdlog::info("miles serve: stopping (signal {})", sig);
  if (grpc) grpc->stop();
  server.stop();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* sub = app.add_subcommand("serve", "Serve the rollout engine over HTTP");
  sub->add_option("--model", o->model, "HF model directory or llama2.c checkpoint")->required();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer (default: found beside the model)");
  sub->add_option("--chat-template", o->chat_template,
                  "tokenizer_config.json holding chat_template (default: beside the model)");
  sub->add_option("--host", o->server.host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o->server.port, "port (0: any free port)")->capture_default_str();
  sub->add_option("--grpc-port", o->grpc_port, "also serve gRPC on this port (0: any; -1: off)")
      ->capture_default_str();
  sub->add_option("--controller", o->controller,
                  "register with the `miles run` controller at HOST:PORT once listening");
  sub->add_option("--engine-id", o->engine_id, "the id a controller gave this engine (internal)");
  sub->add_option("--advertise-host", o->advertise_host,
                  "the host the controller should call (default: --host, or the peer address)");
  sub->add_option("--max-connections", o->server.connections.max_connections,
                  "open HTTP connections served at once (one thread each); more get 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--header-timeout", o->server.connections.header_timeout_s,
                  "seconds a request's line and headers (and a TLS handshake) may take to arrive")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--body-timeout", o->server.connections.body_timeout_s,
                  "seconds a request's body may take to arrive after its headers")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--threads", o->threads, "compute threads (0 = all cores)")
      ->capture_default_str();
  sub->add_option("--num-blocks", o->engine.num_blocks, "KV cache blocks")->capture_default_str();
  sub->add_option("--block-tokens", o->engine.block_tokens, "positions per KV block")
      ->capture_default_str();
  sub->add_option("--max-batch-tokens", o->engine.max_batch_tokens, "token budget per iteration")
      ->capture_default_str();
  sub->add_option("--max-running", o->engine.max_running, "samples decoding at once")
      ->capture_default_str();
  sub->add_option("--tp", o->tp.tp, "tensor-parallel processes of this engine")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--tp-launch", o->tp.launch,
                  "local: start the followers here; external: wait for `miles engine-tp-worker`s")
      ->capture_default_str();
  sub->add_option("--tp-store", o->tp.store,
                  "HOST:PORT of the group's store, hosted here (external launch)");
  sub->add_option("--tp-host", o->tp.host, "the address rank 0's group transport binds to")
      ->capture_default_str();
  sub->add_option("--tp-transport", o->tp.transport,
                  "shm (one host; default for a local launch) or gloo (default for external)")
      ->check(CLI::IsMember({"shm", "gloo"}));
  sub->add_option("--device", o->device,
                  "where forwards run: cpu, cuda (a GPU) or emulated (the device "
                  "kernels as host loops, for checking)")
      ->capture_default_str()
      ->check(CLI::IsMember(device_names()));
  sub->add_flag("!--no-prefix-cache", o->engine.enable_prefix_cache,
                "disable the radix prefix cache");
  sub->add_flag("--speculative", o->engine.speculative.enabled,
                "speculative decoding with the model-free suffix drafter (same samples, bit for "
                "bit)");
  sub->add_option("--spec-max-draft-tokens", o->engine.speculative.max_draft_tokens,
                  "drafted tokens a sample verifies per iteration")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_flag("!--no-spec-adaptive", o->engine.speculative.adaptive,
                "verify every draft, without the measured cost model");
  sub->add_flag("--spec-draft-head", o->spec_draft_head,
                "draft with the co-trained draft head of each weight version (from "
                "--weights-dir DIR/draft/, written by `miles run` with "
                "rollout.speculative_draft_head) instead of the suffix drafter")
      ->needs("--speculative");
  sub->add_option("--api-key", o->api_key,
                  "bearer key every route requires (prefer MILES_API_KEY or --api-key-file: a "
                  "flag shows in ps)");
  sub->add_option("--api-key-file", o->api_key_file, "file holding the API key");
  sub->add_option("--admin-api-key", o->admin_api_key,
                  "bearer key the weight, pause, cache, group and abort routes require (default: "
                  "the API key; or MILES_ADMIN_API_KEY)");
  sub->add_option("--admin-api-key-file", o->admin_api_key_file, "file holding the admin key");
  sub->add_option("--weights-dir", o->weights_dirs,
                  "a directory weight updates may load from (repeatable; the model's own "
                  "directory always): /update_weights_from_disk and disk-delta directories "
                  "elsewhere are refused (403)");
  sub->add_option("--weight-store-host", o->store_hosts,
                  "a host whose rendezvous stores /join_weight_group may reach (repeatable; this "
                  "machine and the --controller's host always): other stores are refused (403)");
  sub->add_option("--ssl-certfile", o->server.ssl_certfile,
                  "serve HTTPS (and gRPC over TLS) with this PEM certificate");
  sub->add_option("--ssl-keyfile", o->server.ssl_keyfile, "the certificate's PEM private key");
  sub->add_option("--max-body-bytes", o->server.max_body_bytes,
                  "request bodies above this are refused (413) before they are read; 0: no limit")
      ->capture_default_str();
  sub->add_option("--max-request-tokens", o->server.max_request_tokens,
                  "n x (prompt + max_new_tokens) one request may ask for; 0: no limit")
      ->capture_default_str();
  sub->add_option("--max-waiting-samples", o->server.max_waiting_samples,
                  "samples waiting for prefill beyond which new requests get 429; 0: no limit")
      ->capture_default_str();
  sub->add_option("--random-seed", o->random_seed,
                  "seeds the generator of fresh sampling seeds (requests without a seed): a "
                  "reproducible server; default: random at start-up")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--served-model-name", o->server.served_model_name, "name in OpenAI responses")
      ->capture_default_str();
  sub->callback([o] {
    if (int rc = run_serve(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
