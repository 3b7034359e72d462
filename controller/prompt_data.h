// PromptData: the prompts of an RL run (JSONL, one {"prompt": ..., "label": ...} per line),
// tokenized once, served as an endless deterministic stream of epochs.
//
// Why: a rollout step asks for "the next k prompts"; a resumed run must ask for the same ones.
// Position p of the stream is prompt order_e[p mod N] of epoch e = p / N, where order_e is a
// Fisher-Yates shuffle driven by mt19937_64(seed + e) (a fixed, portable generator) — so the
// stream is a pure function of (file, seed) and a checkpoint only stores the next position.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "miles/chat_template.h"
#include "miles/controller/run_config.h"
#include "miles/tokenizer.h"

namespace miles::controller {

struct Prompt {
  int64_t row = 0;                  // 0-based line among the file's prompts
  std::string text;                 // as rendered (chat template applied when asked)
  std::vector<int32_t> ids;         // what the engine is given
  nlohmann::json label;             // null when the row has none
  nlohmann::ordered_json messages;  // with apply_chat_template: the chat messages rendered
};

class PromptData {
 public:
  // Errors name the file and line: bad JSON, a missing or non-string prompt (or non-array messages
  // with apply_chat_template), an empty file, a prompt that encodes to nothing.
  static Result<PromptData> load(const DataSection& data, const Tokenizer& tokenizer,
                                 const ChatTemplate* chat);
  // The same from a stream (data.path names it in errors).
  static Result<PromptData> read(std::istream& in, const DataSection& data,
                                 const Tokenizer& tokenizer, const ChatTemplate* chat);
  int64_t size() const { return static_cast<int64_t>(prompts_.size()); }
  // The prompt at stream position `position` (>= 0).
  const Prompt& at(int64_t position) const;

 private:
  std::vector<Prompt> prompts_;
  bool shuffle_ = true;
  uint64_t seed_ = 1;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace miles::controller
