// OpenAI-compatible endpoints: /v1/models, /v1/completions and /v1/chat/completions (plain and
// streamed). Choices carry `token_ids` and `sampling_seed`, responses `prompt_token_ids` (the exact
// token record). Logprobs are the tempered, unfiltered ones SGLang's OpenAI server reports.
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "miles/rollout/http_server.h"
#include "rollout/chat_render.h"
#include "rollout/http_common.h"
#include "rollout/http_reply.h"
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

// What every body and chunk of one OpenAI call names, and what they are built from.
struct OpenAiReply {
  std::shared_ptr<const OpenAiCall> call;
  std::shared_ptr<const SubmittedPrompts> sub;
  std::shared_ptr<const Tokenizer> tok;  // may be null (completions of token ids)
  std::string id, model;
  int64_t created = 0;
  bool chat = false;
  int64_t prompt_tokens = 0;
  const char* object() const { return chat ? "chat.completion" : "text_completion"; }
  const std::vector<int32_t>& prompt_of(int32_t choice) const {
    return call->prompts[choice / call->request.n];
  }
  json logprobs(const std::vector<LogprobRow>& rows) const {
    return chat ? chat_logprobs(tok.get(), rows)
                : completion_logprobs(tok.get(), rows, call->top_logprobs > 0, 0);
  }
  json chunk(json choices) const {
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : object()},
            {"created", created},
            {"model", model},
            {"choices", std::move(choices)}};
  }
};

// Choice i of the non-streamed response, from its sample's final event.
json whole_choice(const OpenAiReply& r, const SampleEvent& f, int32_t i) {
  const OpenAiCall& call = *r.call;
  const std::string text =
      openai_final_text(r.tok.get(), call.request, f, f.output, call.skip_special_tokens);
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
    logprobs = r.logprobs(rows);
  }
  choice["logprobs"] = logprobs;
  if (!r.chat) {
    std::string prefix;
    if (call.echo && r.tok) prefix = decode_text(*r.tok, r.prompt_of(i), call.skip_special_tokens);
    choice["text"] = prefix + text;
    return choice;
  }
  json message = assistant_message(text);
  if (call.parse_tools) {
    ParsedToolCalls parsed = parse_tool_calls(text);
    if (!parsed.calls.empty()) {
      message["content"] = parsed.content.empty() ? json() : json(parsed.content);
      message["tool_calls"] = tool_calls_json(parsed.calls, r.id + "_" + std::to_string(i));
      if (f.finish_reason == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
    }
  }
  choice["message"] = message;
  return choice;
}

// The non-streamed response from every choice's final event (choice i * n + j).
std::string whole_body(const OpenAiReply& r, const std::vector<SampleEvent>& finals) {
  json choices = json::array();
  int64_t completion_tokens = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(finals.size()); ++i) {
    choices.push_back(whole_choice(r, finals[i], i));
    completion_tokens += static_cast<int64_t>(finals[i].output.size());
  }
  const auto& prompts = r.call->prompts;
  json body = {{"id", r.id},
               {"object", r.object()},
               {"created", r.created},
               {"model", r.model},
               {"choices", choices},
               {"prompt_token_ids", prompts.size() == 1 ? json(prompts[0]) : json(prompts)},
               {"usage", usage_json(r.prompt_tokens, completion_tokens)}};
  return dump_json(body);
}

void reply_whole(httplib::Response& res, ReplySamples samples, const OpenAiReply& r) {
  auto finals = std::make_shared<std::vector<SampleEvent>>(r.sub->total);
  reply_at_end(
      res, std::move(samples),
      [r, finals](SampleEvent& ev) { (*finals)[r.sub->index_of(ev)] = std::move(ev); },
      [r, finals] { return whole_body(r, *finals); });
}

// A streamed choice's output so far and the bytes of its text already sent.
struct StreamedChoices {
  std::vector<std::vector<TokenOutput>> outs;
  std::vector<size_t> sent;
  int64_t completion_tokens = 0;
};

