// OpenAI request parsing: strict about unknown fields (with the common client extras accepted).
#include "rollout/openai_api.h"

#include <cmath>
#include <limits>
#include <set>

#include "rollout/generate_api.h"

namespace miles::rollout {

using nlohmann::json;

namespace {

// SGLang's extensions of the OpenAI requests (sglang-router always sends some of them): accepted
// at their "off" value (null, false, empty), refused by name otherwise.
const std::set<std::string> kRefusedExtensions = {
    "return_hidden_states", "continue_final_message", "lora_path", "session_params", "regex",
    "ebnf", "json_schema", "structural_tag", "rid", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "priority", "return_routed_experts", "custom_params", "stop_regex"};
// SGLang's reasoning-parser switches: without a reasoning parser (miles has none) SGLang does not
// split the text either, so they change nothing.
const std::set<std::string> kNoEffect = {"separate_reasoning", "stream_reasoning"};

bool is_off(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
         (v.is_object() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
}

Status check_fields(const json& body, const std::set<std::string>& known) {
  if (!body.is_object()) return Status::Error("request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (known.count(it.key()) || kNoEffect.count(it.key())) continue;
    if (kRefusedExtensions.count(it.key())) {
      if (is_off(it.value())) continue;
      return Status::Error(it.key() + " is not supported by miles (docs/api.md)");
    }
    return Status::Error("unknown field '" + it.key() + "'");
  }
  return Status::Ok();
}

template <typename T>
Status get_number(const json& body, const char* key, T& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_number() || (std::is_integral_v<T> && !it->is_number_integer()))
    return Status::Error(std::string(key) + " must be a number, got " + it->dump());
  // Out of the type's range (1e300 for a float, 2^40 for an int32) is an error, not a conversion.
  const double v = it->get<double>();
  if (!(std::fabs(v) <= static_cast<double>(std::numeric_limits<T>::max())))
    return Status::Error(std::string(key) + " = " + it->dump() + " is out of range");
  out = it->get<T>();
  return Status::Ok();
}

const std::set<std::string> kCommon = {"model",
                                       "max_tokens",
                                       "temperature",
                                       "top_p",
                                       "top_k",
                                       "min_p",
                                       "n",
                                       "stop",
                                       "stream",
                                       "stream_options",
                                       "seed",
                                       "logprobs",
                                       "top_logprobs",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "repetition_penalty",
                                       "min_tokens",
                                       "user",
                                       "stop_token_ids",
                                       "ignore_eos",
                                       "skip_special_tokens",
                                       "logit_bias",
                                       "spaces_between_special_tokens",
                                       "no_stop_trim"};

Status read_stop_ids(const json& body, GenerateRequest& r) {
  auto it = body.find("stop_token_ids");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Status::Error("stop_token_ids must be a list of token ids");
  for (const auto& x : *it) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      return Status::Error("stop_token_ids must be a list of token ids");
    r.stop_token_ids.push_back(x.get<int32_t>());
  }
  return Status::Ok();
}

Status read_bool(const json& body, const char* key, bool& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Status::Error(std::string(key) + " must be a boolean");
  out = it->get<bool>();
  return Status::Ok();
}

Status read_stream(const json& body, OpenAiCall& c) {
  MILES_RETURN_IF_ERROR(read_bool(body, "stream", c.stream));
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return Status::Error("stream_options must be an object");
  for (auto e = it->begin(); e != it->end(); ++e)
    if (e.key() != "include_usage" && e.key() != "continuous_usage_stats")
      return Status::Error("stream_options." + e.key() + " is not supported");
  if (it->value("continuous_usage_stats", false) == true)
    return Status::Error("stream_options.continuous_usage_stats is not supported");
  return read_bool(*it, "include_usage", c.include_usage);
}

Status read_penalties(const json& body, GenerateRequest& r) {
  MILES_RETURN_IF_ERROR(get_number(body, "presence_penalty", r.adjust.presence_penalty));
  MILES_RETURN_IF_ERROR(get_number(body, "frequency_penalty", r.adjust.frequency_penalty));
  MILES_RETURN_IF_ERROR(get_number(body, "repetition_penalty", r.adjust.repetition_penalty));
  MILES_RETURN_IF_ERROR(get_number(body, "min_tokens", r.adjust.min_new_tokens));
  return parse_logit_bias(body, "", 100, r.adjust);  // OpenAI's range
}

}  // namespace

