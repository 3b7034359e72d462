// /generate bodies: strict parsing into GenerateCall, and SGLang-shaped responses.
#include "rollout/generate_api.h"

#include <set>

namespace miles::rollout {

namespace {

using nlohmann::json;

Status check_known(const json& obj, const std::set<std::string>& known, const std::string& where) {
  if (!obj.is_object()) return Status::Error(where + " must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!known.count(it.key())) return Status::Error(where + ": unknown field '" + it.key() + "'");
  return Status::Ok();
}

template <typename T>
Status read(const json& obj, const char* key, T& out, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw std::runtime_error("");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) throw std::runtime_error("");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) throw std::runtime_error("");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) throw std::runtime_error("");
    }
    out = it->get<T>();
  } catch (...) {
    return Status::Error(where + "." + key + " has the wrong type (" + it->dump() + ")");
  }
  return Status::Ok();
}

Result<std::vector<int32_t>> read_ids(const json& v, const std::string& where) {
  if (!v.is_array()) return Status::Error(where + " must be an array of token ids");
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX)
      return Status::Error(where + " must hold integer token ids, got " + x.dump());
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

}  // namespace

Status parse_sampling_params(const json& sp, GenerateRequest& r) {
  const std::string w = "sampling_params";
  MILES_RETURN_IF_ERROR(check_known(
      sp,
      {"temperature", "top_p", "top_k", "min_p", "max_new_tokens", "stop", "stop_token_ids",
       "ignore_eos", "n", "seed", "sampling_seed", "skip_special_tokens", "no_stop_trim",
       "frequency_penalty", "presence_penalty", "repetition_penalty"},
      w));
  MILES_RETURN_IF_ERROR(read(sp, "temperature", r.sampling.temperature, w));
  MILES_RETURN_IF_ERROR(read(sp, "top_p", r.sampling.top_p, w));
  int64_t top_k = r.sampling.top_k;
  MILES_RETURN_IF_ERROR(read(sp, "top_k", top_k, w));
  if (top_k == -1) top_k = 0;  // SGLang spells "off" as -1
  if (top_k < 0 || top_k > INT32_MAX) return Status::Error(w + ".top_k = " + std::to_string(top_k) + " must be -1, 0 or positive");
  r.sampling.top_k = static_cast<int32_t>(top_k);
  MILES_RETURN_IF_ERROR(read(sp, "min_p", r.sampling.min_p, w));
  MILES_RETURN_IF_ERROR(read(sp, "max_new_tokens", r.max_new_tokens, w));
  MILES_RETURN_IF_ERROR(read(sp, "ignore_eos", r.ignore_eos, w));
  int64_t n = r.n;
  MILES_RETURN_IF_ERROR(read(sp, "n", n, w));
  if (n < 1 || n > 1024) return Status::Error(w + ".n = " + std::to_string(n) + " must be in [1, 1024]");
  r.n = static_cast<int32_t>(n);
  int64_t seed = static_cast<int64_t>(r.sampling.seed);
  MILES_RETURN_IF_ERROR(read(sp, "seed", seed, w));
  MILES_RETURN_IF_ERROR(read(sp, "sampling_seed", seed, w));
  r.sampling.seed = static_cast<uint64_t>(seed);
  for (const char* k : {"frequency_penalty", "presence_penalty"}) {
    double v = 0;
    MILES_RETURN_IF_ERROR(read(sp, k, v, w));
    if (v != 0) return Status::Error(w + "." + k + " is not supported (only 0)");
  }
  double rep = 1;
  MILES_RETURN_IF_ERROR(read(sp, "repetition_penalty", rep, w));
  if (rep != 1) return Status::Error(w + ".repetition_penalty is not supported (only 1)");
  if (auto it = sp.find("stop"); it != sp.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop_strings = {it->get<std::string>()};
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return Status::Error(w + ".stop must be a string or a list of strings");
        r.stop_strings.push_back(s.get<std::string>());
      }
    } else {
      return Status::Error(w + ".stop must be a string or a list of strings");
    }
  }
  if (auto it = sp.find("stop_token_ids"); it != sp.end() && !it->is_null()) {
    MILES_ASSIGN_OR_RETURN(r.stop_token_ids, read_ids(*it, w + ".stop_token_ids"));
  }
  return Status::Ok();
}

