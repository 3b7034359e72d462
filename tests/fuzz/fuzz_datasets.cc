// libFuzzer target: arbitrary bytes as the JSONL files a user's job reads — an RL run's prompts
// (PromptData, as text and as chat messages through a chat template) and `miles sft`'s samples
// (read_sft_jsonl, text and input_ids). Bad input must come back as an error value (no crash, no
// UB, no leak); what is read must hold: every prompt encodes to ids in the vocabulary, each epoch
// serves every prompt once, every SFT sample has 2..max_len ids in the vocabulary and its mask.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "controller/prompt_data.h"
#include "miles/chat_template.h"
#include "miles/trainer/sft_data.h"
#include "tests/fuzz/fuzz_tokenizer.h"

namespace {

void fail(const char* what) {
  std::fprintf(stderr, "fuzz_datasets: %s\n", what);
  std::abort();
}

const miles::ChatTemplate* chat() {
  static const auto t = miles::ChatTemplate::create(
      "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}",
      "<s>", "</s>", "fuzz");
  return t.ok() ? &*t : nullptr;
}

bool ids_in_vocab(const std::vector<int32_t>& ids, int32_t vocab) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) return false;
  return true;
}

void prompts(const std::string& text, const miles::Tokenizer& tok, bool templated) {
  miles::DataSection data;
  data.path = "fuzz.jsonl";
  data.apply_chat_template = templated;
  std::istringstream in(text);
  auto d = miles::controller::PromptData::read(in, data, tok, templated ? chat() : nullptr);
  if (!d.ok()) {
    if (d.message().empty()) fail("an error without a message");
    return;
  }
  const int64_t n = d->size();
  if (n <= 0) fail("no prompts, no error");
  for (int64_t epoch = 0; epoch < 2; ++epoch) {  // each epoch a permutation of the rows
    std::vector<char> seen(n, 0);
    for (int64_t p = epoch * n; p < (epoch + 1) * n; ++p) {
      const miles::controller::Prompt& pr = d->at(p);
      if (pr.row < 0 || pr.row >= n || seen[pr.row]++) fail("an epoch is not a permutation");
      if (pr.ids.empty() || !ids_in_vocab(pr.ids, tok.vocab_size())) fail("bad prompt ids");
    }
  }
}

void sft(const std::string& text, const miles::Tokenizer& tok) {
  miles::SftDataOptions options;
  options.max_len = 64;
  std::istringstream in(text);
  auto samples = miles::read_sft_jsonl(in, "fuzz.jsonl", &tok, tok.vocab_size(), options);
  if (!samples.ok()) {
    if (samples.message().empty()) fail("an error without a message");
    return;
  }
  if (samples->empty()) fail("no samples, no error");
  for (const miles::TrainSample& s : *samples) {
    const int64_t t = static_cast<int64_t>(s.tokens.size());
    if (t < 2 || t > options.max_len || !ids_in_vocab(s.tokens, tok.vocab_size()))
      fail("a sample's ids");
    if (s.response_length != t - 1 || static_cast<int64_t>(s.loss_mask.size()) != t - 1)
      fail("a sample's response or mask");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const miles::Tokenizer* tok = miles::fuzz::test_tokenizer();
  if (!tok) fail("the test tokenizer does not load");
  if (!chat()) fail("the test chat template does not compile");
  const std::string text(reinterpret_cast<const char*>(data), size);
  prompts(text, *tok, /*templated=*/false);
  prompts(text, *tok, /*templated=*/true);
  sft(text, *tok);
  return 0;
}
