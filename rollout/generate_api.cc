// /generate bodies: strict parsing into GenerateBatch, and SGLang-shaped responses.
#include "rollout/generate_api.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

namespace miles::rollout {

namespace {

using nlohmann::json;

// SGLang request fields miles does not implement: accepted only at their "off" value (null, false,
// an empty list or object), otherwise refused by name.
const std::set<std::string> kRefusedRequestFields = {
    "input_embeds", "image_data", "video_data", "audio_data", "modalities", "session_params",
    "lora_path", "lora_id", "custom_logit_processor", "return_hidden_states", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "data_parallel_rank", "background",
    "conversation_id", "priority", "extra_key", "return_bytes", "return_entropy", "custom_labels",
    "routed_dp_rank", "disagg_prefill_dp_rank", "external_trace_header", "received_time",
    "require_reasoning", "return_prompt_token_ids", "session_id", "routed_experts_start_len",
    "return_indexer_topk", "return_sampling_mask", "sampling_logprobs_mode",
    "return_flat_raw_top_logprobs", "return_flat_raw_output_top_logprobs", "max_thinking_tokens",
    "cache_salt", "routing_key", "decode_tp_size", "positional_embed_overrides", "watermark",
    // sglang-router re-serialises requests with "model": null
    "model"};
// Fields that change nothing in the response (server-side logging only).
const std::set<std::string> kLoggingFields = {"log_metrics", "no_logs"};
const std::set<std::string> kRequestFields = {"text",
                                              "input_ids",
                                              "sampling_params",
                                              "rid",
                                              "return_logprob",
                                              "logprob_start_len",
                                              "top_logprobs_num",
                                              "token_ids_logprob",
                                              "return_text_in_logprobs",
                                              "stream",
                                              "return_routed_experts"};

const std::set<std::string> kRefusedSamplingFields = {
    "json_schema",   "regex",           "ebnf",           "structural_tag", "stop_regex",
    "custom_params", "stream_interval", "logit_bias_type"};
const std::set<std::string> kSamplingFields = {"temperature",
                                               "top_p",
                                               "top_k",
                                               "min_p",
                                               "max_new_tokens",
                                               "min_new_tokens",
                                               "stop",
                                               "stop_token_ids",
                                               "ignore_eos",
                                               "n",
                                               "seed",
                                               "sampling_seed",
                                               "skip_special_tokens",
                                               "spaces_between_special_tokens",
                                               "no_stop_trim",
                                               "frequency_penalty",
                                               "presence_penalty",
                                               "repetition_penalty",
                                               "logit_bias"};

bool is_off(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
         (v.is_object() && v.empty());
}

Status check_fields(const json& obj, const std::set<std::string>& known,
                    const std::set<std::string>& refused, const std::string& where) {
  if (!obj.is_object()) return Status::Error(where + " must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (known.count(it.key()) || kLoggingFields.count(it.key())) continue;
    if (refused.count(it.key())) {
      if (is_off(it.value())) continue;
      return Status::Error(where + "." + it.key() +
                           " is not supported by miles (docs/api.md lists every field)");
    }
    return Status::Error(where + ": unknown field '" + it.key() + "'");
  }
  return Status::Ok();
}

template <typename T>
Status read(const json& obj, const char* key, T& out, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer();
  } else if constexpr (std::is_floating_point_v<T>) {
    // A JSON number beyond the type's range (1e300 for a float) is an error, not a conversion.
    ok = it->is_number() && std::isfinite(it->get<double>()) &&
         std::fabs(it->get<double>()) <= static_cast<double>(std::numeric_limits<T>::max());
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
  }
  if (!ok) return Status::Error(where + "." + key + " has the wrong type (" + it->dump() + ")");
  out = it->get<T>();
  return Status::Ok();
}

Result<std::vector<int32_t>> read_ids(const json& v, const std::string& where) {
  if (!v.is_array()) return Status::Error(where + " must be an array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX)
      return Status::Error(where + " must hold integer token ids, got " + x.dump());
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

Status read_seed(const json& sp, const std::string& w, GenerateRequest& r) {
  for (const char* key : {"sampling_seed", "seed"}) {
    auto it = sp.find(key);
    if (it == sp.end() || it->is_null()) continue;
    if (!it->is_number_integer())
      return Status::Error(w + "." + key + " must be an integer, got " + it->dump());
    r.sampling.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
    r.draw_seed = false;
  }
  return Status::Ok();
}

Status read_penalties(const json& sp, const std::string& w, GenerateRequest& r) {
  MILES_RETURN_IF_ERROR(read(sp, "frequency_penalty", r.adjust.frequency_penalty, w));
  MILES_RETURN_IF_ERROR(read(sp, "presence_penalty", r.adjust.presence_penalty, w));
  MILES_RETURN_IF_ERROR(read(sp, "repetition_penalty", r.adjust.repetition_penalty, w));
  MILES_RETURN_IF_ERROR(read(sp, "min_new_tokens", r.adjust.min_new_tokens, w));
  return parse_logit_bias(sp, w, 1e6, r.adjust);
}

// A per-prompt value of a batched body: the list's i-th entry, or the one value for all.
json pick(const json& body, const char* key, size_t i, bool batched) {
  auto it = body.find(key);
  if (it == body.end()) return json();
  if (batched && it->is_array() && std::string(key) != "input_ids")
    return i < it->size() ? (*it)[i] : json();
  return *it;
}

Result<std::vector<std::vector<int32_t>>> prompts_of(const json& body, const Tokenizer* tok,
                                                     bool* batched) {
  const bool has_text = body.contains("text") && !body["text"].is_null();
  const bool has_ids = body.contains("input_ids") && !body["input_ids"].is_null();
  if (has_text == has_ids)
    return Status::Error("request: give exactly one of 'text' and 'input_ids'");
  std::vector<std::vector<int32_t>> prompts;
  if (has_ids) {
    const json& v = body["input_ids"];
    *batched = v.is_array() && !v.empty() && v[0].is_array();
    if (!*batched) {
      MILES_ASSIGN_OR_RETURN(auto ids, read_ids(v, "input_ids"));
      prompts.push_back(std::move(ids));
      return prompts;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      MILES_ASSIGN_OR_RETURN(auto ids, read_ids(v[i], "input_ids[" + std::to_string(i) + "]"));
      prompts.push_back(std::move(ids));
    }
    return prompts;
  }
  const json& t = body["text"];
  *batched = t.is_array();
  if (!t.is_string() && !t.is_array())
    return Status::Error("text must be a string or a list of strings");
  if (!tok)
    return Status::Error("text prompts need a tokenizer; this server has none (send input_ids)");
  const json list = t.is_array() ? t : json::array({t});
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string())
      return Status::Error("text[" + std::to_string(i) + "] must be a string");
    prompts.push_back(tok->encode(list[i].get<std::string>(), /*add_special=*/true));
  }
  return prompts;
}

// token_ids_logprob for prompt i, as SGLang normalises it: one id or a list of ids for every
// prompt, or (batched) a list of lists, one per prompt; null or empty for none.
Result<std::vector<int32_t>> token_ids_of(const json& body, size_t i, bool batched) {
  auto it = body.find("token_ids_logprob");
  if (it == body.end() || it->is_null()) return std::vector<int32_t>{};
  const std::string w = "request.token_ids_logprob";
  if (it->is_number_integer()) return read_ids(json::array({*it}), w);
  if (!it->is_array()) return Status::Error(w + " must be a token id or a list of token ids");
  if (it->empty() || !(*it)[0].is_array()) return read_ids(*it, w);
  if (!batched) return Status::Error(w + ": a list of lists needs a batch of prompts");
  return read_ids((*it)[i], w + "[" + std::to_string(i) + "]");
}

// The per-prompt fields of one call: logprob options and flags.
Status read_call_options(const json& body, size_t i, bool batched, GenerateCall& c) {
  const std::string w = "request";
  const json one = {{"return_logprob", pick(body, "return_logprob", i, batched)},
                    {"logprob_start_len", pick(body, "logprob_start_len", i, batched)},
                    {"top_logprobs_num", pick(body, "top_logprobs_num", i, batched)},
                    {"return_text_in_logprobs", body.value("return_text_in_logprobs", json())},
                    {"return_routed_experts", body.value("return_routed_experts", json())},
                    {"rid", pick(body, "rid", i, batched)}};
  MILES_RETURN_IF_ERROR(read(one, "return_logprob", c.return_logprob, w));
  MILES_RETURN_IF_ERROR(read(one, "return_text_in_logprobs", c.return_text_in_logprobs, w));
  MILES_RETURN_IF_ERROR(read(one, "return_routed_experts", c.return_routed_experts, w));
  MILES_RETURN_IF_ERROR(read(one, "rid", c.rid, w));
  int64_t start_len = -1, top_n = 0;
  MILES_RETURN_IF_ERROR(read(one, "logprob_start_len", start_len, w));
  MILES_RETURN_IF_ERROR(read(one, "top_logprobs_num", top_n, w));
  if (top_n < 0 || top_n > INT32_MAX)
    return Status::Error("top_logprobs_num = " + std::to_string(top_n) + " must be >= 0");
  MILES_ASSIGN_OR_RETURN(auto token_ids, token_ids_of(body, i, batched));
  // SGLang computes logprobs (input, output, top, token ids) only with return_logprob.
  if (c.return_logprob) {
    c.request.logprob_start_len = start_len;
    c.request.top_logprobs = static_cast<int32_t>(top_n);
    c.request.token_ids_logprob = std::move(token_ids);
  }
  return Status::Ok();
}

json token_entry(float logprob, int32_t id, const GenerateCall& c, const Tokenizer* tok) {
  json text = nullptr;
  if (c.return_text_in_logprobs && tok) text = tok->decode(std::vector<int32_t>{id});
  return json::array({std::isnan(logprob) ? json() : json(logprob), id, text});
}

json top_entries(const std::vector<TopLogprob>& top, const GenerateCall& c, const Tokenizer* tok) {
  json out = json::array();
  for (const TopLogprob& t : top) out.push_back(token_entry(t.logprob, t.id, c, tok));
  return out;
}

void add_logprobs(const GenerateCall& call, const std::vector<TokenOutput>& output,
                  const SampleEvent* fin, const ReplyContext& ctx, json& meta) {
  const bool with_top = call.request.top_logprobs > 0;
  const bool with_ids = !call.request.token_ids_logprob.empty();
  json lps = json::array(), sampling = json::array(), raw = json::array(), versions = json::array(),
       tops = json::array(), ids = json::array();
  for (const auto& t : output) {
    lps.push_back(token_entry(t.tempered_logprob, t.id, call, ctx.tok));
    sampling.push_back(t.logprob);
    raw.push_back(t.raw_logprob);
    versions.push_back(t.weight_version);
    if (with_top) tops.push_back(top_entries(t.top, call, ctx.tok));
    if (with_ids) ids.push_back(top_entries(t.ids, call, ctx.tok));
  }
  meta["output_token_logprobs"] = lps;
  meta["output_token_sampling_logprobs"] = sampling;
  meta["output_token_raw_logprobs"] = raw;
  meta["output_token_weight_versions"] = versions;
  if (with_top) meta["output_top_logprobs"] = tops;
  if (with_ids) meta["output_token_ids_logprobs"] = ids;
  if (!fin) return;
  json in = json::array(), in_top = json::array(), in_ids = json::array();
  if (call.request.logprob_start_len < 0) {
    // SGLang's default (-1) starts at the last prompt token: one entry, which has no logprob.
    if (call.request.input_ids.empty()) return;
    meta["input_token_logprobs"] =
        json::array({token_entry(NAN, call.request.input_ids.back(), call, ctx.tok)});
    if (with_top) meta["input_top_logprobs"] = json::array({json()});
    if (with_ids) meta["input_token_ids_logprobs"] = json::array({json()});
    return;
  }
  for (const InputLogprob& e : fin->input_logprobs) {
    const bool first = std::isnan(e.logprob);  // no logits before it: null, as SGLang
    in.push_back(token_entry(e.logprob, e.id, call, ctx.tok));
    if (with_top) in_top.push_back(first ? json() : top_entries(e.top, call, ctx.tok));
    if (with_ids) in_ids.push_back(first ? json() : top_entries(e.ids, call, ctx.tok));
  }
  meta["input_token_logprobs"] = in;
  if (with_top) meta["input_top_logprobs"] = in_top;
  if (with_ids) meta["input_token_ids_logprobs"] = in_ids;
}

json finish_json(const GenerateCall& call, const SampleEvent& fin) {
  json reason = {{"type", finish_reason_name(fin.finish_reason)}};
  if (fin.finish_reason == FinishReason::kLength) reason["length"] = call.request.max_new_tokens;
  if (!fin.matched_stop.empty()) {
    const auto& stops = call.request.stop_strings;
    const bool by_string = std::find(stops.begin(), stops.end(), fin.matched_stop) != stops.end();
    if (fin.finish_reason == FinishReason::kStop && !by_string)
      reason["matched"] = std::stoi(fin.matched_stop);
    else
      reason["matched"] = fin.matched_stop;
  }
  if (fin.finish_reason == FinishReason::kAbort) reason["message"] = "Aborted";
  return reason;
}

}  // namespace