// The text a streamed choice may show so far: the final text once it finished; before, what
// decodes to whole characters less what could still become a stop string. With tools, text from
// a <tool_call> on is held back, and a finished choice's calls go to `calls`.
std::string streamable_text(const OpenAiReply& r, const SampleEvent& ev,
                            const std::vector<TokenOutput>& out, std::vector<ToolCall>& calls) {
  const OpenAiCall& call = *r.call;
  std::string text;
  if (ev.finished) {
    text = openai_final_text(r.tok.get(), call.request, ev, out, call.skip_special_tokens);
  } else if (r.tok) {
    text = decode_text(*r.tok, ids_of(out), call.skip_special_tokens);
    text.resize(utf8_complete_prefix(text));
    for (const auto& s : call.request.stop_strings)
      text.resize(text.size() > s.size() ? text.size() - s.size() + 1 : 0);
  }
  if (r.chat && call.parse_tools) {
    if (ev.finished) {
      calls = parse_tool_calls(text).calls;
      if (!calls.empty()) text.resize(tool_call_free_prefix(text));
    } else {
      text.resize(tool_call_free_prefix(text));
    }
  }
  return text;
}

// The chunk of one event: its new tokens, the text they add, and (finished) the finish reason,
// the seed and any tool calls.
json event_chunk(const OpenAiReply& r, StreamedChoices& st, const SampleEvent& ev) {
  const int32_t index = r.sub->index_of(ev);
  auto& out = st.outs[index];
  out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
  std::vector<ToolCall> calls;
  const std::string text = streamable_text(r, ev, out, calls);
  const std::string delta = text.size() > st.sent[index] ? text.substr(st.sent[index]) : "";
  st.sent[index] = std::max(st.sent[index], text.size());
  json choice = {
      {"index", index},
      {"token_ids", ids_of(ev.new_tokens)},
      {"finish_reason", ev.finished ? json(openai_finish_reason(ev.finish_reason)) : json()}};
  if (ev.finished) choice["sampling_seed"] = ev.seed;
  if (r.chat) choice["delta"] = delta.empty() ? json::object() : json{{"content", delta}};
  if (!calls.empty()) {
    choice["delta"]["tool_calls"] = tool_calls_json(calls, r.id + "_" + std::to_string(index));
    if (ev.finish_reason == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
  } else {
    choice["text"] = delta;
  }
  if (r.call->logprobs) choice["logprobs"] = r.logprobs(output_rows(ev.new_tokens));
  if (ev.finished) st.completion_tokens += static_cast<int64_t>(out.size());
  return r.chunk(json::array({choice}));
}

// Chat streams open with each choice's role; a stream asked for its usage ends with it.
std::string role_chunks(const OpenAiReply& r) {
  std::string lines;
  for (int32_t i = 0; r.chat && i < r.sub->total; ++i) {
    json c = r.chunk(json::array({{{"index", i},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"finish_reason", nullptr}}}));
    c["prompt_token_ids"] = r.prompt_of(i);
    lines += sse_line(c);
  }
  return lines;
}

void reply_streamed(httplib::Response& res, ReplySamples samples, const OpenAiReply& r) {
  auto st = std::make_shared<StreamedChoices>();
  st->outs.resize(r.sub->total);
  st->sent.assign(r.sub->total, 0);
  SseReply reply;
  reply.opening = [r] { return role_chunks(r); };
  reply.on_event = [r, st](const SampleEvent& ev) { return sse_line(event_chunk(r, *st, ev)); };
  reply.closing = [r, st] {
    if (!r.call->include_usage) return std::string();
    json c = r.chunk(json::array());
    c["usage"] = usage_json(r.prompt_tokens, st->completion_tokens);
    return sse_line(c);
  };
  reply_as_events(res, std::move(samples), std::move(reply));
}

}  // namespace

// Runs one OpenAI call (completion or chat; a batched completion submits each prompt) to the end
// or as an SSE stream. Choice i * n + j is sample j of prompt i.
void HttpServer::serve_openai(OpenAiCall call, bool chat, httplib::Response& res) {
  OpenAiReply r;
  r.id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_rid_++);
  r.model = call.model.empty() ? opt_.served_model_name : call.model;
  r.created = now_seconds();
  r.chat = chat;
  r.tok = tok_;
  if (call.prompts.empty()) call.prompts.push_back(call.request.input_ids);
  std::vector<GenerateRequest> requests(call.prompts.size(), call.request);
  for (size_t p = 0; p < requests.size(); ++p) {
    requests[p].input_ids = call.prompts[p];
    r.prompt_tokens += static_cast<int64_t>(call.prompts[p].size());
  }
  r.sub = submit_prompts(std::move(requests), res);
  if (!r.sub) return;
  r.call = std::make_shared<const OpenAiCall>(std::move(call));
  ReplySamples samples{r.sub, [this, sub = r.sub] { abort_prompts(*sub); }};
  if (r.call->stream) return reply_streamed(res, std::move(samples), r);
  reply_whole(res, std::move(samples), r);
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
