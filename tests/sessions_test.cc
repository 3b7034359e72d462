// TITO sessions over HTTP with SmolLM2-135M-Instruct (skipped when models/ lacks it): a greedy
// agent loop (system + user, a calculator tool result, a user turn, a mid-conversation system
// message with a user turn, a retry of that turn, a retry of an earlier turn) whose trajectory is
// exactly the engine's token record, with zero special-token and non-assistant-text mismatches
// against the rendered conversation, the loss mask on generated ids only, and a first turn
// identical (ids and logprobs, bitwise) to /generate and to plain /v1/chat/completions. Edits of
// earlier turns, and appending to a reply cut by max_tokens, are rejected with the session
// unchanged (a retry recovers); unknown sessions are 404. session_record_test covers the store and
// the record without a model.
#include "miles/rollout/sessions.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "miles/chat_template.h"
#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"
#include "miles/rollout/http_server.h"
#include "test_paths.h"

namespace miles::rollout {
namespace {

using nlohmann::json;

std::vector<int32_t> ids(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string model_dir() { return test::source_dir() + "/models/smollm2-135m-instruct"; }

#define MILES_REQUIRE_SMOLLM2()                                                             \
  do {                                                                                      \
    if (!std::filesystem::exists(model_dir() + "/model.safetensors"))                       \
      GTEST_SKIP() << model_dir() << " not found: run scripts/get_models.sh to install it"; \
  } while (0)

class Sessions : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_dir() + "/model.safetensors")) return;
    auto m = Model::load(model_dir());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = new std::shared_ptr<const Model>(std::move(m).value());
    auto t = load_tokenizer(model_dir() + "/tokenizer.json",
                            static_cast<int32_t>((*model_)->config().vocab_size));
    ASSERT_TRUE(t.ok()) << t.message();
    tok_ = new std::shared_ptr<const Tokenizer>(std::move(t).value());
    auto c = ChatTemplate::from_tokenizer_config(model_dir() + "/tokenizer_config.json");
    ASSERT_TRUE(c.ok()) << c.message();
    chat_ = new std::shared_ptr<const ChatTemplate>(
        std::make_shared<const ChatTemplate>(std::move(c).value()));
    pool_ = new ThreadPool(2);
    driver_ = new EngineDriver(std::make_unique<Engine>(make_model_runner(*model_, pool_),
                                                        EngineOptions{.num_blocks = 512}, *tok_));
    ServerOptions so;
    so.port = 0;
    server_ = new HttpServer(*driver_, (*model_)->config(), *tok_, *chat_, pool_, so);
    Status s = server_->start();
    ASSERT_TRUE(s.ok()) << s.message();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete driver_;
    delete pool_;
    delete chat_;
    delete tok_;
    delete model_;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(300, 0);
    return c;
  }
  static json call(const std::string& method, const std::string& path, const json& body,
                   int* status) {
    auto c = client();
    httplib::Result r = method == "GET"      ? c.Get(path)
                        : method == "DELETE" ? c.Delete(path)
                                             : c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << "no response from " << path;
    if (!r) return json();
    *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  static json ok(const std::string& method, const std::string& path, const json& body = {}) {
    int status = 0;
    json j = call(method, path, body, &status);
    EXPECT_EQ(status, 200) << method << " " << path << ": " << j.dump();
    return j;
  }
  static json chat_body(const json& messages) {
    return {{"messages", messages}, {"temperature", 0}, {"max_tokens", 96}, {"logprobs", true}};
  }

  static std::shared_ptr<const Model>* model_;
  static std::shared_ptr<const Tokenizer>* tok_;
  static std::shared_ptr<const ChatTemplate>* chat_;
  static ThreadPool* pool_;
  static EngineDriver* driver_;
  static HttpServer* server_;
};
std::shared_ptr<const Model>* Sessions::model_ = nullptr;
std::shared_ptr<const Tokenizer>* Sessions::tok_ = nullptr;
std::shared_ptr<const ChatTemplate>* Sessions::chat_ = nullptr;
ThreadPool* Sessions::pool_ = nullptr;
EngineDriver* Sessions::driver_ = nullptr;
HttpServer* Sessions::server_ = nullptr;

const json kFirst = json::array(
    {{{"role", "system"},
      {"content", "You are a helpful assistant with a calculator. Answer in one short sentence."}},
     {{"role", "user"}, {"content", "What is 17 times 23?"}}});

