// Control endpoints: the weight-update lifecycle (pause, continue, flush, load weights, version),
// model info, health and Prometheus metrics.
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "miles/model.h"
#include "miles/path_guard.h"
#include "miles/rollout/http_server.h"
#include "rollout/http_common.h"

namespace miles::rollout {

using nlohmann::json;

// A weight version as SGLang types it (a string; an integer is taken too). Empty when absent and
// not required.
Result<std::string> HttpServer::read_version(const json& body, const char* key, bool required) {
  if (!body.is_object() || !body.contains(key) || body[key].is_null()) {
    if (!required) return std::string();
    return Status::Error(std::string("needs {\"") + key + "\": string or integer}");
  }
  const json& v = body[key];
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 256)
    return Status::Error(std::string(key) +
                         " must be a non-empty string (at most 256 bytes) or an integer");
  return v.get<std::string>();
}

// Sets the engine's weight version from a label: a decimal integer is the version itself; any
// other label gets the next integer (tokens keep integer versions) and is reported in its place.
// Empty: the next integer. Returns the engine's version.
int64_t HttpServer::adopt_version(const std::string& label, bool abort_all_requests) {
  int64_t v = 0;
  size_t used = 0;
  bool numeric = false;
  try {
    v = std::stoll(label, &used);
    numeric = used == label.size() && !label.empty();
  } catch (...) {
  }
  driver_.run_sync([&](Engine& e) {
    if (abort_all_requests) e.abort_all();
    if (!numeric) v = e.stats().weight_version + 1;
    e.update_weight_version(v);
  });
  std::lock_guard<std::mutex> lock(version_mu_);
  if (numeric || label.empty()) {  // reported as its digits
    version_labels_.erase(v);
  } else {
    version_labels_[v] = label;
  }
  return v;
}

namespace {

// /pause_generation's "mode" (SGLang's: abort by default) and its name.
Result<std::pair<PauseMode, std::string>> pause_mode_of(const json& body) {
  std::string mode = "abort";
  if (body.is_object() && body.contains("mode")) {
    if (!body["mode"].is_string())
      return Status::Error("mode must be \"retract\", \"in_place\" or \"abort\"");
    mode = body["mode"].get<std::string>();
  }
  if (mode == "retract") return std::make_pair(PauseMode::kRetract, mode);
  if (mode == "in_place") return std::make_pair(PauseMode::kInPlace, mode);
  if (mode == "abort") return std::make_pair(PauseMode::kAbort, mode);
  return Status::Error("mode '" + mode + "': expected retract, in_place or abort");
}

// The server's counters that /metrics reports beside the engine's.
struct HttpCounters {
  uint64_t requests, errors;
  const TransportCounters& transport;
};

// /metrics in Prometheus' text format (version 0.0.4).
std::string prometheus_text(const EngineStats& st, const HttpCounters& http) {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
      << name << " " << v << "\n";
  };
  metric("miles_kv_free_blocks", "gauge", "KV cache blocks not in use", st.free_blocks);
  metric("miles_kv_total_blocks", "gauge", "KV cache blocks in the pool", st.total_blocks);
  metric("miles_prefix_cache_blocks", "gauge", "blocks held by the radix prefix cache",
         st.cached_blocks);
  metric("miles_requests_running", "gauge", "samples decoding", st.running);
  metric("miles_requests_waiting", "gauge", "samples waiting for prefill", st.waiting);
  metric("miles_weight_version", "gauge", "weight version of new tokens", st.weight_version);
  metric("miles_paused", "gauge", "1 while generation is paused", st.paused ? 1 : 0);
  metric("miles_iterations_total", "counter", "engine iterations", st.iterations);
  metric("miles_generated_tokens_total", "counter", "tokens generated", st.generated_tokens);
  metric("miles_prompt_tokens_total", "counter", "prompt tokens prefilled", st.prompt_tokens);
  metric("miles_cached_prompt_tokens_total", "counter",
         "prompt tokens served from the prefix cache", st.cached_prompt_tokens);
  metric("miles_retractions_total", "counter", "samples retracted to be recomputed",
         st.retractions);
  metric("miles_spec_verifies_total", "counter", "sample-steps that verified speculative drafts",
         st.spec_verifies);
  metric("miles_spec_draft_tokens_total", "counter", "drafted tokens verified",
         st.spec_draft_tokens);
  metric("miles_spec_accepted_tokens_total", "counter", "drafted tokens accepted",
         st.spec_accepted_tokens);
  metric("miles_spec_emitted_tokens_total", "counter",
         "tokens emitted by verify steps (accepted drafts and the samples' own)",
         st.spec_emitted_tokens);
  metric("miles_http_requests_total", "counter", "HTTP requests handled", http.requests);
  metric("miles_http_errors_total", "counter", "HTTP requests answered with an error", http.errors);
  metric("miles_http_connections", "gauge", "HTTP connections open", http.transport.open.load());
  metric("miles_http_connections_refused_total", "counter",
         "HTTP connections refused over --max-connections", http.transport.refused.load());
  metric("miles_http_request_timeouts_total", "counter",
         "HTTP requests whose headers or body missed their deadline",
         http.transport.timed_out.load());
  return o.str();
}

}  // namespace

