// OpenAI-compatible endpoints: /v1/models, /v1/completions and /v1/chat/completions (plain and
// streamed). Choices carry `token_ids` and `sampling_seed`, responses `prompt_token_ids` (the exact
// token record). Logprobs are the tempered, unfiltered ones SGLang's OpenAI server reports.
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "rollout/chat_render.h"
#include "rollout/http_common.h"
#include "miles/rollout/http_server.h"
#include "rollout/openai_api.h"
#include "rollout/tool_calls.h"

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

std::string piece_of(const Tokenizer* tok, int32_t id) {
  return tok ? tok->decode(std::vector<int32_t>{id}) : std::to_string(id);
}

json bytes_of(const std::string& piece) {
  json b = json::array();
  for (unsigned char c : piece) b.push_back(static_cast<int>(c));
  return b;
}

// One position of the logprobs: its token, value (null for the first prompt token) and the most
// likely tokens. Chat and completions spell them differently.
struct LogprobRow {
  int32_t id;
  float logprob;
  const std::vector<TopLogprob>* top;
  float raw_logprob;
  int64_t weight_version;
  bool generated;
};

json chat_logprobs(const Tokenizer* tok, const std::vector<LogprobRow>& rows) {
  json content = json::array();
  for (const LogprobRow& r : rows) {
    const std::string piece = piece_of(tok, r.id);
    json top = json::array();
    for (const TopLogprob& t : *r.top) {
      const std::string p = piece_of(tok, t.id);
      top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
    }
    content.push_back({{"token", piece},
                       {"logprob", r.logprob},
                       {"bytes", bytes_of(piece)},
                       {"top_logprobs", top},
                       {"token_id", r.id},
                       {"raw_logprob", r.raw_logprob},
                       {"weight_version", r.weight_version}});
  }
  return {{"content", content}};
}

json completion_logprobs(const Tokenizer* tok, const std::vector<LogprobRow>& rows, bool with_top,
                         size_t text_offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const LogprobRow& r : rows) {
    const std::string piece = piece_of(tok, r.id);
    tokens.push_back(piece);
    lps.push_back(std::isnan(r.logprob) ? json() : json(r.logprob));
    offsets.push_back(text_offset);
    text_offset += piece.size();
    if (!with_top) continue;
    if (std::isnan(r.logprob)) {
      tops.push_back(nullptr);
      continue;
    }
    json top = json::object();
    for (const TopLogprob& t : *r.top) top[piece_of(tok, t.id)] = t.logprob;
    tops.push_back(top);
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", with_top ? tops : json()},
          {"text_offset", offsets}};
}

std::vector<LogprobRow> output_rows(const std::vector<TokenOutput>& out) {
  std::vector<LogprobRow> rows;
  for (const auto& t : out)
    rows.push_back({t.id, t.tempered_logprob, &t.top, t.raw_logprob, t.weight_version, true});
  return rows;
}

