// libFuzzer target: arbitrary bytes as the body of the engine's HTTP routes — /generate
// (parse_generate, then a response built from the parsed call), /v1/completions and
// /v1/chat/completions (parse_completion, parse_chat), the weight-sync routes (route_bodies.h) —
// and as model text for the tool-call parser. Bad input must come back as an error value: no
// crash, no UB, no leak.
#include <cstddef>
#include <cstdint>
#include <string>

#include "miles/tokenizer.h"
#include "rollout/generate_api.h"
#include "rollout/http_common.h"
#include "rollout/openai_api.h"
#include "rollout/tool_calls.h"
#include "tests/fuzz/fuzz_tokenizer.h"
#include "weight_sync/route_bodies.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  const miles::Tokenizer* tok = miles::fuzz::test_tokenizer();
  miles::rollout::parse_tool_calls(body);
  auto json = miles::rollout::parse_json_body(body);
  if (!json.ok()) return 0;
  miles::parse_disk_delta_update(*json);
  miles::parse_join_weight_group(*json);
  miles::parse_group_update(*json);
  miles::parse_check_weights(*json);
  if (auto batch = miles::rollout::parse_generate(*json, tok); batch.ok()) {
    miles::rollout::ReplyContext ctx;
    ctx.tok = tok;
    for (const auto& call : batch->calls) {
      std::vector<miles::TokenOutput> out;
      for (int32_t id : call.request.input_ids)
        if (tok && id >= 0 && id < tok->vocab_size())
          out.push_back({id, -1.0f, -1.0f, 0, -1.0f, {}});
      miles::SampleEvent fin;
      fin.finished = true;
      fin.finish_reason = miles::FinishReason::kLength;
      fin.output = out;
      miles::rollout::sample_json(call, out, &fin, ctx);
    }
  }
  miles::rollout::parse_completion(*json, tok);
  miles::rollout::parse_chat(*json);
  return 0;
}