void HttpServer::register_control_routes() {
  register_lifecycle_routes();
  register_info_routes();
  register_load_routes();
  register_memory_routes();
}

// The weight-update lifecycle: pause, continue, flush, the update bracket, versions, a checkpoint
// from disk.
void HttpServer::register_lifecycle_routes() {
  httplib::Server& s = *svr_;

  s.Post("/pause_generation", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto mode = pause_mode_of(*body);
    if (!mode.ok()) return reply_error(res, 400, mode.message(), http_errors_);
    const PauseMode m = mode->first;
    driver_.run_sync([m](Engine& e) { e.pause(m); });
    res.set_content(json{{"success", true}, {"mode", mode->second}}.dump(), "application/json");
  });

  s.Post("/continue_generation", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    driver_.run_sync([](Engine& e) { e.resume(); });
    res.set_content(json{{"success", true}}.dump(), "application/json");
  });

  auto flush = [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    Status st;
    driver_.run_sync([&](Engine& e) { st = e.flush_cache(); });
    if (!st.ok()) return reply_error(res, 400, st.message(), http_errors_);
    res.set_content(json{{"success", true}}.dump(), "application/json");
  };
  s.Post("/flush_cache", flush);
  s.Get("/flush_cache", flush);

  auto bracket = [this](bool begin) {
    return [this, begin](const httplib::Request&, httplib::Response& res) {
      ++http_requests_;
      Status st;
      driver_.run_sync(
          [&](Engine& e) { st = begin ? e.begin_weight_update() : e.end_weight_update(); });
      if (!st.ok()) return reply_error(res, 400, st.message(), http_errors_);
      res.set_content(json{{"success", true}}.dump(), "application/json");
    };
  };
  s.Post("/begin_weight_update", bracket(true));
  s.Post("/end_weight_update", bracket(false));

  s.Post("/update_weight_version", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto version = read_version(*body, "new_version", /*required=*/true);
    if (!version.ok()) return reply_error(res, 400, version.message(), http_errors_);
    // SGLang's default aborts what is in flight (its tokens would carry the old version).
    const bool abort = body->value("abort_all_requests", true) == true;
    const int64_t v = adopt_version(*version, abort);
    res.set_content(json{{"success", true},
                         {"message", "Weight version updated to " + version_label(v)},
                         {"new_version", version_label(v)}}
                        .dump(),
                    "application/json");
  });

  s.Get("/get_weight_version", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    res.set_content(json{{"weight_version", version_label(st.weight_version)}}.dump(),
                    "application/json");
  });

  s.Post("/update_weights_from_disk", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    if (!body->is_object() || !body->contains("model_path") || !(*body)["model_path"].is_string())
      return reply_error(res, 400, "update_weights_from_disk needs {\"model_path\": string}",
                         http_errors_);
    const std::string path = (*body)["model_path"].get<std::string>();
    if (Status c = confine_path(path, opt_.weight_dirs, "--weights-dir"); !c.ok())
      return reply_error(res, 403, c.message(), http_errors_);
    auto label = read_version(*body, "weight_version", /*required=*/false);
    if (!label.ok()) return reply_error(res, 400, label.message(), http_errors_);
    const Status st =
        opt_.load_checkpoint ? opt_.load_checkpoint(path) : load_checkpoint_into(driver_, path);
    if (!st.ok()) return reply_error(res, 400, st.message(), http_errors_);
    // New weights always come with a new version: the one given, or the next number.
    const int64_t v = adopt_version(*label, /*abort=*/false);
    res.set_content(
        json{{"success", true}, {"message", "weights loaded"}, {"weight_version", version_label(v)}}
            .dump(),
        "application/json");
  });
}

// What the server runs (model info, health) and its Prometheus metrics.
void HttpServer::register_info_routes() {
  httplib::Server& s = *svr_;
  auto model_info = [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    json j = {{"model_path", opt_.model_path},
              {"tokenizer_path", opt_.model_path},
              {"served_model_name", opt_.served_model_name},
              {"architectures", json::array({config_.arch_name})},
              {"preferred_sampling_params", nullptr},
              {"architecture", config_.arch_name},
              {"is_generation", true},
              {"vocab_size", config_.vocab_size},
              {"max_position_embeddings", config_.max_position_embeddings},
              {"num_moe_layers", config_.num_moe_layers()},
              {"moe_top_k", config_.moe.top_k},
              {"weight_version", version_label(st.weight_version)},
              {"has_tokenizer", tok_ != nullptr},
              {"has_chat_template", chat_ != nullptr}};
    res.set_content(j.dump(), "application/json");
  };
  s.Get("/get_model_info", model_info);
  s.Get("/model_info", model_info);

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    res.set_content("ok", "text/plain");
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    const std::string text =
        prometheus_text(st, {http_requests_.load(), http_errors_.load(), transport_});
    res.set_content(text, "text/plain; version=0.0.4");
  });
}

}  // namespace miles::rollout