std::vector<LogprobRow> input_rows(const SampleEvent& fin) {
  static const std::vector<TopLogprob> kNone;
  std::vector<LogprobRow> rows;
  for (const auto& e : fin.input_logprobs)
    rows.push_back({e.id, e.logprob, std::isnan(e.logprob) ? &kNone : &e.top, e.logprob, 0, false});
  return rows;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace

// The non-streamed response of an OpenAI call from its finished samples (choice i * n + j).
std::string HttpServer::openai_body(const OpenAiCall& call, const std::vector<SampleEvent>& finals,
                                    bool chat, const std::string& id, const std::string& model,
                                    int64_t created, const char* object, int64_t prompt_tokens) {
  const int32_t n = call.request.n;
  const int32_t total = static_cast<int32_t>(finals.size());
  json choices = json::array();
  int64_t completion_tokens = 0;
  for (int32_t i = 0; i < total; ++i) {
    const SampleEvent& f = finals[i];
    const std::vector<int32_t>& prompt = call.prompts[i / n];
    std::string text =
        openai_final_text(tok_.get(), call.request, f, f.output, call.skip_special_tokens);
    std::string prefix;
    if (call.echo && tok_) prefix = decode_text(*tok_, prompt, call.skip_special_tokens);
    json choice = {{"index", i},
                   {"finish_reason", openai_finish_reason(f.finish_reason)},
                   {"token_ids", ids_of(f.output)},
                   {"sampling_seed", f.seed}};
    json logprobs;
    if (call.logprobs) {
      std::vector<LogprobRow> rows = output_rows(f.output);
      if (call.echo) {
        std::vector<LogprobRow> in = input_rows(f);
        rows.insert(rows.begin(), in.begin(), in.end());
      }
      logprobs = chat ? chat_logprobs(tok_.get(), rows)
                      : completion_logprobs(tok_.get(), rows, call.top_logprobs > 0, 0);
    }
    choice["logprobs"] = logprobs;
    if (chat) {
      json message = assistant_message(text);
      if (call.parse_tools) {
        ParsedToolCalls parsed = parse_tool_calls(text);
        if (!parsed.calls.empty()) {
          message["content"] = parsed.content.empty() ? json() : json(parsed.content);
          message["tool_calls"] = tool_calls_json(parsed.calls, id + "_" + std::to_string(i));
          if (f.finish_reason == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
        }
      }
      choice["message"] = message;
    } else {
      choice["text"] = prefix + text;
    }
    choices.push_back(choice);
    completion_tokens += static_cast<int64_t>(f.output.size());
  }
  json body = {
      {"id", id},
      {"object", object},
      {"created", created},
      {"model", model},
      {"choices", choices},
      {"prompt_token_ids", call.prompts.size() == 1 ? json(call.prompts[0]) : json(call.prompts)},
      {"usage", usage_json(prompt_tokens, completion_tokens)}};
  return dump_json(body);
}

// Runs one OpenAI call (completion or chat; a batched completion submits each prompt) to the end
// or as an SSE stream. Choice i * n + j is sample j of prompt i.
void HttpServer::serve_openai(OpenAiCall call, bool chat, httplib::Response& res) {
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_rid_++);
  const std::string model = call.model.empty() ? opt_.served_model_name : call.model;
  const int64_t created = now_seconds();
  if (call.prompts.empty()) call.prompts.push_back(call.request.input_ids);
  const int32_t n = call.request.n;
  {
    std::vector<GenerateRequest> all(call.prompts.size(), call.request);
    std::vector<const GenerateRequest*> ptrs;
    for (size_t p = 0; p < all.size(); ++p) {
      all[p].input_ids = call.prompts[p];
      ptrs.push_back(&all[p]);
    }
    if (!admit(ptrs, res)) return;
  }
  auto stream = std::make_shared<RequestStream>();
  std::vector<uint64_t> engine_ids;
  int64_t prompt_tokens = 0;
  for (const auto& prompt : call.prompts) {
    GenerateRequest r = call.request;
    r.input_ids = prompt;
    prompt_tokens += static_cast<int64_t>(prompt.size());
    auto eid = driver_.submit(std::move(r), stream);
    if (!eid.ok()) {
      for (uint64_t e : engine_ids) driver_.call<bool>([e](Engine& en) { return en.abort(e); });
      return reply_error(res, 400, eid.message(), http_errors_);
    }
    engine_ids.push_back(*eid);
  }
  auto choice_of = [engine_ids, n](const SampleEvent& ev) {
    for (size_t p = 0; p < engine_ids.size(); ++p)
      if (engine_ids[p] == ev.request_id) return static_cast<int32_t>(p) * n + ev.sample_index;
    return ev.sample_index;
  };
  const int32_t total = static_cast<int32_t>(engine_ids.size()) * n;
  const char* object = chat ? "chat.completion" : "text_completion";
  auto abort_all_jobs = [this, engine_ids] {
    for (uint64_t e : engine_ids) driver_.call<bool>([e](Engine& en) { return en.abort(e); });
  };
  if (!call.stream) {
    // The body at the end, a space every second before it (see serve_generate): a client that
    // has gone is noticed and its requests aborted.
    auto finals = std::make_shared<std::vector<SampleEvent>>(total);
    auto done = std::make_shared<int32_t>(0);
    auto shared = std::make_shared<OpenAiCall>(std::move(call));
    res.set_chunked_content_provider(
        "application/json",
        [this, finals, done, shared, stream, choice_of, total, chat, id, model, created, object,
         prompt_tokens, abort_all_jobs](size_t, httplib::DataSink& sink) {
          const auto beat = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          while (*done < total && std::chrono::steady_clock::now() < beat) {
            SampleEvent ev;
            if (!stream->next(ev, 200) || !ev.finished) continue;
            const int32_t i = choice_of(ev);
            (*finals)[i] = std::move(ev);
            ++*done;
          }
          if (*done < total) {
            if (sink.write(" ", 1)) return true;
            abort_all_jobs();
            return false;
          }
          const std::string body =
              openai_body(*shared, *finals, chat, id, model, created, object, prompt_tokens);
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        });
    return;
  }
  struct StreamState {
    std::vector<std::vector<TokenOutput>> outs;
    std::vector<size_t> sent;  // bytes of text already sent per choice
    int32_t finished = 0;
    int64_t completion_tokens = 0;
    bool header_sent = false;
    bool usage_sent = false;
  };
  auto st = std::make_shared<StreamState>();
  st->outs.resize(total);
  st->sent.assign(total, 0);
  auto shared_call = std::make_shared<OpenAiCall>(std::move(call));
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, stream, shared_call, chat, id, created, model, total, object, choice_of,
       abort_all_jobs, prompt_tokens](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& chunk) {
          const std::string line = "data: " + dump_json(chunk) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto base = [&] {
          return json{{"id", id},
                      {"object", chat ? "chat.completion.chunk" : object},
                      {"created", created},
                      {"model", model}};
        };
        if (!st->header_sent && chat) {
          st->header_sent = true;
          for (int32_t i = 0; i < total; ++i) {
            json c = base();
            c["choices"] = json::array({{{"index", i},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"finish_reason", nullptr}}});
            c["prompt_token_ids"] = shared_call->prompts[i / shared_call->request.n];
            if (!send(c)) return false;
          }
          return true;
        }
        if (st->finished == total) {
          if (shared_call->include_usage && !st->usage_sent) {
            st->usage_sent = true;
            json c = base();
            c["choices"] = json::array();
            c["usage"] = usage_json(prompt_tokens, st->completion_tokens);
            if (!send(c)) return false;
          }
          sink.write("data: [DONE]\n\n", 14);
          sink.done();
          return true;
        }
        SampleEvent ev;
        if (!stream->next(ev, 200)) {
          if (!sink.is_writable()) {
            abort_all_jobs();
            return false;
          }
          return true;
        }
        const int32_t index = choice_of(ev);
        auto& out = st->outs[index];
        out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
        std::string text;
        if (ev.finished) {
          text = openai_final_text(tok_.get(), shared_call->request, ev, out,
                                   shared_call->skip_special_tokens);
        } else if (tok_) {
          text = decode_text(*tok_, ids_of(out), shared_call->skip_special_tokens);
          text.resize(utf8_complete_prefix(text));
          // Hold back what could still become a stop string.
          for (const auto& s : shared_call->request.stop_strings)
            text.resize(text.size() > s.size() ? text.size() - s.size() + 1 : 0);
        }
        // With tools, text from a <tool_call> on is held back and sent as tool_calls at the end.
        std::vector<ToolCall> calls;
        if (chat && shared_call->parse_tools) {
          if (ev.finished) {
            ParsedToolCalls parsed = parse_tool_calls(text);
            calls = std::move(parsed.calls);
            if (!calls.empty()) text.resize(tool_call_free_prefix(text));
          } else {
            text.resize(tool_call_free_prefix(text));
          }
        }
        std::string delta = text.size() > st->sent[index] ? text.substr(st->sent[index]) : "";
        st->sent[index] = std::max(st->sent[index], text.size());
        std::vector<int32_t> new_ids;
        for (const auto& t : ev.new_tokens) new_ids.push_back(t.id);
        json choice = {
            {"index", index},
            {"token_ids", new_ids},
            {"finish_reason", ev.finished ? json(openai_finish_reason(ev.finish_reason)) : json()}};
        if (ev.finished) choice["sampling_seed"] = ev.seed;
        if (chat) choice["delta"] = delta.empty() ? json::object() : json{{"content", delta}};
        if (!calls.empty()) {
          choice["delta"]["tool_calls"] = tool_calls_json(calls, id + "_" + std::to_string(index));
          if (ev.finish_reason == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
        } else
          choice["text"] = delta;
        if (shared_call->logprobs) {
          const std::vector<LogprobRow> rows = output_rows(ev.new_tokens);
          choice["logprobs"] =
              chat ? chat_logprobs(tok_.get(), rows)
                   : completion_logprobs(tok_.get(), rows, shared_call->top_logprobs > 0, 0);
        }
        json c = base();
        c["choices"] = json::array({choice});
        if (ev.finished) {
          ++st->finished;
          st->completion_tokens += static_cast<int64_t>(out.size());
        }
        if (!send(c)) {
          abort_all_jobs();
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
                                     {"created", 0},
                                     {"owned_by", "miles"},
                                     {"root", opt_.served_model_name},
                                     {"max_model_len", config_.max_position_embeddings}}})}};
    res.set_content(j.dump(), "application/json");
  });

  // As SGLang: any model name is served by this model and echoed; "base:adapter" names a LoRA
  // adapter, which miles does not serve (SGLang without LoRA answers 400 the same way).
  auto unknown_model = [this](const OpenAiCall& call, httplib::Response& res) {
    if (call.model.find(':') == std::string::npos || call.model == opt_.served_model_name)
      return false;
    reply_error(res, 400,
                "LoRA adapter '" + call.model.substr(call.model.find(':') + 1) +
                    "' was requested, but miles serves no LoRA adapters",
                http_errors_);
    return true;
  };

  svr_->Post("/v1/completions",
             [this, unknown_model](const httplib::Request& req, httplib::Response& res) {
               ++http_requests_;
               auto body = parse_json_body(req.body);
               if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
               auto call = parse_completion(*body, tok_.get());
               if (!call.ok()) return reply_error(res, 400, call.message(), http_errors_);
               if (unknown_model(*call, res)) return;
               if (call->echo && call->stream)
                 return reply_error(res, 400, "echo with stream is not supported", http_errors_);
               serve_openai(std::move(call).value(), /*chat=*/false, res);
             });

  svr_->Post("/v1/chat/completions", [this, unknown_model](const httplib::Request& req,
                                                           httplib::Response& res) {
    ++http_requests_;
    auto body = parse_json_body(req.body);
    if (!body.ok()) return reply_error(res, 400, body.message(), http_errors_);
    auto call = parse_chat(*body);
    if (!call.ok()) return reply_error(res, 400, call.message(), http_errors_);
    if (unknown_model(*call, res)) return;
    if (!chat_ || !tok_)
      return reply_error(res, 400,
                         "this model has no chat template and tokenizer; use /v1/completions",
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
    call->prompts = {call->request.input_ids};
    serve_openai(std::move(call).value(), /*chat=*/true, res);
  });
}

}  // namespace miles::rollout