Result<GenerateCall> parse_generate(const json& body, const Tokenizer* tok) {
  GenerateCall c;
  MILES_RETURN_IF_ERROR(check_known(body,
                                    {"text", "input_ids", "sampling_params", "return_logprob",
                                     "return_routed_experts", "stream", "rid", "logprob_start_len",
                                     "top_logprobs_num", "return_text_in_logprobs"},
                                    "request"));
  const bool has_text = body.contains("text") && !body["text"].is_null();
  const bool has_ids = body.contains("input_ids") && !body["input_ids"].is_null();
  if (has_text == has_ids) return Status::Error("request: give exactly one of 'text' and 'input_ids'");
  if (has_ids) {
    MILES_ASSIGN_OR_RETURN(c.request.input_ids, read_ids(body["input_ids"], "input_ids"));
  } else {
    if (!body["text"].is_string()) return Status::Error("text must be a string");
    if (!tok) return Status::Error("text prompts need a tokenizer; this server has none (send input_ids)");
    c.request.input_ids = tok->encode(body["text"].get<std::string>(), /*add_special=*/true);
  }
  c.request.sampling.temperature = 1.0f;
  if (auto it = body.find("sampling_params"); it != body.end() && !it->is_null())
    MILES_RETURN_IF_ERROR(parse_sampling_params(*it, c.request));
  MILES_RETURN_IF_ERROR(read(body, "return_logprob", c.return_logprob, "request"));
  MILES_RETURN_IF_ERROR(read(body, "return_routed_experts", c.return_routed_experts, "request"));
  MILES_RETURN_IF_ERROR(read(body, "stream", c.stream, "request"));
  MILES_RETURN_IF_ERROR(read(body, "rid", c.rid, "request"));
  // Accepted for compatibility only at their "off" values: input-token and top-k logprobs are not
  // computed yet, and silently ignoring a request for them would hand back less than was asked.
  int64_t start_len = -1, top_n = 0;
  MILES_RETURN_IF_ERROR(read(body, "logprob_start_len", start_len, "request"));
  MILES_RETURN_IF_ERROR(read(body, "top_logprobs_num", top_n, "request"));
  if (start_len != -1)
    return Status::Error("logprob_start_len (input-token logprobs) is not supported; use miles score");
  if (top_n != 0) return Status::Error("top_logprobs_num is not supported");
  if (auto it = body.find("sampling_params"); it != body.end() && it->is_object())
    MILES_RETURN_IF_ERROR(read(*it, "no_stop_trim", c.no_stop_trim, "sampling_params"));
  return c;
}

json sample_json(const GenerateCall& call, const std::vector<TokenOutput>& output,
                 const SampleEvent* fin, const Tokenizer* tok, int64_t experts_per_token,
                 int64_t num_moe_layers) {
  std::vector<int32_t> ids;
  for (const auto& t : output) ids.push_back(t.id);
  json j;
  std::string text = tok ? tok->decode(ids) : "";
  if (fin && fin->finish_reason == FinishReason::kStop && !call.no_stop_trim && tok) {
    const bool by_string = std::find(call.request.stop_strings.begin(), call.request.stop_strings.end(),
                                     fin->matched_stop) != call.request.stop_strings.end();
    if (by_string) {
      const size_t at = text.find(fin->matched_stop);
      if (at != std::string::npos) text.resize(at);
    }
  }
  j["text"] = text;
  j["output_ids"] = ids;
  json meta;
  meta["id"] = call.rid;
  meta["completion_tokens"] = output.size();
  if (fin) {
    meta["prompt_tokens"] = fin->prompt_tokens;
    meta["cached_tokens"] = fin->cached_tokens;
    json reason = {{"type", finish_reason_name(fin->finish_reason)}};
    if (!fin->matched_stop.empty()) {
      if (fin->finish_reason == FinishReason::kStop &&
          std::find(call.request.stop_strings.begin(), call.request.stop_strings.end(),
                    fin->matched_stop) == call.request.stop_strings.end())
        reason["matched"] = std::stoi(fin->matched_stop);
      else
        reason["matched"] = fin->matched_stop;
    }
    meta["finish_reason"] = reason;
  } else {
    meta["finish_reason"] = nullptr;
  }
  if (call.return_logprob) {
    json lps = json::array(), raw = json::array(), versions = json::array();
    for (const auto& t : output) {
      lps.push_back(json::array({t.logprob, t.id, nullptr}));
      raw.push_back(t.raw_logprob);
      versions.push_back(t.weight_version);
    }
    meta["output_token_logprobs"] = lps;
    meta["output_token_raw_logprobs"] = raw;
    meta["output_token_weight_versions"] = versions;
  }
  if (!output.empty()) meta["weight_version"] = output.back().weight_version;
  if (call.return_routed_experts && fin && experts_per_token > 0) {
    meta["routed_experts"] = fin->routed_experts;  // flat [tokens - 1, moe layers, top_k]
    meta["routed_experts_shape"] = {
        static_cast<int64_t>(fin->routed_experts.size()) / experts_per_token, num_moe_layers,
        experts_per_token / std::max<int64_t>(1, num_moe_layers)};
  }
  j["meta_info"] = meta;
  return j;
}

}  // namespace miles::rollout