Status parse_openai_sampling(const json& body, OpenAiCall& c) {
  GenerateRequest& r = c.request;
  r.sampling.temperature = 1.0f;
  r.max_new_tokens = 16;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return Status::Error("model must be a string");
    c.model = it->get<std::string>();
  }
  MILES_RETURN_IF_ERROR(get_number(body, "max_tokens", r.max_new_tokens));
  MILES_RETURN_IF_ERROR(get_number(body, "max_completion_tokens", r.max_new_tokens));
  MILES_RETURN_IF_ERROR(get_number(body, "temperature", r.sampling.temperature));
  MILES_RETURN_IF_ERROR(get_number(body, "top_p", r.sampling.top_p));
  int64_t top_k = 0;
  MILES_RETURN_IF_ERROR(get_number(body, "top_k", top_k));
  if (top_k == -1) top_k = 0;
  if (top_k < 0 || top_k > INT32_MAX) return Status::Error("top_k must be -1, 0 or positive");
  r.sampling.top_k = static_cast<int32_t>(top_k);
  MILES_RETURN_IF_ERROR(get_number(body, "min_p", r.sampling.min_p));
  int64_t n = 1;
  MILES_RETURN_IF_ERROR(get_number(body, "n", n));
  if (n < 1 || n > 1024) return Status::Error("n = " + std::to_string(n) + " must be in [1, 1024]");
  r.n = static_cast<int32_t>(n);
  r.draw_seed = true;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer())
      return Status::Error("seed must be an integer, got " + it->dump());
    r.sampling.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
    r.draw_seed = false;
  }
  MILES_RETURN_IF_ERROR(read_penalties(body, r));
  MILES_RETURN_IF_ERROR(read_stream(body, c));
  MILES_RETURN_IF_ERROR(read_bool(body, "ignore_eos", r.ignore_eos));
  MILES_RETURN_IF_ERROR(read_bool(body, "skip_special_tokens", c.skip_special_tokens));
  bool spaces = true, no_stop_trim = false;
  MILES_RETURN_IF_ERROR(read_bool(body, "spaces_between_special_tokens", spaces));
  MILES_RETURN_IF_ERROR(read_bool(body, "no_stop_trim", no_stop_trim));
  if (no_stop_trim)
    return Status::Error("no_stop_trim is not supported on the OpenAI routes (use /generate)");
  MILES_RETURN_IF_ERROR(parse_stop(body, "", r));
  return read_stop_ids(body, r);
}

Result<OpenAiCall> parse_completion(const json& body, const Tokenizer* tok) {
  OpenAiCall c;
  auto known = kCommon;
  known.insert({"prompt", "echo", "suffix", "best_of"});
  MILES_RETURN_IF_ERROR(check_fields(body, known));
  MILES_RETURN_IF_ERROR(read_bool(body, "echo", c.echo));
  if (body.contains("suffix") && !body["suffix"].is_null())
    return Status::Error("suffix is not supported");
  MILES_RETURN_IF_ERROR(parse_openai_sampling(body, c));
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != c.request.n)
      return Status::Error("best_of is not supported (only best_of = n)");
  }
  // Completions: logprobs is an integer, the number of most likely tokens per position (0: only the
  // sampled token's logprob).
  if (auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 20)
      return Status::Error("logprobs must be an integer in [0, 20], got " + it->dump());
    c.logprobs = true;
    c.top_logprobs = it->get<int32_t>();
  }
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null())
    return Status::Error("top_logprobs is a chat field; completions take logprobs = N");
  c.request.top_logprobs = c.top_logprobs;
  if (c.echo && c.logprobs) c.request.logprob_start_len = 0;
  if (!body.contains("prompt")) return Status::Error("prompt is required");
  const json& p = body["prompt"];
  auto ids_of = [](const json& list, std::vector<int32_t>& out) -> Status {
    for (const auto& x : list) {
      if (!x.is_number_integer() || x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX)
        return Status::Error("prompt: token ids must be integers, got " + x.dump());
      out.push_back(x.get<int32_t>());
    }
    return Status::Ok();
  };
  auto text_of = [&](const json& t) -> Status {
    if (!tok)
      return Status::Error("text prompts need a tokenizer; this server has none (send token ids)");
    c.prompts.push_back(tok->encode(t.get<std::string>(), /*add_special=*/true));
    return Status::Ok();
  };
  if (p.is_string()) {
    MILES_RETURN_IF_ERROR(text_of(p));
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    c.prompts.emplace_back();
    MILES_RETURN_IF_ERROR(ids_of(p, c.prompts.back()));
  } else if (p.is_array() && !p.empty()) {  // a batch: strings or lists of ids
    for (const auto& e : p) {
      if (e.is_string()) {
        MILES_RETURN_IF_ERROR(text_of(e));
      } else if (e.is_array()) {
        c.prompts.emplace_back();
        MILES_RETURN_IF_ERROR(ids_of(e, c.prompts.back()));
      } else {
        return Status::Error("prompt: a batch holds strings or lists of token ids, got " +
                             e.dump());
      }
    }
  } else {
    return Status::Error(
        "prompt must be a string, a list of token ids, or a non-empty list of either");
  }
  c.request.input_ids = c.prompts.front();
  return c;
}

