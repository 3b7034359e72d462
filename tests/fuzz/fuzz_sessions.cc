// libFuzzer target: the TITO session record (rollout/sessions.h) under any sequence of an agent's
// chat requests. The input is a JSON array of requests, each the `messages` of one call to
// /sessions/{id}/v1/chat/completions; an engine is stood in for by a reply that ends its turn as
// the template renders it ("ok" then the template's end of turn, or the record it cannot extend).
// Every call must plan (append, branch, retry) or fail with an error value; after every committed
// turn the record must hold: one mask, logprob and version per token, the masks 1 exactly on the
// turns' outputs, the turns in order inside the record, the input the engine got equal to the kept
// record plus the appended ids, and the trajectory a training sample of the same tokens.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "miles/chat_template.h"
#include "miles/rollout/sessions.h"
#include "miles/tokenizer.h"
#include "rollout/chat_render.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

void fail(const char* what) {
  std::fprintf(stderr, "fuzz_sessions: %s\n", what);
  std::abort();
}

// SmolLM2's chat template (tests/data/chat) and a tokenizer with its special tokens.
struct Model {
  std::unique_ptr<miles::Tokenizer> tok;
  std::unique_ptr<miles::ChatTemplate> chat;
};

const Model& model() {
  static const Model m = [] {
    Model r;
    const std::string data = std::string(MILES_SOURCE_DIR) + "/tests/data/";
    auto tok = miles::load_tokenizer(data + "tokenizers/synthetic/smollm_style.json", 0);
    if (!tok.ok()) fail("the test tokenizer does not load");
    r.tok = std::move(tok).value();
    std::ifstream in(data + "chat/chat_goldens.json");
    const ordered_json goldens = ordered_json::parse(in, nullptr, false);
    if (goldens.is_discarded()) fail("tests/data/chat/chat_goldens.json does not parse");
    const ordered_json& t = goldens["templates"]["smollm2"];
    auto chat = miles::ChatTemplate::create(t["source"].get<std::string>(), "", "", "smollm2");
    if (!chat.ok()) fail("the SmolLM2 template does not compile");
    r.chat = std::make_unique<miles::ChatTemplate>(std::move(chat).value());
    return r;
  }();
  return m;
}

// The engine's stand-in: the ids of "ok" as the template closes an assistant turn after `prompt`
// (rendered with the request's messages), else the ids of "ok" alone.
std::vector<int32_t> reply_ids(const ordered_json& messages) {
  const Model& m = model();
  miles::RenderOptions gen;
  gen.add_generation_prompt = true;
  auto prompt = m.chat->render(messages, gen);
  ordered_json with_reply = messages;
  with_reply.push_back(ordered_json(miles::rollout::assistant_message("ok")));
  auto whole = m.chat->render(with_reply, miles::RenderOptions{});
  if (prompt.ok() && whole.ok() && whole->rfind(*prompt, 0) == 0)
    return m.tok->encode(whole->substr(prompt->size()), false);
  return m.tok->encode("ok", false);
}

void check_record(const miles::rollout::Session& s) {
  const size_t n = s.tokens.size();
  if (s.loss_mask.size() != n || s.logprobs.size() != n || s.raw_logprobs.size() != n ||
      s.weight_versions.size() != n)
    fail("the record's columns differ in length");
  std::vector<uint8_t> mask(n, 0);
  size_t end = 0;
  for (const miles::rollout::SessionTurn& t : s.turns) {
    if (t.prompt_start < end) fail("a turn starts inside the previous one");
    if (t.prompt_start > t.output_start || t.output_start > t.output_end || t.output_end > n)
      fail("a turn's ranges are out of order or outside the record");
    for (size_t i = t.output_start; i < t.output_end; ++i) mask[i] = 1;
    end = t.output_end;
  }
  if (!s.turns.empty() && end != n) fail("the record does not end with the last turn's output");
  if (mask != s.loss_mask) fail("the loss mask is not 1 exactly on the turns' outputs");
  if (s.turns.empty() || s.conversation.size() != s.turns.back().num_messages + 1)
    fail("the conversation is not the last request's messages and its reply");
  const json traj = miles::rollout::trajectory_json(s, 0, 0);
  if (traj["tokens"].get<std::vector<int32_t>>() != s.tokens) fail("the trajectory's tokens");
  if (traj["sampling_logprobs"].size() != n - s.turns[0].output_start)
    fail("the trajectory's logprobs are not aligned with the response");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ordered_json calls = ordered_json::parse(data, data + size, nullptr, false);
  if (calls.is_discarded() || !calls.is_array()) return 0;
  const Model& m = model();
  miles::rollout::Session s;
  int64_t version = 0;
  for (size_t c = 0; c < calls.size() && c < 8; ++c) {
    const ordered_json& messages = calls[c];
    auto plan = miles::rollout::plan_turn(s, messages, *m.chat, *m.tok, miles::RenderOptions{});
    if (!plan.ok()) {
      if (plan.message().empty()) fail("an error without a message");
      continue;
    }
    if (plan->keep_tokens > s.tokens.size() || plan->keep_turns > s.turns.size())
      fail("a plan keeps more than the record holds");
    std::vector<int32_t> want(s.tokens.begin(), s.tokens.begin() + plan->keep_tokens);
    want.insert(want.end(), plan->appended.begin(), plan->appended.end());
    if (plan->input_ids != want) fail("the engine's input is not the kept record + appended ids");
    if (plan->retry && !plan->appended.empty()) fail("a retry appends ids");
    miles::SampleEvent fin;
    fin.finished = true;
    fin.finish_reason = miles::FinishReason::kStop;
    ++version;
    for (int32_t id : reply_ids(messages))
      fin.output.push_back({id, -0.5f, -0.75f, version, -0.5f, {}, {}});
    miles::rollout::commit_turn(s, std::move(plan).value(), fin,
                                miles::rollout::assistant_message("ok"), 0);
    check_record(s);
  }
  return 0;
}
