// OpenAI-compatible endpoints: /v1/models, /v1/completions and /v1/chat/completions (plain and
// streamed). Choices carry `token_ids`, responses `prompt_token_ids` (the exact token record).
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "rollout/chat_render.h"
#include "rollout/http_common.h"
#include "rollout/http_server.h"
#include "rollout/openai_api.h"

namespace miles::rollout {

using nlohmann::json;

namespace {

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<int32_t> ids_of(const std::vector<TokenOutput>& out) {
  std::vector<int32_t> ids;
  for (const auto& t : out) ids.push_back(t.id);
  return ids;
}

json logprobs_json(const Tokenizer* tok, const std::vector<TokenOutput>& out, bool chat) {
  json content = json::array();
  json tokens = json::array(), lps = json::array();
  for (const auto& t : out) {
    const std::string piece = tok ? tok->decode(std::vector<int32_t>{t.id}) : std::to_string(t.id);
    if (chat) {
      content.push_back({{"token", piece}, {"logprob", t.logprob}, {"raw_logprob", t.raw_logprob},
                         {"token_id", t.id}, {"weight_version", t.weight_version},
                         {"top_logprobs", json::array()}});
    } else {
      tokens.push_back(piece);
      lps.push_back(t.logprob);
    }
  }
  if (chat) return {{"content", content}};
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", nullptr}};
}

}  // namespace

// Runs one OpenAI call (completion or chat) to the end or as an SSE stream.
void HttpServer::serve_openai(OpenAiCall call, bool chat, httplib::Response& res) {
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_rid_++);
  const std::string model = opt_.served_model_name;
  const int64_t created = now_seconds();
  const std::vector<int32_t> prompt_ids = call.request.input_ids;
  const int32_t n = call.request.n;
  auto stream = std::make_shared<RequestStream>();
  auto engine_id = driver_.submit(call.request, stream);
  if (!engine_id.ok()) return reply_error(res, 400, engine_id.message(), http_errors_);
  const char* object = chat ? "chat.completion" : "text_completion";
  if (!call.stream) {
    const std::vector<SampleEvent> finals = stream->wait_finished(n);
    json choices = json::array();
    int64_t completion_tokens = 0;
    for (int32_t i = 0; i < n; ++i) {
      const std::string text =
          openai_final_text(tok_.get(), call.request, finals[i], finals[i].output);
      json choice = {{"index", i},
                     {"finish_reason", openai_finish_reason(finals[i].finish_reason)},
                     {"token_ids", ids_of(finals[i].output)},
                     {"logprobs", call.logprobs ? logprobs_json(tok_.get(), finals[i].output, chat) : json()}};
      if (chat) choice["message"] = assistant_message(text);
      else choice["text"] = text;
      choices.push_back(choice);
      completion_tokens += static_cast<int64_t>(finals[i].output.size());
    }
    json body = {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                 {"choices", choices}, {"prompt_token_ids", prompt_ids},
                 {"usage", {{"prompt_tokens", prompt_ids.size()},
                            {"completion_tokens", completion_tokens},
                            {"total_tokens", static_cast<int64_t>(prompt_ids.size()) + completion_tokens}}}};
    res.set_content(dump_json(body), "application/json");
    return;
  }
  struct StreamState {
    std::vector<std::vector<TokenOutput>> outs;
    std::vector<size_t> sent;  // bytes of text already sent per choice
    int32_t finished = 0;
    bool header_sent = false;
  };
  auto st = std::make_shared<StreamState>();
  st->outs.resize(n);
  st->sent.assign(n, 0);
  const uint64_t eid = *engine_id;
  auto shared_call = std::make_shared<OpenAiCall>(std::move(call));
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, stream, shared_call, chat, id, created, model, n, eid, object,
       prompt_ids](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& chunk) {
          const std::string line = "data: " + dump_json(chunk) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto base = [&] {
          return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : object},
                      {"created", created}, {"model", model}};
        };
        if (!st->header_sent && chat) {
          st->header_sent = true;
          for (int32_t i = 0; i < n; ++i) {
            json c = base();
            c["choices"] = json::array({{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"finish_reason", nullptr}}});
            c["prompt_token_ids"] = prompt_ids;
            if (!send(c)) return false;
          }
          return true;
        }
        if (st->finished == n) {
          sink.write("data: [DONE]\n\n", 14);
          sink.done();
          return true;
        }
        SampleEvent ev;
        if (!stream->next(ev, 200)) {
          if (!sink.is_writable()) {
            driver_.call<bool>([eid](Engine& e) { return e.abort(eid); });
            return false;
          }
          return true;
        }
        auto& out = st->outs[ev.sample_index];
        out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
        std::string text;
        if (ev.finished) {
          text = openai_final_text(tok_.get(), shared_call->request, ev, out);
        } else if (tok_) {
          text = tok_->decode(ids_of(out));
          text.resize(utf8_complete_prefix(text));
          // Hold back what could still become a stop string.
          for (const auto& s : shared_call->request.stop_strings)
            text.resize(text.size() > s.size() ? text.size() - s.size() + 1 : 0);
        }
        std::string delta = text.size() > st->sent[ev.sample_index] ? text.substr(st->sent[ev.sample_index]) : "";
        st->sent[ev.sample_index] = std::max(st->sent[ev.sample_index], text.size());
        std::vector<int32_t> new_ids;
        for (const auto& t : ev.new_tokens) new_ids.push_back(t.id);
        json choice = {{"index", ev.sample_index}, {"token_ids", new_ids},
                       {"finish_reason", ev.finished ? json(openai_finish_reason(ev.finish_reason)) : json()}};
        if (chat) choice["delta"] = delta.empty() ? json::object() : json{{"content", delta}};
        else choice["text"] = delta;
        if (shared_call->logprobs) choice["logprobs"] = logprobs_json(tok_.get(), ev.new_tokens, chat);
        json c = base();
        c["choices"] = json::array({choice});
        if (ev.finished) ++st->finished;
        if (!send(c)) {
          driver_.call<bool>([eid](Engine& e) { return e.abort(eid); });
          return false;
        }
        return true;
      });
}