Result<OpenAiCall> parse_chat(const json& body) {
  OpenAiCall c;
  auto known = kCommon;
  known.insert({"messages", "tools", "tool_choice", "max_completion_tokens", "chat_template_kwargs",
                "parallel_tool_calls", "response_format"});
  MILES_RETURN_IF_ERROR(check_fields(body, known));
  MILES_RETURN_IF_ERROR(parse_openai_sampling(body, c));
  MILES_RETURN_IF_ERROR(read_bool(body, "logprobs", c.logprobs));
  if (auto it = body.find("top_logprobs"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 20)
      return Status::Error("top_logprobs must be an integer in [0, 20], got " + it->dump());
    if (!c.logprobs && it->get<int64_t>() > 0)
      return Status::Error("top_logprobs needs logprobs: true");
    c.top_logprobs = it->get<int32_t>();
  }
  c.request.top_logprobs = c.top_logprobs;
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
  bool parallel = true;
  MILES_RETURN_IF_ERROR(read_bool(body, "parallel_tool_calls", parallel));
  std::string choice = "auto";
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "auto" && *it != "none"))
      return Status::Error("tool_choice " + it->dump() +
                           " is not supported (\"auto\" or \"none\"; a forced call needs "
                           "constrained decoding, which miles does not do)");
    choice = it->get<std::string>();
  }
  c.parse_tools = !c.tools.is_null() && !c.tools.empty() && choice != "none";
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    // {"type": "text"}, the only format that needs no constrained decoding.
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      return Status::Error("response_format must be an object with a string \"type\", got " +
                           it->dump().substr(0, 200));
    if ((*it)["type"] != "text")
      return Status::Error("response_format other than text is not supported");
    for (const auto& [key, value] : it->items())
      if (key != "type") return Status::Error("response_format: unknown field '" + key + "'");
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object())
      return Status::Error("chat_template_kwargs must be an object");
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
  if (lead >= 0xF0)
    need = 3;
  else if (lead >= 0xE0)
    need = 2;
  else if (lead >= 0xC0)
    need = 1;
  else
    return n;  // ASCII lead: complete
  return cont >= need ? n : i - 1;
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return nullptr;
}

std::string openai_final_text(const Tokenizer* tok, const GenerateRequest& req,
                              const SampleEvent& fin, const std::vector<TokenOutput>& out,
                              bool skip_special) {
  if (!tok) return "";
  std::vector<int32_t> ids;
  for (const auto& t : out) ids.push_back(t.id);
  std::string text = decode_text(*tok, ids, skip_special);
  if (fin.finish_reason == FinishReason::kStop)
    for (const auto& s : req.stop_strings)
      if (s == fin.matched_stop) {
        const size_t at = text.find(s);
        if (at != std::string::npos) text.resize(at);
      }
  // A stop token (EOS, <|im_end|>) is not part of the visible text.
  if (fin.finish_reason == FinishReason::kStop && !out.empty() &&
      std::to_string(out.back().id) == fin.matched_stop)
    text = decode_text(*tok, std::span(ids).first(ids.size() - 1), skip_special);
  return text;
}

}  // namespace miles::rollout