namespace {

std::string field(const std::string& where, const char* name) {
  return where.empty() ? std::string(name) : where + "." + name;
}

}  // namespace

Status parse_stop(const json& obj, const std::string& where, GenerateRequest& r) {
  auto it = obj.find("stop");
  if (it == obj.end() || it->is_null()) return Status::Ok();
  const std::string what = field(where, "stop") + " must be a string or a list of strings";
  if (it->is_string()) {
    r.stop_strings = {it->get<std::string>()};
    return Status::Ok();
  }
  if (!it->is_array()) return Status::Error(what);
  for (const auto& s : *it) {
    if (!s.is_string()) return Status::Error(what);
    r.stop_strings.push_back(s.get<std::string>());
  }
  return Status::Ok();
}

Status parse_logit_bias(const json& obj, const std::string& where, double bound,
                        LogitAdjustments& a) {
  auto it = obj.find("logit_bias");
  if (it == obj.end() || it->is_null()) return Status::Ok();
  const std::string name = field(where, "logit_bias");
  if (!it->is_object()) return Status::Error(name + " must be an object {\"token id\": bias}");
  char range[64];
  std::snprintf(range, sizeof(range), "[-%g, %g]", bound, bound);
  for (auto e = it->begin(); e != it->end(); ++e) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(e.key(), &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != e.key().size() || id < 0 || id > INT32_MAX)
      return Status::Error(name + ": key '" + e.key() + "' is not a token id");
    if (!e.value().is_number() || !(std::fabs(e.value().get<double>()) <= bound))
      return Status::Error(name + "[\"" + e.key() + "\"] must be a number in " + range);
    a.logit_bias.emplace_back(static_cast<int32_t>(id), e.value().get<float>());
  }
  return Status::Ok();
}

