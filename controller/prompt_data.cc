// PromptData (prompt_data.h): JSONL parsing, tokenization, the per-epoch shuffle.
#include "controller/prompt_data.h"

#include <fstream>
#include <numeric>
#include <random>

#include "miles/json_text.h"

namespace miles::controller {

using nlohmann::json;

Result<PromptData> PromptData::load(const DataSection& data, const Tokenizer& tokenizer,
                                    const ChatTemplate* chat) {
  std::ifstream in(data.path);
  if (!in) return Status::Error("cannot open data.path " + data.path);
  return read(in, data, tokenizer, chat);
}

Result<PromptData> PromptData::read(std::istream& in, const DataSection& data,
                                    const Tokenizer& tokenizer, const ChatTemplate* chat) {
  PromptData d;
  d.shuffle_ = data.shuffle;
  d.seed_ = data.seed;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = data.path + ":" + std::to_string(lineno) + ": ";
    json row = parse_json_or_discarded(line);
    if (row.is_discarded() || !row.is_object()) return Status::Error(where + "not a JSON object");
    if (!row.contains(data.prompt_key))
      return Status::Error(where + "no \"" + data.prompt_key + "\" (data.prompt_key)");
    Prompt p;
    p.row = static_cast<int64_t>(d.prompts_.size());
    p.label = row.contains(data.label_key) ? row[data.label_key] : json();
    const json& pr = row[data.prompt_key];
    if (data.apply_chat_template) {
      if (!chat) return Status::Error("data.apply_chat_template: the model has no chat template");
      nlohmann::ordered_json messages;
      if (pr.is_string()) {
        messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", pr}}});
      } else if (pr.is_array()) {
        messages = nlohmann::ordered_json::parse(pr.dump());
      } else {
        return Status::Error(where + "\"" + data.prompt_key +
                             "\" must be a string or an array of chat messages");
      }
      p.messages = messages;
      RenderOptions ro;
      ro.add_generation_prompt = true;
      auto text = chat->render(messages, ro);
      if (!text.ok()) return Status::Error(where + text.message());
      p.text = *text;
      p.ids = tokenizer.encode(p.text, /*add_special=*/false);
    } else {
      if (!pr.is_string())
        return Status::Error(where + "\"" + data.prompt_key + "\" must be a string");
      p.text = pr.get<std::string>();
      p.ids = tokenizer.encode(p.text, /*add_special=*/true);
    }
    if (p.ids.empty()) return Status::Error(where + "the prompt encodes to no tokens");
    d.prompts_.push_back(std::move(p));
  }
  if (d.prompts_.empty()) return Status::Error("data.path " + data.path + " holds no prompts");
  return d;
}

const Prompt& PromptData::at(int64_t position) const {
  const int64_t n = size();
  const int64_t epoch = position / n;
  if (!shuffle_) return prompts_[position % n];
  if (epoch != cached_epoch_) {
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(order_[i], order_[static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1))]);
    cached_epoch_ = epoch;
  }
  return prompts_[order_[position % n]];
}

}  // namespace miles::controller
