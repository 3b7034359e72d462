// SFT data: JSONL lines of {"text": …} or {"input_ids": […]} as training samples, and the batch of
// each step.
//
// Why: `miles sft` is the simplest whole use of the trainer and the way two parallel layouts are
// compared from the outside; its data must be read the same way by every rank and batched
// deterministically (step k takes lines [k·B, (k+1)·B) cyclically), so a resumed run continues
// where it stopped.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "miles/status.h"
#include "miles/tokenizer.h"
#include "miles/trainer/trainer.h"

namespace miles {

struct SftDataOptions {
  int64_t max_len = 256;  // sequences are cut to their first max_len tokens
  bool add_bos = true;    // text: prepend the tokenizer's BOS (when it has one)
};

// Every line becomes one sample whose response is every token after the first (loss mask 1).
// Errors name the file and line: bad JSON, neither or both of text / input_ids, ids outside
// [0, vocab), fewer than 2 tokens, text without a tokenizer.
Result<std::vector<TrainSample>> load_sft_jsonl(const std::string& path, const Tokenizer* tokenizer,
                                                int64_t vocab_size, const SftDataOptions& options);
// The same from a stream; `path` names it in errors.
Result<std::vector<TrainSample>> read_sft_jsonl(std::istream& in, const std::string& path,
                                                const Tokenizer* tokenizer, int64_t vocab_size,
                                                const SftDataOptions& options);

// The samples of step `step` (0-based): lines [step·B, (step+1)·B) taken cyclically.
std::vector<TrainSample> sft_batch(const std::vector<TrainSample>& data, int64_t step,
                                   int64_t batch_size);

}  // namespace miles