Status parse_sampling_params(const json& sp, GenerateCall& c) {
  const std::string w = "sampling_params";
  GenerateRequest& r = c.request;
  MILES_RETURN_IF_ERROR(check_fields(sp, kSamplingFields, kRefusedSamplingFields, w));
  MILES_RETURN_IF_ERROR(read(sp, "temperature", r.sampling.temperature, w));
  MILES_RETURN_IF_ERROR(read(sp, "top_p", r.sampling.top_p, w));
  int64_t top_k = r.sampling.top_k;
  MILES_RETURN_IF_ERROR(read(sp, "top_k", top_k, w));
  if (top_k == -1) top_k = 0;  // SGLang spells "off" as -1
  if (top_k < 0 || top_k > INT32_MAX)
    return Status::Error(w + ".top_k = " + std::to_string(top_k) + " must be -1 (off) or positive");
  r.sampling.top_k = static_cast<int32_t>(top_k);
  MILES_RETURN_IF_ERROR(read(sp, "min_p", r.sampling.min_p, w));
  MILES_RETURN_IF_ERROR(read(sp, "max_new_tokens", r.max_new_tokens, w));
  MILES_RETURN_IF_ERROR(read(sp, "ignore_eos", r.ignore_eos, w));
  int64_t n = r.n;
  MILES_RETURN_IF_ERROR(read(sp, "n", n, w));
  if (n < 1 || n > 1024)
    return Status::Error(w + ".n = " + std::to_string(n) + " must be in [1, 1024]");
  r.n = static_cast<int32_t>(n);
  MILES_RETURN_IF_ERROR(read_seed(sp, w, r));
  MILES_RETURN_IF_ERROR(read_penalties(sp, w, r));
  MILES_RETURN_IF_ERROR(parse_stop(sp, w, r));
  if (auto it = sp.find("stop_token_ids"); it != sp.end() && !it->is_null()) {
    MILES_ASSIGN_OR_RETURN(r.stop_token_ids, read_ids(*it, w + ".stop_token_ids"));
  }
  MILES_RETURN_IF_ERROR(read(sp, "no_stop_trim", c.no_stop_trim, w));
  MILES_RETURN_IF_ERROR(read(sp, "skip_special_tokens", c.skip_special_tokens, w));
  MILES_RETURN_IF_ERROR(
      read(sp, "spaces_between_special_tokens", c.spaces_between_special_tokens, w));
  return Status::Ok();
}

