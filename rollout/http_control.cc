// Control endpoints: the weight-update lifecycle (pause, continue, flush, load weights, version), model
// info, health and Prometheus metrics.
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "miles/model.h"
#include "rollout/http_common.h"
#include "rollout/http_server.h"

namespace miles::rollout {

using nlohmann::json;

void HttpServer::register_control_routes() {
  httplib::Server& s = *svr_;

  s.Post("/pause_generation", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    std::string mode = "abort";
    if (body->is_object() && body->contains("mode")) {
      if (!(*body)["mode"].is_string())
        return reply_error(res, 400, "mode must be \"retract\", \"in_place\" or \"abort\"", http_errors_);
      mode = (*body)["mode"].get<std::string>();
    }
    PauseMode m;
    if (mode == "retract") m = PauseMode::kRetract;
    else if (mode == "in_place") m = PauseMode::kInPlace;
    else if (mode == "abort") m = PauseMode::kAbort;
    else return reply_error(res, 400, "mode '" + mode + "': expected retract, in_place or abort", http_errors_);
    driver_.run_sync([m](Engine& e) { e.pause(m); });
    res.set_content(json{{"success", true}, {"mode", mode}}.dump(), "application/json");
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
      driver_.run_sync([&](Engine& e) { st = begin ? e.begin_weight_update() : e.end_weight_update(); });
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
    if (!body->is_object() || !body->contains("new_version") || !(*body)["new_version"].is_number_integer())
      return reply_error(res, 400, "update_weight_version needs {\"new_version\": integer}", http_errors_);
    const int64_t v = (*body)["new_version"].get<int64_t>();
    driver_.run_sync([v](Engine& e) { e.update_weight_version(v); });
    res.set_content(json{{"success", true}, {"weight_version", v}}.dump(), "application/json");
  });

  s.Post("/update_weights_from_disk", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    if (!body->is_object() || !body->contains("model_path") || !(*body)["model_path"].is_string())
      return reply_error(res, 400, "update_weights_from_disk needs {\"model_path\": string}", http_errors_);
    auto files = load_model_files((*body)["model_path"].get<std::string>());
    if (!files.ok()) return reply_error(res, 400, files.message(), http_errors_);
    Status st;
    int64_t version = -1;
    if (body->contains("weight_version") && (*body)["weight_version"].is_number_integer())
      version = (*body)["weight_version"].get<int64_t>();
    driver_.run_sync([&](Engine& e) {
      st = e.update_weights(files->weights);
      if (st.ok() && version >= 0) e.update_weight_version(version);
    });
    if (!st.ok()) return reply_error(res, 400, st.message(), http_errors_);
    res.set_content(json{{"success", true}, {"message", "weights loaded"}}.dump(), "application/json");
  });

  s.Get("/get_model_info", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    json j = {{"model_path", opt_.model_path},
              {"served_model_name", opt_.served_model_name},
              {"architecture", config_.arch_name},
              {"is_generation", true},
              {"vocab_size", config_.vocab_size},
              {"max_position_embeddings", config_.max_position_embeddings},
              {"num_moe_layers", config_.num_moe_layers()},
              {"moe_top_k", config_.moe.top_k},
              {"weight_version", st.weight_version},
              {"has_tokenizer", tok_ != nullptr},
              {"has_chat_template", chat_ != nullptr}};
    res.set_content(j.dump(), "application/json");
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    res.set_content("ok", "text/plain");
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    std::ostringstream o;
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        << name << " " << v << "\n";
    };
    metric("miles_kv_free_blocks", "gauge", "KV cache blocks not in use", st.free_blocks);
    metric("miles_kv_total_blocks", "gauge", "KV cache blocks in the pool", st.total_blocks);
    metric("miles_prefix_cache_blocks", "gauge", "blocks held by the radix prefix cache", st.cached_blocks);
    metric("miles_requests_running", "gauge", "samples decoding", st.running);
    metric("miles_requests_waiting", "gauge", "samples waiting for prefill", st.waiting);
    metric("miles_weight_version", "gauge", "weight version of new tokens", st.weight_version);
    metric("miles_paused", "gauge", "1 while generation is paused", st.paused ? 1 : 0);
    metric("miles_iterations_total", "counter", "engine iterations", st.iterations);
    metric("miles_generated_tokens_total", "counter", "tokens generated", st.generated_tokens);
    metric("miles_prompt_tokens_total", "counter", "prompt tokens prefilled", st.prompt_tokens);
    metric("miles_cached_prompt_tokens_total", "counter", "prompt tokens served from the prefix cache",
           st.cached_prompt_tokens);
    metric("miles_retractions_total", "counter", "samples retracted to be recomputed", st.retractions);
    metric("miles_http_requests_total", "counter", "HTTP requests handled", http_requests_.load());
    metric("miles_http_errors_total", "counter", "HTTP requests answered with an error", http_errors_.load());
    res.set_content(o.str(), "text/plain; version=0.0.4");
  });
}

}  // namespace miles::rollout