// Splits `rendered` (the whole conversation, no generation prompt) around the generated part of
// each assistant reply (content + <|im_end|>): the texts the loss-mask-0 spans must decode to.
std::vector<std::string> non_assistant_texts(const std::string& rendered,
                                             const std::vector<std::string>& replies) {
  std::vector<std::string> out;
  size_t at = 0;
  for (const std::string& r : replies) {
    const std::string generated = "<|im_start|>assistant\n" + r + "<|im_end|>";
    const size_t found = rendered.find(generated, at);
    if (found == std::string::npos) return {};
    const size_t gen_start = found + std::string("<|im_start|>assistant\n").size();
    out.push_back(rendered.substr(at, gen_start - at));
    at = gen_start + r.size() + std::string("<|im_end|>").size();
  }
  return out;  // what follows the last reply ("\n") is not in the record
}

TEST_F(Sessions, AgentLoopTrajectoryIsTheEngineRecord) {
  MILES_REQUIRE_SMOLLM2();
  const std::string sid = ok("POST", "/sessions")["session_id"];
  const std::string url = "/sessions/" + sid + "/v1/chat/completions";
  const Tokenizer& tok = **tok_;

  // Turn 1: system + user. Turn 2: + reply + calculator result. Turn 3: + reply + user.
  // Turn 4: + reply + a system message in mid-conversation + user.
  json m1 = kFirst;
  json t1 = ok("POST", url, chat_body(m1));
  json m2 = m1;
  m2.push_back(t1["choices"][0]["message"]);
  m2.push_back({{"role", "tool"}, {"content", "calculator: 17 * 23 = 391"}});
  json t2 = ok("POST", url, chat_body(m2));
  json m3 = m2;
  m3.push_back(t2["choices"][0]["message"]);
  m3.push_back({{"role", "user"}, {"content", "Now add 9 to that."}});
  json t3 = ok("POST", url, chat_body(m3));
  json m4 = m3;
  m4.push_back(t3["choices"][0]["message"]);
  m4.push_back({{"role", "system"}, {"content", "From now on, reply with the number only."}});
  m4.push_back({{"role", "user"}, {"content", "And minus 5?"}});
  json t4 = ok("POST", url, chat_body(m4));
  for (const json* t : {&t1, &t2, &t3, &t4}) {
    ASSERT_EQ((*t)["choices"][0]["finish_reason"], "stop") << t->dump();
    std::printf("[ sessions ] reply: %s\n",
                (*t)["choices"][0]["message"]["content"].get<std::string>().c_str());
  }
  const json traj = ok("GET", "/sessions/" + sid + "/trajectory");

  // The retry of turn 4 (same messages): rolled back, same output under greedy, same record.
  json t4b = ok("POST", url, chat_body(m4));
  EXPECT_TRUE(t4b["miles"]["retry"].get<bool>());
  EXPECT_EQ(t4b["miles"]["output_ids"], t4["miles"]["output_ids"]);
  EXPECT_EQ(t4b["miles"]["raw_logprobs"], t4["miles"]["raw_logprobs"]);
  EXPECT_EQ(ok("GET", "/sessions/" + sid + "/trajectory"), traj);

  // (a) tokens: first prompt, then each turn's output and each appended segment, token for token.
  std::vector<int32_t> want, mask;
  std::vector<double> raw;
  for (const json* t : {&t1, &t2, &t3, &t4}) {
    const auto p = ids((*t)["miles"]["prompt_ids"]), o = ids((*t)["miles"]["output_ids"]);
    EXPECT_EQ((*t)["miles"]["kept_tokens"].get<size_t>(), want.size());
    want.insert(want.end(), p.begin(), p.end());
    mask.insert(mask.end(), p.size(), 0);
    raw.insert(raw.end(), p.size(), 0.0);
    want.insert(want.end(), o.begin(), o.end());
    mask.insert(mask.end(), o.size(), 1);
    for (const auto& x : (*t)["miles"]["raw_logprobs"]) raw.push_back(x.get<double>());
  }
  const std::vector<int32_t> tokens = ids(traj["tokens"]);
  EXPECT_EQ(tokens, want);
  // (c) the loss mask is 1 exactly on generated ids; rollout_logprobs are theirs, 0 elsewhere.
  EXPECT_EQ(traj["loss_mask"].get<std::vector<int32_t>>(), mask);
  const size_t response_start = t1["miles"]["prompt_ids"].size();
  EXPECT_EQ(traj["response_start"].get<size_t>(), response_start);
  EXPECT_EQ(traj["rollout_logprobs"].get<std::vector<double>>(),
            std::vector<double>(raw.begin() + response_start, raw.end()));
  EXPECT_EQ(traj["turns"].size(), 4u);

  // (b) against the whole conversation rendered and tokenized fresh.
  json full = m4;
  full.push_back(t4["choices"][0]["message"]);
  auto rendered = (*chat_)->render(full, RenderOptions{});
  ASSERT_TRUE(rendered.ok()) << rendered.message();
  const std::vector<int32_t> fresh = tok.encode(*rendered, /*add_special=*/false);
  const int32_t im_start = tok.encode("<|im_start|>", false).at(0);
  const int32_t im_end = tok.encode("<|im_end|>", false).at(0);
  auto specials = [&](const std::vector<int32_t>& v) {
    return std::count(v.begin(), v.end(), im_start) + std::count(v.begin(), v.end(), im_end);
  };
  const int64_t special_mismatches = std::abs(specials(tokens) - specials(fresh));
  std::vector<std::string> zero_spans;
  for (size_t i = 0; i < tokens.size();) {
    size_t j = i;
    while (j < tokens.size() && mask[j] == mask[i]) ++j;
    if (mask[i] == 0) zero_spans.push_back(tok.decode(std::span(tokens).subspan(i, j - i)));
    i = j;
  }
  std::vector<std::string> replies;
  for (const json* t : {&t1, &t2, &t3, &t4})
    replies.push_back((*t)["choices"][0]["message"]["content"].get<std::string>());
  const std::vector<std::string> want_spans = non_assistant_texts(*rendered, replies);
  ASSERT_EQ(zero_spans.size(), want_spans.size());
  int text_mismatches = 0;
  for (size_t i = 0; i < zero_spans.size(); ++i) text_mismatches += zero_spans[i] != want_spans[i];
  std::printf(
      "[ sessions ] 4 turns (system, user, tool, user, system + user) + 1 retry: %zu tokens (%zu "
      "generated), %lld special tokens, "
      "special-token mismatches %lld, non-assistant text mismatches %d/%zu spans; fresh "
      "tokenization %s the record\n",
      tokens.size(), static_cast<size_t>(std::count(mask.begin(), mask.end(), 1)),
      static_cast<long long>(specials(tokens)), static_cast<long long>(special_mismatches),
      text_mismatches, zero_spans.size(),
      std::vector<int32_t>(fresh.begin(), fresh.end() - 1) == tokens ? "equals" : "differs from");
  EXPECT_EQ(special_mismatches, 0);
  EXPECT_EQ(text_mismatches, 0);

  // (d) the first turn equals /generate on its prompt ids and plain /v1/chat/completions.
  const json gen = ok("POST", "/generate",
                      {{"input_ids", t1["miles"]["prompt_ids"]},
                       {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 96}}},
                       {"return_logprob", true}});
  EXPECT_EQ(gen["output_ids"], t1["miles"]["output_ids"]);
  EXPECT_EQ(gen["meta_info"]["output_token_raw_logprobs"], t1["miles"]["raw_logprobs"]);
  // The session records the sampling logprob (0 for greedy), /generate's explicit field.
  EXPECT_EQ(gen["meta_info"]["output_token_sampling_logprobs"], t1["miles"]["logprobs"]);
  json plain_body = chat_body(m1);
  plain_body["skip_special_tokens"] = false;  // the session's text keeps them
  const json plain = ok("POST", "/v1/chat/completions", plain_body);
  EXPECT_EQ(plain["prompt_token_ids"], t1["miles"]["prompt_ids"]);
  EXPECT_EQ(plain["choices"][0]["token_ids"], t1["miles"]["output_ids"]);
  EXPECT_EQ(plain["choices"][0]["message"], t1["choices"][0]["message"]);
  const json& content = plain["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), t1["miles"]["output_ids"].size());
  for (size_t i = 0; i < content.size(); ++i) {
    // OpenAI's logprob is SGLang's convention: for this greedy request, the model's log-softmax.
    EXPECT_EQ(content[i]["logprob"], t1["miles"]["raw_logprobs"][i]) << i;
    EXPECT_EQ(content[i]["raw_logprob"], t1["miles"]["raw_logprobs"][i]) << i;
  }

  // Retrying turn 2 drops turns 3 and 4: the record ends with turn 2's (identical) output.
  json t2b = ok("POST", url, chat_body(m2));
  EXPECT_EQ(t2b["miles"]["output_ids"], t2["miles"]["output_ids"]);
  const json traj2 = ok("GET", "/sessions/" + sid + "/trajectory");
  EXPECT_EQ(traj2["turns"].size(), 2u);
  const size_t end2 = traj["turns"][1]["output_end"];
  EXPECT_EQ(ids(traj2["tokens"]), std::vector<int32_t>(tokens.begin(), tokens.begin() + end2));
  ok("DELETE", "/sessions/" + sid);
}