Result<GenerateBatch> parse_generate(const json& body, const Tokenizer* tok) {
  GenerateBatch b;
  MILES_RETURN_IF_ERROR(check_fields(body, kRequestFields, kRefusedRequestFields, "request"));
  MILES_ASSIGN_OR_RETURN(auto prompts, prompts_of(body, tok, &b.batched));
  if (prompts.empty()) return Status::Error("request: the batch of prompts is empty");
  MILES_RETURN_IF_ERROR(read(body, "stream", b.stream, "request"));
  for (const char* key :
       {"sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num"}) {
    auto it = body.find(key);
    if (b.batched && it != body.end() && it->is_array() && it->size() != prompts.size())
      return Status::Error(std::string("request.") + key + " is a list of " +
                           std::to_string(it->size()) + " for " + std::to_string(prompts.size()) +
                           " prompts");
  }
  if (auto it = body.find("token_ids_logprob"); it != body.end() && it->is_array() &&
                                                !it->empty() && (*it)[0].is_array() && b.batched &&
                                                it->size() != prompts.size())
    return Status::Error("request.token_ids_logprob is a list of " + std::to_string(it->size()) +
                         " lists for " + std::to_string(prompts.size()) + " prompts");
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateCall c;
    c.request.input_ids = std::move(prompts[i]);
    c.request.sampling.temperature = 1.0f;
    c.request.draw_seed = true;  // until the request gives a seed
    MILES_RETURN_IF_ERROR(read_call_options(body, i, b.batched, c));
    const json sp = pick(body, "sampling_params", i, b.batched);
    if (!sp.is_null()) MILES_RETURN_IF_ERROR(parse_sampling_params(sp, c));
    b.calls.push_back(std::move(c));
  }
  return b;
}

