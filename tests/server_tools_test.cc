// Tool calls end to end over real sockets: a scripted model (it "answers" with a fixed token
// sequence) behind the Qwen3 tokenizer and chat template; the OpenAI chat route turns its
// <tool_call> block into message.tool_calls, streamed and not, and the call goes back in the next
// turn. Also skip_special_tokens on /generate with a special token in the middle of the text.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "miles/chat_template.h"
#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"
#include "miles/rollout/http_server.h"
#include "test_paths.h"

namespace miles::rollout {
namespace {

using nlohmann::json;

// Answers any prompt with `script`: the token after position p is script[p + 1 - prompt_len]
// (one-hot logits), then `end` forever.
class ScriptedRunner final : public ModelRunner {
 public:
  ScriptedRunner(int64_t vocab, std::vector<int32_t> script, int32_t end)
      : script_(std::move(script)), end_(end) {
    config_.arch_name = "scripted";
    config_.vocab_size = vocab;
    config_.hidden_size = 4;
    config_.num_layers = 1;
    config_.num_heads = 1;
    config_.num_kv_heads = 1;
    config_.head_dim = 2;
    config_.max_position_embeddings = 4096;
  }
  void set_prompt_len(int64_t n) { prompt_len_ = n; }
  const ModelConfig& config() const override { return config_; }
  Result<ForwardOutput> forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                KvStore&, const ForwardOptions& options) override {
    ForwardOutput out;
    out.vocab = config_.vocab_size;
    int64_t rows = 0;
    for (const SeqSpan& s : seqs) rows += options.all_logits ? s.n_tokens : 1;
    out.rows = rows;
    out.logits.assign(static_cast<size_t>(rows * out.vocab), 0.0f);
    int64_t row = 0;
    for (const SeqSpan& s : seqs) {
      for (int64_t j = options.all_logits ? 0 : s.n_tokens - 1; j < s.n_tokens; ++j, ++row) {
        const int64_t k = s.start_pos + j + 1 - prompt_len_;
        const int32_t next = k >= 0 && k < static_cast<int64_t>(script_.size()) ? script_[k] : end_;
        out.logits[row * out.vocab + next] = 40.0f;
      }
    }
    return out;
  }

 private:
  ModelConfig config_;
  std::vector<int32_t> script_;
  int32_t end_;
  int64_t prompt_len_ = 0;
};

struct Scripted {
  std::shared_ptr<const Tokenizer> tok;
  std::shared_ptr<const ChatTemplate> chat;
  ScriptedRunner* runner = nullptr;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<EngineDriver> driver;
  std::unique_ptr<HttpServer> server;
  int32_t im_end = -1;

  explicit Scripted(const std::string& answer) {
    const std::string dir = test::shared_dir() + "/tokenizers/qwen3";
    auto t = load_tokenizer(dir + "/tokenizer.json", 0);
    EXPECT_TRUE(t.ok()) << t.message();
    tok = std::shared_ptr<const Tokenizer>(std::move(t).value());
    auto c = ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json");
    EXPECT_TRUE(c.ok()) << c.message();
    chat = std::make_shared<const ChatTemplate>(std::move(c).value());
    im_end = tok->encode("<|im_end|>", false).at(0);
    auto r =
        std::make_unique<ScriptedRunner>(tok->vocab_size(), tok->encode(answer, false), im_end);
    runner = r.get();
    pool = std::make_unique<ThreadPool>(1);
    driver = std::make_unique<EngineDriver>(
        std::make_unique<Engine>(std::move(r), EngineOptions{.num_blocks = 512}, tok));
    ServerOptions so;
    so.port = 0;
    server = std::make_unique<HttpServer>(*driver, runner->config(), tok, chat, pool.get(), so);
    EXPECT_TRUE(server->start().ok());
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(60, 0);
    return c;
  }
};

const json kTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "add"},
        {"description", "Adds two numbers"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"a", {{"type", "number"}}}, {"b", {{"type", "number"}}}}}}}}}}});

json chat_body(const json& messages, const Scripted& s, bool stream) {
  return {{"model", "miles"},
          {"messages", messages},
          {"tools", kTools},
          {"max_tokens", 64},
          {"temperature", 0},
          {"stream", stream},
          {"stop_token_ids", {s.im_end}}};
}

