// OpenAI request parsing: strict about unknown fields (with the common client extras accepted).
#include "rollout/openai_api.h"

#include <set>

namespace miles::rollout {

using nlohmann::json;

namespace {

Status check_fields(const json& body, const std::set<std::string>& known) {
  if (!body.is_object()) return Status::Error("request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known.count(it.key())) return Status::Error("unknown field '" + it.key() + "'");
  return Status::Ok();
}

template <typename T>
Status get_number(const json& body, const char* key, T& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_number() || (std::is_integral_v<T> && !it->is_number_integer()))
    return Status::Error(std::string(key) + " must be a number, got " + it->dump());
  out = it->get<T>();
  return Status::Ok();
}

const std::set<std::string> kCommon = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "stream",
    "stream_options", "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
    "user", "stop_token_ids", "ignore_eos", "skip_special_tokens", "logit_bias"};

}  // namespace

Status parse_openai_sampling(const json& body, OpenAiCall& c) {
  GenerateRequest& r = c.request;
  r.sampling.temperature = 1.0f;
  r.max_new_tokens = 16;
  if (body.contains("model") && body["model"].is_string()) c.model = body["model"].get<std::string>();
  MILES_RETURN_IF_ERROR(get_number(body, "max_tokens", r.max_new_tokens));
  MILES_RETURN_IF_ERROR(get_number(body, "max_completion_tokens", r.max_new_tokens));
  MILES_RETURN_IF_ERROR(get_number(body, "temperature", r.sampling.temperature));
  MILES_RETURN_IF_ERROR(get_number(body, "top_p", r.sampling.top_p));
  int64_t top_k = 0;
  MILES_RETURN_IF_ERROR(get_number(body, "top_k", top_k));
  if (top_k == -1) top_k = 0;
  if (top_k < 0) return Status::Error("top_k must be -1, 0 or positive");
  r.sampling.top_k = static_cast<int32_t>(top_k);
  MILES_RETURN_IF_ERROR(get_number(body, "min_p", r.sampling.min_p));
  int64_t n = 1;
  MILES_RETURN_IF_ERROR(get_number(body, "n", n));
  if (n < 1 || n > 1024) return Status::Error("n = " + std::to_string(n) + " must be in [1, 1024]");
  r.n = static_cast<int32_t>(n);
  int64_t seed = 0;
  MILES_RETURN_IF_ERROR(get_number(body, "seed", seed));
  r.sampling.seed = static_cast<uint64_t>(seed);
  for (const char* k : {"presence_penalty", "frequency_penalty"}) {
    double v = 0;
    MILES_RETURN_IF_ERROR(get_number(body, k, v));
    if (v != 0) return Status::Error(std::string(k) + " is not supported (only 0)");
  }
  if (body.contains("top_logprobs") && body["top_logprobs"].is_number_integer() &&
      body["top_logprobs"].get<int64_t>() > 0)
    return Status::Error("top_logprobs is not supported");
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() && !body["logit_bias"].empty())
    return Status::Error("logit_bias is not supported");
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return Status::Error("stream must be a boolean");
    c.stream = body["stream"].get<bool>();
  }
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const json& lp = body["logprobs"];
    if (lp.is_boolean()) c.logprobs = lp.get<bool>();
    else if (lp.is_number_integer()) c.logprobs = lp.get<int64_t>() >= 0;
    else return Status::Error("logprobs must be a boolean or an integer");
  }
  if (body.contains("ignore_eos") && body["ignore_eos"].is_boolean()) r.ignore_eos = body["ignore_eos"].get<bool>();
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop_strings = {it->get<std::string>()};
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return Status::Error("stop must be a string or a list of strings");
        r.stop_strings.push_back(s.get<std::string>());
      }
    } else {
      return Status::Error("stop must be a string or a list of strings");
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return Status::Error("stop_token_ids must be a list of token ids");
    for (const auto& x : *it) {
      if (!x.is_number_integer()) return Status::Error("stop_token_ids must be a list of token ids");
      r.stop_token_ids.push_back(x.get<int32_t>());
    }
  }
  return Status::Ok();
}

