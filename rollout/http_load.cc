// Load, liveness and memory endpoints, in SGLang's shapes: /health_generate (one real decode step),
// /get_server_info, /get_load and /v1/loads (what routers balance on), and
// /release_memory_occupation + /resume_memory_occupation (the KV cache's memory, and the weights').
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "miles/rollout/http_server.h"
#include "rollout/http_common.h"
#include "rollout/openai_api.h"

namespace miles::rollout {

using nlohmann::json;

namespace {

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One data-parallel rank's load (miles engines are one rank each), the fields SGLang reports.
json load_json(const EngineStats& st, int64_t block_tokens) {
  const int64_t used = st.total_blocks - st.free_blocks;
  return {{"dp_rank", 0},
          {"num_reqs", st.running + st.waiting},
          {"num_running_reqs", st.running},
          {"num_waiting_reqs", st.waiting},
          {"num_tokens", used * block_tokens},
          {"num_used_tokens", used * block_tokens},
          {"max_total_num_tokens", st.total_blocks * block_tokens},
          {"token_usage", st.total_blocks > 0 ? static_cast<double>(used) / st.total_blocks : 0.0}};
}

// The memory tags of a release / resume body: SGLang's "kv_cache" and "weights" (all when absent).
Result<std::vector<std::string>> memory_tags(const json& body) {
  std::vector<std::string> tags = {"kv_cache", "weights"};
  if (!body.is_object() || !body.contains("tags") || body["tags"].is_null()) return tags;
  if (!body["tags"].is_array())
    return Status::Error("tags must be a list of \"kv_cache\" / \"weights\"");
  tags.clear();
  for (const auto& t : body["tags"]) {
    if (!t.is_string() || (t != "kv_cache" && t != "weights" && t != "cuda_graph"))
      return Status::Error("tags: " + t.dump() +
                           " is not one of \"kv_cache\", \"weights\", \"cuda_graph\"");
    tags.push_back(t.get<std::string>());
  }
  return tags;
}

}  // namespace

void HttpServer::register_load_routes() {
  httplib::Server& s = *svr_;
  const int64_t block_tokens = opt_.block_tokens;

  // A one-token generation through the scheduler: 200 when the engine produced it, 503 when it
  // could not (paused, released memory, or no token within the timeout).
  s.Get("/health_generate", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    GenerateRequest r;
    r.input_ids = {tok_ && tok_->bos_id() >= 0 ? tok_->bos_id() : 0};
    r.max_new_tokens = 1;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    auto stream = std::make_shared<RequestStream>();
    auto id = driver_.submit(r, stream);
    if (!id.ok()) return reply_error(res, 503, "health_generate: " + id.message(), http_errors_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    SampleEvent ev;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!stream->next(ev, 200) || !ev.finished) continue;
      if (ev.finish_reason == FinishReason::kAbort || ev.output.empty())
        return reply_error(res, 503, "health_generate: the request was aborted", http_errors_);
      res.set_content("", "text/plain");
      return;
    }
    const uint64_t engine_id = *id;
    driver_.call<bool>([engine_id](Engine& e) { return e.abort(engine_id); });
    reply_error(res, 503, "health_generate: no token within 20 s (paused?)", http_errors_);
  });

  s.Get("/get_load", [this, block_tokens](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    res.set_content(json::array({load_json(st, block_tokens)}).dump(), "application/json");
  });

  s.Get("/v1/loads", [this, block_tokens](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    res.set_content(
        json{{"timestamp", unix_seconds()}, {"loads", json::array({load_json(st, block_tokens)})}}
            .dump(),
        "application/json");
  });

  auto server_info = [this, block_tokens](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    const EngineStats st = driver_.call<EngineStats>([](Engine& e) { return e.stats(); });
    json j = {{"model_path", opt_.model_path},
              {"tokenizer_path", opt_.model_path},
              {"served_model_name", opt_.served_model_name},
              {"host", opt_.host},
              {"port", port_},
              {"tp_size", opt_.tp_size},
              {"dp_size", 1},
              {"pp_size", 1},
              {"page_size", block_tokens},
              {"max_total_num_tokens", st.total_blocks * block_tokens},
              {"context_length", config_.max_position_embeddings},
              {"random_seed", opt_.random_seed ? json(*opt_.random_seed) : json()},
              {"weight_version", version_label(st.weight_version)},
              {"version", opt_.version},
              {"status", st.paused ? "paused" : "ready"},
              {"internal_states", json::array({load_json(st, block_tokens)})}};
    res.set_content(j.dump(), "application/json");
  };
  s.Get("/get_server_info", server_info);
  s.Get("/server_info", server_info);
}

void HttpServer::register_memory_routes() {
  httplib::Server& s = *svr_;

  s.Post("/release_memory_occupation", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto tags = memory_tags(*body);
    if (!tags.ok()) return reply_error(res, 400, tags.message(), http_errors_);
    const auto has = [&](const char* t) {
      return std::find(tags->begin(), tags->end(), t) != tags->end();
    };
    Status st;
    std::string released;
    driver_.run_sync([&](Engine& e) {
      if (has("weights")) st = e.release_weights();
      if (st.ok() && has("weights")) released = "weights";
      if (st.ok() && has("kv_cache")) st = e.release_kv_memory();
      if (st.ok() && has("kv_cache")) released += released.empty() ? "kv_cache" : " and kv_cache";
    });
    if (!st.ok()) {
      const bool busy = st.message().find("in flight") != std::string::npos;
      return reply_error(res, busy ? 409 : 400, st.message(), http_errors_);
    }
    res.set_content(json{{"success", true}, {"message", released + " released"}}.dump(),
                    "application/json");
  });

  s.Post("/resume_memory_occupation", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto tags = memory_tags(*body);
    if (!tags.ok()) return reply_error(res, 400, tags.message(), http_errors_);
    const bool kv = std::find(tags->begin(), tags->end(), "kv_cache") != tags->end();
    bool weights_out = false;
    driver_.run_sync([&](Engine& e) {
      if (kv) e.resume_kv_memory();
      weights_out = e.stats().weights_released;
    });
    // Released weights are not kept (SGLang without a CPU backup): the next update brings them.
    std::string message = kv ? "kv_cache resumed" : "nothing to resume";
    if (weights_out)
      message +=
          "; the weights stay released until a weight update (update_weights_from_disk, "
          "_from_disk_delta, _from_group) loads them";
    res.set_content(json{{"success", true}, {"message", message}}.dump(), "application/json");
  });

  // SGLang's torch.distributed weight groups (NCCL) cannot meet a Gloo group of miles; the
  // equivalent routes are named in the error.
  for (const char* route : {"/init_weights_update_group", "/update_weights_from_distributed",
                            "/update_weights_from_tensor", "/destroy_weights_update_group"}) {
    s.Post(route, [this, route](const httplib::Request&, httplib::Response& res) {
      ++http_requests_;
      reply_error(
          res, 400,
          std::string(route) +
              " is not supported by miles: its weight groups are Gloo groups formed by "
              "POST /join_weight_group and filled by POST /update_weights_from_group (or "
              "/update_weights_from_disk_delta, /update_weights_from_disk); see docs/api.md",
          http_errors_);
    });
  }
}

}  // namespace miles::rollout
