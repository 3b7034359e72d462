// TITO sessions over HTTP: POST /sessions, POST /sessions/{id}/v1/chat/completions,
// GET /sessions/{id}/trajectory, DELETE /sessions/{id} (the rules are in sessions.h).
//
// Why: an agent harness points its OpenAI client at /sessions/{id}/v1 and runs unchanged; the
// session keeps the exact token record, and the trainer fetches it as one sample at the end.
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "miles/chat_template.h"
#include "rollout/chat_render.h"
#include "rollout/http_common.h"
#include "miles/rollout/http_server.h"
#include "rollout/openai_api.h"
#include "miles/rollout/sessions.h"

namespace miles::rollout {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr const char* kId = "([A-Za-z0-9._-]+)";

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The chat.completion body of one turn, with the token-level record of it under "miles".
json completion_json(const std::string& id, const std::string& model, const TurnPlan& plan,
                     const SampleEvent& fin, const json& reply, const std::string& session_id) {
  std::vector<int32_t> ids;
  std::vector<float> lps, raw;
  std::vector<int64_t> versions;
  for (const TokenOutput& t : fin.output) {
    ids.push_back(t.id);
    lps.push_back(t.logprob);
    raw.push_back(t.raw_logprob);
    versions.push_back(t.weight_version);
  }
  const int64_t prompt = static_cast<int64_t>(plan.input_ids.size());
  const int64_t completion = static_cast<int64_t>(ids.size());
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", now_seconds()},
          {"model", model},
          {"choices", json::array({{{"index", 0},
                                    {"message", reply},
                                    {"finish_reason", openai_finish_reason(fin.finish_reason)}}})},
          {"usage",
           {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}}},
          {"miles",
           {{"session_id", session_id},
            {"retry", plan.retry},
            {"kept_tokens", plan.keep_tokens},
            {"prompt_ids", plan.appended},
            {"output_ids", ids},
            {"logprobs", lps},
            {"raw_logprobs", raw},
            {"weight_versions", versions},
            {"cached_tokens", fin.cached_tokens}}}};
}

}  // namespace

void HttpServer::register_session_routes() {
  const int64_t experts_per_token = config_.num_moe_layers() * config_.moe.top_k;
  const int64_t moe_layers = config_.num_moe_layers();

  svr_->Post("/sessions", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    if (body->is_null()) *body = json::object();
    if (!body->is_object())
      return reply_error(res, 400, "body must be a JSON object", http_errors_);
    std::string id;
    for (auto it = body->begin(); it != body->end(); ++it) {
      if (it.key() != "session_id")
        return reply_error(res, 400, "unknown field '" + it.key() + "'", http_errors_);
      if (!it->is_null() && !it->is_string())
        return reply_error(res, 400, "session_id must be a string", http_errors_);
      if (it->is_string()) id = it->get<std::string>();
    }
    if (!id.empty() && sessions_->get(id))
      return reply_error(res, 409, "session '" + id + "' exists", http_errors_);
    auto created = sessions_->create(id);
    if (!created.ok()) return reply_error(res, 400, created.message(), http_errors_);
    res.set_content(json{{"session_id", *created}}.dump(), "application/json");
  });

  svr_->Post(
      std::string("/sessions/") + kId + "/v1/chat/completions",
      [this, experts_per_token](const httplib::Request& req, httplib::Response& res) {
        ++http_requests_;
        const std::string sid = req.matches[1];
        std::shared_ptr<Session> session = sessions_->get(sid);
        if (!session) return reply_error(res, 404, "no session '" + sid + "'", http_errors_);
        auto body = parse_json_body(req.body);
        if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
        auto call = parse_chat(*body);
        if (!call.ok()) return reply_error(res, 400, call.message(), http_errors_);
        if (call->stream)
          return reply_error(res, 400, "sessions do not stream (send stream: false)", http_errors_);
        if (call->request.n != 1)
          return reply_error(res, 400, "sessions sample one reply per call (n = 1)", http_errors_);
        if (!chat_ || !tok_)
          return reply_error(res, 400, "this model has no chat template and tokenizer",
                             http_errors_);
        // Re-read in the client's key order (tool schemas render as Python would).
        const auto ordered = ordered_json::parse(req.body);
        const auto pick = [&](const char* k) {
          return ordered.contains(k) && !ordered[k].is_null() ? ordered[k] : ordered_json();
        };
        RenderOptions options;
        options.tools = pick("tools");
        if (!pick("chat_template_kwargs").is_null()) options.kwargs = pick("chat_template_kwargs");
        std::lock_guard<std::mutex> lock(session->mu);
        auto plan = plan_turn(*session, ordered["messages"], *chat_, *tok_, options);
        if (!plan.ok()) return reply_error(res, 400, plan.message(), http_errors_);
        call->request.input_ids = plan->input_ids;
        auto stream = std::make_shared<RequestStream>();
        auto engine_id = driver_.submit(call->request, stream);
        if (!engine_id.ok()) return reply_error(res, 400, engine_id.message(), http_errors_);
        const SampleEvent fin = stream->wait_finished(1)[0];
        const json reply = assistant_message(
            openai_final_text(tok_.get(), call->request, fin, fin.output, /*skip_special=*/false));
        const json out = completion_json("chatcmpl-" + std::to_string(next_rid_++),
                                         opt_.served_model_name, *plan, fin, reply, sid);
        commit_turn(*session, std::move(plan).value(), fin, reply, experts_per_token);
        res.set_content(dump_json(out), "application/json");
      });

  svr_->Get(
      std::string("/sessions/") + kId + "/trajectory",
      [this, experts_per_token, moe_layers](const httplib::Request& req, httplib::Response& res) {
        ++http_requests_;
        const std::string sid = req.matches[1];
        std::shared_ptr<Session> session = sessions_->get(sid);
        if (!session) return reply_error(res, 404, "no session '" + sid + "'", http_errors_);
        std::lock_guard<std::mutex> lock(session->mu);
        res.set_content(dump_json(trajectory_json(*session, experts_per_token, moe_layers)),
                        "application/json");
      });

  svr_->Delete(std::string("/sessions/") + kId,
               [this](const httplib::Request& req, httplib::Response& res) {
                 ++http_requests_;
                 const std::string sid = req.matches[1];
                 if (!sessions_->erase(sid))
                   return reply_error(res, 404, "no session '" + sid + "'", http_errors_);
                 res.set_content(json{{"success", true}}.dump(), "application/json");
               });
}

}  // namespace miles::rollout