Result<OpenAiCall> parse_completion(const json& body, const Tokenizer* tok) {
  OpenAiCall c;
  auto known = kCommon;
  known.insert({"prompt", "echo", "suffix", "best_of"});
  MILES_RETURN_IF_ERROR(check_fields(body, known));
  if (body.contains("echo") && body["echo"].is_boolean() && body["echo"].get<bool>())
    return Status::Error("echo is not supported");
  if (body.contains("suffix") && !body["suffix"].is_null()) return Status::Error("suffix is not supported");
  MILES_RETURN_IF_ERROR(parse_openai_sampling(body, c));
  if (!body.contains("prompt")) return Status::Error("prompt is required");
  const json& p = body["prompt"];
  if (p.is_string()) {
    if (!tok) return Status::Error("text prompts need a tokenizer; this server has none (send token ids)");
    c.request.input_ids = tok->encode(p.get<std::string>(), /*add_special=*/true);
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const auto& x : p) {
      if (!x.is_number_integer()) return Status::Error("prompt: token ids must be integers");
      const int64_t v = x.get<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) return Status::Error("prompt: token id " + x.dump() + " is out of range");
      c.request.input_ids.push_back(static_cast<int32_t>(v));
    }
  } else {
    return Status::Error("prompt must be a string or a list of token ids (batches: send one request each)");
  }
  return c;
}

Result<OpenAiCall> parse_chat(const json& body) {
  OpenAiCall c;
  auto known = kCommon;
  known.insert({"messages", "tools", "tool_choice", "max_completion_tokens", "chat_template_kwargs",
                "parallel_tool_calls", "response_format"});
  MILES_RETURN_IF_ERROR(check_fields(body, known));
  MILES_RETURN_IF_ERROR(parse_openai_sampling(body, c));
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return Status::Error("messages must be a non-empty list");
  for (const auto& m : body["messages"])
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status::Error("every message needs a string 'role'");
  c.messages = body["messages"];
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return Status::Error("tools must be a list");
    c.tools = body["tools"];
  }
  if (body.contains("response_format") && !body["response_format"].is_null() &&
      body["response_format"].value("type", "text") != "text")
    return Status::Error("response_format other than text is not supported");
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object()) return Status::Error("chat_template_kwargs must be an object");
    c.template_kwargs = body["chat_template_kwargs"];
  }
  return c;
}

size_t utf8_complete_prefix(const std::string& t) {
  size_t n = t.size();
  // Walk back over at most 3 continuation bytes to the lead byte of the last character.
  size_t i = n;
  int cont = 0;
  while (i > 0 && cont < 4 && (static_cast<unsigned char>(t[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++cont;
  }
  if (i == 0) return n;
  const unsigned char lead = static_cast<unsigned char>(t[i - 1]);
  int need = 0;
  if (lead >= 0xF0) need = 3;
  else if (lead >= 0xE0) need = 2;
  else if (lead >= 0xC0) need = 1;
  else return n;  // ASCII lead: complete
  return cont >= need ? n : i - 1;
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
  }
  return nullptr;
}

std::string openai_final_text(const Tokenizer* tok, const GenerateRequest& req,
                              const SampleEvent& fin, const std::vector<TokenOutput>& out) {
  if (!tok) return "";
  std::vector<int32_t> ids;
  for (const auto& t : out) ids.push_back(t.id);
  std::string text = tok->decode(ids);
  if (fin.finish_reason == FinishReason::kStop)
    for (const auto& s : req.stop_strings)
      if (s == fin.matched_stop) {
        const size_t at = text.find(s);
        if (at != std::string::npos) text.resize(at);
      }
  // A stop token (EOS, <|im_end|>) is not part of the visible text.
  if (fin.finish_reason == FinishReason::kStop && !out.empty() &&
      std::to_string(out.back().id) == fin.matched_stop)
    text = tok->decode(std::span(ids).first(ids.size() - 1));
  return text;
}

}  // namespace miles::rollout