TEST_F(Sessions, EditsAreRejectedAndUnknownSessionsAre404) {
  MILES_REQUIRE_SMOLLM2();
  const std::string sid = ok("POST", "/sessions", {{"session_id", "edit-me"}})["session_id"];
  EXPECT_EQ(sid, "edit-me");
  int status = 0;
  call("POST", "/sessions", {{"session_id", "edit-me"}}, &status);
  EXPECT_EQ(status, 409);
  call("POST", "/sessions", {{"session_id", "bad id"}}, &status);
  EXPECT_EQ(status, 400);
  const std::string base = "/sessions/" + sid;
  json turn = ok("POST", base + "/v1/chat/completions", chat_body(kFirst));
  ASSERT_EQ(turn["choices"][0]["finish_reason"], "stop") << turn.dump();
  const json before = ok("GET", base + "/trajectory");

  // An earlier user turn edited: not an extension of the record.
  json edited = kFirst;
  edited[1]["content"] = "What is 17 times 24?";
  edited.push_back(turn["choices"][0]["message"]);
  edited.push_back({{"role", "user"}, {"content", "Are you sure?"}});
  json err = call("POST", base + "/v1/chat/completions", chat_body(edited), &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(err["error"]["message"].get<std::string>().find("message 1"), std::string::npos)
      << err.dump();
  // The assistant reply rewritten by the client: also rejected.
  json rewritten = kFirst;
  rewritten.push_back({{"role", "assistant"}, {"content", "It is 391."}});
  rewritten.push_back({{"role", "user"}, {"content", "Are you sure?"}});
  call("POST", base + "/v1/chat/completions", chat_body(rewritten), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(ok("GET", base + "/trajectory"), before);

  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/sessions/nope/v1/chat/completions"},
           {"GET", "/sessions/nope/trajectory"},
           {"DELETE", "/sessions/nope"}}) {
    call(method, path, chat_body(kFirst), &status);
    EXPECT_EQ(status, 404) << method << " " << path;
  }
  ok("DELETE", base);

  // A reply cut by max_tokens has no stop token: the record does not end where the template ends
  // the turn, so appending to it is refused; retrying the turn with room to finish recovers.
  const std::string cut = "/sessions/" + ok("POST", "/sessions")["session_id"].get<std::string>();
  json short_body = chat_body(kFirst);
  short_body["max_tokens"] = 2;
  json t = ok("POST", cut + "/v1/chat/completions", short_body);
  ASSERT_EQ(t["choices"][0]["finish_reason"], "length");
  const json cut_before = ok("GET", cut + "/trajectory");
  json next = kFirst;
  next.push_back(t["choices"][0]["message"]);
  next.push_back({{"role", "user"}, {"content", "Go on."}});
  err = call("POST", cut + "/v1/chat/completions", chat_body(next), &status);
  EXPECT_EQ(status, 400);
  std::printf("[ sessions ] after a cut reply: %s\n", err["error"]["message"].dump().c_str());
  EXPECT_EQ(ok("GET", cut + "/trajectory"), cut_before);
  t = ok("POST", cut + "/v1/chat/completions", chat_body(kFirst));
  EXPECT_TRUE(t["miles"]["retry"].get<bool>());
  EXPECT_EQ(t["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ok("GET", cut + "/trajectory")["turns"].size(), 1u);
  call("GET", base + "/trajectory", {}, &status);
  EXPECT_EQ(status, 404);
}

}  // namespace
}  // namespace miles::rollout