// The prompt length the runner scripts against: the request's rendered prompt.
void prime(Scripted& s, httplib::Client& c, const json& messages) {
  json probe = chat_body(messages, s, false);
  probe["max_tokens"] = 1;
  probe.erase("stop_token_ids");
  auto r = c.Post("/v1/chat/completions", probe.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  s.runner->set_prompt_len(json::parse(r->body)["prompt_token_ids"].size());
}

TEST(ServerTools, ChatToolCallsParsedStreamedAndSentBack) {
  MILES_REQUIRE_SHARED();
  Scripted s(
      "Let me add them.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n"
      "</tool_call>");
  auto c = s.client();
  const json messages = json::array({{{"role", "user"}, {"content", "What is 2 + 3?"}}});
  prime(s, c, messages);

  auto r = c.Post("/v1/chat/completions", chat_body(messages, s, false).dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  const json reply = json::parse(r->body);
  const json& choice = reply["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const json& message = choice["message"];
  EXPECT_EQ(message["content"], "Let me add them.");
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  const json& call = message["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "add");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"a", 2}, {"b", 3}}));

  // Streamed: the content before the block, never the block's text, then the call at the end.
  auto st = c.Post("/v1/chat/completions", chat_body(messages, s, true).dump(), "application/json");
  ASSERT_TRUE(st && st->status == 200);
  std::string content;
  json streamed_calls, last_finish;
  for (size_t at = st->body.find("data: {"); at != std::string::npos;
       at = st->body.find("data: {", at + 1)) {
    const json chunk = json::parse(st->body.substr(at + 6, st->body.find("\n\n", at) - at - 6));
    const json& ch = chunk["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (ch["delta"].contains("tool_calls")) streamed_calls = ch["delta"]["tool_calls"];
    if (!ch["finish_reason"].is_null()) last_finish = ch["finish_reason"];
  }
  EXPECT_EQ(content.find("<tool_call>"), std::string::npos) << content;
  EXPECT_NE(content.find("Let me add them."), std::string::npos) << content;
  ASSERT_EQ(streamed_calls.size(), 1u) << st->body;
  EXPECT_EQ(streamed_calls[0]["function"], call["function"]);
  EXPECT_EQ(last_finish, "tool_calls");

  // The round trip: the assistant's call and the tool's result render in the next turn.
  json next = messages;
  next.push_back(message);
  next.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "5"}});
  auto again = c.Post("/v1/chat/completions", chat_body(next, s, false).dump(), "application/json");
  ASSERT_TRUE(again && again->status == 200) << (again ? again->body : "no response");
  const json prompt_ids = json::parse(again->body)["prompt_token_ids"];
  std::vector<int32_t> ids = prompt_ids.get<std::vector<int32_t>>();
  const std::string rendered = s.tok->decode(ids);
  EXPECT_NE(rendered.find("<tool_call>"), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("\"add\""), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("<tool_response>"), std::string::npos) << rendered;

  // tool_choice "none": the same text stays content.
  json none = chat_body(messages, s, false);
  none["tool_choice"] = "none";
  auto plain = c.Post("/v1/chat/completions", none.dump(), "application/json");
  ASSERT_TRUE(plain && plain->status == 200);
  EXPECT_NE(json::parse(plain->body)["choices"][0]["message"]["content"].get<std::string>().find(
                "<tool_call>"),
            std::string::npos);
}

TEST(ServerTools, SkipSpecialTokensLeavesThemOutOfTheText) {
  MILES_REQUIRE_SHARED();
  Scripted s("Hello<|im_start|> world");
  auto c = s.client();
  const std::vector<int32_t> prompt = s.tok->encode("Say hello", false);
  s.runner->set_prompt_len(static_cast<int64_t>(prompt.size()));
  auto gen = [&](bool skip) {
    json body = {{"input_ids", prompt},
                 {"sampling_params",
                  {{"temperature", 0},
                   {"max_new_tokens", 16},
                   {"stop_token_ids", {s.im_end}},
                   {"skip_special_tokens", skip}}}};
    auto r = c.Post("/generate", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200);
    return r ? json::parse(r->body) : json();
  };
  const json skipped = gen(true), kept = gen(false);
  EXPECT_EQ(skipped["text"], "Hello world");  // SGLang's default
  EXPECT_EQ(kept["text"], "Hello<|im_start|> world");
  EXPECT_EQ(skipped["output_ids"], kept["output_ids"]);  // the ids keep everything, the stop too
  EXPECT_EQ(skipped["output_ids"].back(), s.im_end);
  EXPECT_EQ(skipped["meta_info"]["finish_reason"]["matched"], s.im_end);
}

}  // namespace
}  // namespace miles::rollout
