// libFuzzer target: arbitrary bytes as the JSON files of a model directory a user points miles at:
// its config.json (parse_model_config: every supported architecture's fields and their
// cross-checks) and its tokenizer_config.json (ChatTemplate::from_tokenizer_config_text: the
// template in its forms and the special tokens, then rendered). Bad input must come back as an
// error value that names the file (no crash, no UB, no leak); a config that parses must write back
// (model_config_to_hf_json) to text that parses to the same config.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "miles/chat_template.h"
#include "miles/model_config.h"

namespace {

void tokenizer_config(const std::string& text) {
  auto ct = miles::ChatTemplate::from_tokenizer_config_text(text, "tokenizer_config.json", {});
  if (!ct.ok()) {
    if (ct.message().find("tokenizer_config.json") == std::string::npos) {
      std::fprintf(stderr, "an error that does not name the file: %s\n", ct.message().c_str());
      std::abort();
    }
    return;
  }
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}])");
  miles::RenderOptions options;
  options.add_generation_prompt = true;
  (void)ct->render(messages, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tokenizer_config(text);
  auto config = miles::parse_model_config(text, "config.json");
  if (!config.ok()) {
    if (config.message().find("config.json") == std::string::npos) {
      std::fprintf(stderr, "an error that does not name the file: %s\n", config.message().c_str());
      std::abort();
    }
    return 0;
  }
  // The derived shapes the model is built from.
  (void)config->rotary_dim();
  (void)config->embed_scale();
  (void)config->num_moe_layers();
  for (int64_t l = 0; l < std::min<int64_t>(config->num_layers, 256); ++l)
    (void)config->is_moe_layer(l);
  const std::string written = miles::model_config_to_hf_json(*config);
  auto again = miles::parse_model_config(written, "config.json");
  if (!again.ok() || miles::model_config_to_hf_json(*again) != written) {
    std::fprintf(stderr, "config.json does not read back: %s\n%s\n",
                 again.ok() ? "different fields" : again.message().c_str(), written.c_str());
    std::abort();
  }
  return 0;
}
