// JSONL → TrainSample for SFT, and the deterministic per-step batch (sft_data.h).
#include "miles/trainer/sft_data.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "miles/json_text.h"

namespace miles {

namespace {

Result<std::vector<int32_t>> line_tokens(const nlohmann::json& j, const Tokenizer* tok,
                                         int64_t vocab, const SftDataOptions& o) {
  if (!j.is_object()) return Status::Error("expected a JSON object");
  const bool has_text = j.contains("text"), has_ids = j.contains("input_ids");
  if (has_text == has_ids) return Status::Error("needs exactly one of \"text\" or \"input_ids\"");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "text" && it.key() != "input_ids")
      return Status::Error("unknown field \"" + it.key() + "\"");
  std::vector<int32_t> ids;
  if (has_text) {
    if (!j["text"].is_string()) return Status::Error("\"text\" must be a string");
    if (!tok) return Status::Error("\"text\" needs a tokenizer (--tokenizer)");
    if (o.add_bos && tok->bos_id() >= 0) ids.push_back(tok->bos_id());
    const std::vector<int32_t> body = tok->encode(j["text"].get<std::string>(), false);
    ids.insert(ids.end(), body.begin(), body.end());
  } else {
    if (!j["input_ids"].is_array()) return Status::Error("\"input_ids\" must be an array");
    for (const auto& v : j["input_ids"]) {
      if (!v.is_number_integer()) return Status::Error("\"input_ids\" must hold integers");
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= vocab)
        return Status::Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (static_cast<int64_t>(ids.size()) > o.max_len) ids.resize(o.max_len);
  if (ids.size() < 2)
    return Status::Error("has " + std::to_string(ids.size()) +
                         " token(s); training needs at least 2");
  return ids;
}

}  // namespace

Result<std::vector<TrainSample>> load_sft_jsonl(const std::string& path, const Tokenizer* tokenizer,
                                                int64_t vocab_size, const SftDataOptions& options) {
  std::ifstream in(path);
  if (!in) return Status::Error("cannot open data file " + path);
  return read_sft_jsonl(in, path, tokenizer, vocab_size, options);
}

Result<std::vector<TrainSample>> read_sft_jsonl(std::istream& in, const std::string& path,
                                                const Tokenizer* tokenizer, int64_t vocab_size,
                                                const SftDataOptions& options) {
  if (options.max_len < 2) return Status::Error("max_len must be at least 2");
  std::vector<TrainSample> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = path + ":" + std::to_string(n) + ": ";
    nlohmann::json j = parse_json_or_discarded(line);
    if (j.is_discarded()) return Status::Error(at + "not valid JSON");
    auto ids = line_tokens(j, tokenizer, vocab_size, options);
    if (!ids.ok()) return ids.status().with_context(at.substr(0, at.size() - 2));
    TrainSample s;
    s.tokens = std::move(*ids);
    s.response_length = s.tokens.size() - 1;
    s.loss_mask.assign(s.response_length, 1.0f);
    out.push_back(std::move(s));
  }
  if (out.empty()) return Status::Error(path + ": no samples");
  return out;
}

std::vector<TrainSample> sft_batch(const std::vector<TrainSample>& data, int64_t step,
                                   int64_t batch_size) {
  std::vector<TrainSample> b;
  const int64_t n = data.size();
  for (int64_t i = 0; i < batch_size; ++i) b.push_back(data[(step * batch_size + i) % n]);
  return b;
}

}  // namespace miles