void HttpServer::register_openai_routes() {
  svr_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ++http_requests_;
    json j = {{"object", "list"},
              {"data", json::array({{{"id", opt_.served_model_name},
                                     {"object", "model"},
                                     {"owned_by", "miles"}}})}};
    res.set_content(j.dump(), "application/json");
  });

  svr_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto call = parse_completion(*body, tok_.get());
    if (!call.ok()) return reply_error(res, 400, call.message(), http_errors_);
    serve_openai(std::move(call).value(), /*chat=*/false, res);
  });

  svr_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto call = parse_chat(*body);
    if (!call.ok()) return reply_error(res, 400, call.message(), http_errors_);
    if (!chat_ || !tok_)
      return reply_error(res, 400, "this model has no chat template and tokenizer; use /v1/completions",
                         http_errors_);
    // Re-read in the client's key order (tool schemas render as Python would).
    const auto ordered = nlohmann::ordered_json::parse(req.body);
    const auto pick = [&](const char* k) {
      return ordered.contains(k) && !ordered[k].is_null() ? ordered[k] : nlohmann::ordered_json();
    };
    nlohmann::ordered_json kwargs = pick("chat_template_kwargs");
    if (kwargs.is_null()) kwargs = nlohmann::ordered_json::object();
    auto ids = render_chat_prompt(*chat_, *tok_, ordered["messages"], pick("tools"), kwargs);
    if (!ids.ok()) return reply_error(res, 400, ids.message(), http_errors_);
    call->request.input_ids = std::move(ids).value();
    serve_openai(std::move(call).value(), /*chat=*/true, res);
  });
}

}  // namespace miles::rollout