std::string sample_text(const GenerateCall& call, const std::vector<TokenOutput>& output,
                        const SampleEvent* fin, const Tokenizer* tok) {
  if (!tok) return "";
  std::vector<int32_t> ids;
  ids.reserve(output.size());
  for (const auto& t : output) ids.push_back(t.id);
  const bool trim = fin && fin->finish_reason == FinishReason::kStop && !call.no_stop_trim;
  const auto& stops = call.request.stop_strings;
  const bool by_string =
      fin && std::find(stops.begin(), stops.end(), fin->matched_stop) != stops.end();
  // A matched stop token is not decoded (SGLang trims the last id), a stop string is cut off.
  if (trim && !by_string && !ids.empty()) ids.pop_back();
  std::string text = decode_text(*tok, ids, call.skip_special_tokens);
  if (trim && by_string) {
    const size_t at = text.find(fin->matched_stop);
    if (at != std::string::npos) text.resize(at);
  }
  return text;
}

json sample_json(const GenerateCall& call, const std::vector<TokenOutput>& output,
                 const SampleEvent* fin, const ReplyContext& ctx) {
  std::vector<int32_t> ids;
  for (const auto& t : output) ids.push_back(t.id);
  json j;
  j["text"] = sample_text(call, output, fin, ctx.tok);
  j["output_ids"] = ids;
  json meta;
  meta["id"] = call.rid;
  meta["completion_tokens"] = output.size();
  if (fin) {
    meta["prompt_tokens"] = fin->prompt_tokens;
    meta["cached_tokens"] = fin->cached_tokens;
    meta["finish_reason"] = finish_json(call, *fin);
    meta["sampling_seed"] = fin->seed;
  } else {
    meta["finish_reason"] = nullptr;
  }
  if (call.return_logprob) add_logprobs(call, output, fin, ctx, meta);
  if (!output.empty()) {
    const int64_t v = output.back().weight_version;
    meta["weight_version"] = ctx.version_label ? ctx.version_label(v) : std::to_string(v);
  }
  if (call.return_routed_experts && fin && ctx.experts_per_token > 0) {
    meta["routed_experts"] = fin->routed_experts;  // flat [tokens - 1, moe layers, top_k]
    meta["routed_experts_shape"] = {
        static_cast<int64_t>(fin->routed_experts.size()) / ctx.experts_per_token, ctx.moe_layers,
        ctx.experts_per_token / std::max<int64_t>(1, ctx.moe_layers)};
  }
  j["meta_info"] = meta;
  return j;
}

}  // namespace miles::rollout
