// ChatTemplate against transformers' apply_chat_template on the real Qwen3 and SmolLM2 templates
// (tests/data/chat/chat_goldens.json, from scripts/make_chat_goldens.py), and the TITO append rule:
// which conversations are append-only, the ids it appends, and its errors.
#include "miles/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace miles {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& goldens() {
  static const ojson doc = [] {
    std::ifstream in(test::data_dir() + "/chat/chat_goldens.json");
    EXPECT_TRUE(in) << "missing tests/data/chat/chat_goldens.json";
    std::stringstream ss;
    ss << in.rdbuf();
    return ojson::parse(ss.str());
  }();
  return doc;
}

ChatTemplate golden_template(const std::string& name) {
  const ojson& t = goldens()["templates"][name];
  const ojson& sp = t["special_tokens"];
  auto ct = ChatTemplate::create(t["source"].get<std::string>(), sp.value("bos_token", ""),
                                 sp.value("eos_token", ""), name);
  EXPECT_TRUE(ct.ok()) << ct.message();
  return std::move(ct).value();
}

RenderOptions options_of(const ojson& c, bool add_generation_prompt) {
  RenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.tools = c["tools"];
  o.kwargs = c["kwargs"];
  return o;
}

// Byte-level tokenizer that knows the chat special tokens: each special token is one id, every
// other byte is its own id. Decode gives special tokens' text (as HF's
// decode(skip_special_tokens=False)).
class TestTokenizer : public Tokenizer {
 public:
  TestTokenizer() {
    for (const char* s :
         {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>",
          "</think>", "<tool_response>", "</tool_response>"})
      specials_.push_back(s);
  }
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size();) {
      bool matched = false;
      for (size_t k = 0; k < specials_.size(); ++k) {
        if (text.compare(i, specials_[k].size(), specials_[k]) == 0) {
          ids.push_back(256 + static_cast<int32_t>(k));
          i += specials_[k].size();
          matched = true;
          break;
        }
      }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += decode_piece(-1, id);
    return out;
  }
  std::string decode_piece(int32_t, int32_t id) const override { return token_text(id); }
  int32_t vocab_size() const override { return 256 + static_cast<int32_t>(specials_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 256 + 1; }
  std::string token_text(int32_t id) const override {
    return id < 256 ? std::string(1, static_cast<char>(id))
                    : specials_[static_cast<size_t>(id - 256)];
  }

 private:
  std::vector<std::string> specials_;
};

TEST(ChatTemplate, RendersLikeTransformersOnEveryGolden) {
  std::map<std::string, ChatTemplate> templates;
  for (const auto& [name, t] : goldens()["templates"].items())
    templates.emplace(name, golden_template(name));
  int rendered = 0, errors = 0;
  for (const ojson& c : goldens()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const ChatTemplate& ct = templates.at(c["template"].get<std::string>());
    auto out = ct.render(c["messages"], options_of(c, c["add_generation_prompt"]));
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << out.message();
      EXPECT_EQ(out.value(), c["expected"].get<std::string>());
      ++rendered;
    } else {
      EXPECT_FALSE(out.ok()) << "transformers raised " << c["error"];
      ++errors;
    }
  }
  EXPECT_GE(rendered, 30);
  EXPECT_GE(errors, 1);
}

TEST(ChatTemplate, LoadsFromTokenizerConfig) {
  const std::string dir = test::shared_dir() + "/tokenizers/qwen3";
  if (!std::filesystem::exists(dir + "/tokenizer_config.json")) GTEST_SKIP() << dir << " not found";
  auto ct = ChatTemplate::from_tokenizer_config(dir);
  ASSERT_TRUE(ct.ok()) << ct.message();
  for (const ojson& c : goldens()["cases"]) {
    if (c["template"] != "qwen3" || !c.contains("expected")) continue;
    auto out = ct->render(c["messages"], options_of(c, c["add_generation_prompt"]));
    ASSERT_TRUE(out.ok()) << out.message();
    EXPECT_EQ(out.value(), c["expected"].get<std::string>()) << c["name"];
  }
}

TEST(ChatTemplate, TokenizerConfigWithANumberBeyondADoubleIsAnError) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "chat_template_overflow";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": "{{ messages[0]['content'] }}", "model_max_length": 1e999})";
  auto ct = ChatTemplate::from_tokenizer_config(dir.string());
  ASSERT_FALSE(ct.ok());  // nlohmann's out_of_range, not a parse_error: an error, no crash
  EXPECT_NE(ct.message().find("invalid JSON"), std::string::npos) << ct.message();
  EXPECT_NE(ct.message().find("number overflow"), std::string::npos) << ct.message();
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplate, TokenizerConfigForms) {
  const ojson hi = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  const auto render = [&](const std::string& text, const ChatTemplate::JinjaFile& jinja = {}) {
    auto ct = ChatTemplate::from_tokenizer_config_text(text, "tc.json", jinja);
    return ct.ok() ? ct->render(hi, RenderOptions{}) : Result<std::string>(ct.status());
  };
  // A list of named templates: "default" is taken; entries of other shapes are skipped.
  auto listed = render(R"({"chat_template": [7, {"name": 5, "template": "no"},
      {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ bos_token }}d"}],
      "bos_token": {"content": "<s>", "lstrip": false}})");
  ASSERT_TRUE(listed.ok()) << listed.message();
  EXPECT_EQ(*listed, "<s>d");
  auto none = render(R"({"chat_template": [{"name": "default", "template": 1}, {"name": []}]})");
  EXPECT_NE(none.message().find("tc.json: chat_template: no template named \"default\""),
            std::string::npos)
      << none.message();
  // No chat_template: chat_template.jinja beside it, read only then.
  int reads = 0;
  const ChatTemplate::JinjaFile jinja = [&]() -> Result<std::string> {
    ++reads;
    return std::string("j:{{ messages[0]['content'] }}");
  };
  auto from_jinja = render(R"({"eos_token": "</s>"})", jinja);
  ASSERT_TRUE(from_jinja.ok()) << from_jinja.message();
  EXPECT_EQ(*from_jinja, "j:hi");
  EXPECT_EQ(reads, 1);
  ASSERT_TRUE(render(R"({"chat_template": "x"})", jinja).ok());
  EXPECT_EQ(reads, 1);
  EXPECT_NE(render("{}").message().find("no chat_template (and no chat_template.jinja)"),
            std::string::npos);
  // The file form: the directory's chat_template.jinja.
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "chat_template_jinja_file";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << "{}";
  std::ofstream(dir / "chat_template.jinja") << "f:{{ messages[0]['content'] }}";
  auto ct = ChatTemplate::from_tokenizer_config(dir.string());
  ASSERT_TRUE(ct.ok()) << ct.message();
  EXPECT_EQ(*ct->render(hi, RenderOptions{}), "f:hi");
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplate, UserErrorsAreStatuses) {
  const ChatTemplate ct = golden_template("qwen3");
  RenderOptions o;
  EXPECT_NE(ct.render(ojson::object(), o).message().find("messages must be a JSON array"),
            std::string::npos);
  EXPECT_NE(ct.render(ojson::array(), o).message().find("empty conversation"), std::string::npos);
  EXPECT_NE(
      ct.render(ojson::parse(R"([{"content": "x"}])"), o).message().find("messages[0]: 'role'"),
      std::string::npos);
  o.kwargs = {{"messages", 1}};
  EXPECT_NE(ct.render(ojson::parse(R"([{"role": "user", "content": "x"}])"), o)
                .message()
                .find("reserved"),
            std::string::npos);
  // A content that is not a string reaches the template, which fails on it with its line.
  RenderOptions plain;
  auto bad = ct.render(ojson::parse(R"([{"role": "user", "content": 5}])"), plain);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("template 'qwen3' line "), std::string::npos) << bad.message();

  auto malformed = ChatTemplate::create(
      "{% for m in messages %}\n{{ m.content | shout }}\n{% endfor %}", "", "", "bad");
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.message().find("template 'bad' line 2: unknown filter 'shout'"),
            std::string::npos)
      << malformed.message();
  auto unclosed = ChatTemplate::create("{% for m in messages %}\n{{ m.content }}\n", "", "", "bad");
  ASSERT_FALSE(unclosed.ok());
  EXPECT_NE(unclosed.message().find("the 'for' block opened on line 1 is not closed"),
            std::string::npos)
      << unclosed.message();
}

// ---- TITO ---------------------------------------------------------------------------------------

struct Record {
  ojson messages;            // the conversation as messages
  std::vector<int32_t> ids;  // its token record
};

// A conversation whose last assistant turn the model produced: the prompt's ids, then `output` and
// the stop token, as the engine records them.
Record generate(const ChatTemplate& ct, const Tokenizer& tok, const ojson& prompt_messages,
                const ojson& assistant, const std::string& output, const RenderOptions& o) {
  RenderOptions gen = o;
  gen.add_generation_prompt = true;
  auto prompt = ct.render(prompt_messages, gen);
  EXPECT_TRUE(prompt.ok()) << prompt.message();
  Record r{prompt_messages, tok.encode(prompt.value(), false)};
  const auto out = tok.encode(output + "<|im_end|>", false);
  r.ids.insert(r.ids.end(), out.begin(), out.end());
  r.messages.push_back(assistant);
  return r;
}

RenderOptions scenario_options(const ojson& s) {
  RenderOptions o;
  o.tools = s["tools"];
  o.kwargs = s["kwargs"];
  return o;
}

// The scenarios of chat_goldens.json "appends": accepted ones append exactly the text the Python
// rule appended, and record + appended == tokenize(F); refused ones are refused for the same
// reason.
TEST(ChatTemplateAppend, FollowsThePythonRuleOnEveryScenario) {
  const TestTokenizer tok;
  int accepted = 0, refused = 0;
  for (const ojson& s : goldens()["appends"]) {
    SCOPED_TRACE(s["name"].get<std::string>());
    const ChatTemplate ct = golden_template(s["template"].get<std::string>());
    const RenderOptions o = scenario_options(s);
    ojson prompt = s["old"];
    const ojson assistant = prompt.back();
    prompt.erase(prompt.size() - 1);
    const Record r = generate(ct, tok, prompt, assistant, s["output"].get<std::string>(), o);
    auto app = ct.append_tokens(tok, r.messages, r.ids, s["new"], o);
    if (s.contains("error")) {
      ASSERT_FALSE(app.ok()) << "expected refusal: " << s["error"];
      EXPECT_NE(app.message().find(s["error"].get<std::string>()), std::string::npos)
          << app.message();
      ++refused;
      continue;
    }
    ASSERT_TRUE(app.ok()) << app.message();
    EXPECT_EQ(app->text, s["appended_text"].get<std::string>());
    EXPECT_EQ(app->junction_size, 1u);  // "\n" after <|im_end|>
    ojson all = r.messages;
    for (const auto& m : s["new"]) all.push_back(m);
    RenderOptions gen = o;
    gen.add_generation_prompt = true;
    std::vector<int32_t> full = r.ids;
    full.insert(full.end(), app->ids.begin(), app->ids.end());
    EXPECT_EQ(full, tok.encode(ct.render(all, gen).value(), false));
    ++accepted;
  }
  EXPECT_GE(accepted, 4);
  EXPECT_GE(refused, 3);
}

// With the real Qwen3 tokenizer (once load_tokenizer reads tokenizer.json), the ids are HF's.
TEST(ChatTemplateAppend, RealQwen3TokenizerGivesHuggingFaceIds) {
  const std::string dir = test::shared_dir() + "/tokenizers/qwen3";
  auto tok = load_tokenizer(dir + "/tokenizer.json", 0);
  if (!tok.ok()) GTEST_SKIP() << "no Qwen3 tokenizer: " << tok.message();
  const ChatTemplate ct = golden_template("qwen3");
  for (const ojson& s : goldens()["appends"]) {
    if (s["template"] != "qwen3" || !s.contains("appended")) continue;
    SCOPED_TRACE(s["name"].get<std::string>());
    const auto record = s["record"].get<std::vector<int32_t>>();
    auto app = ct.append_tokens(**tok, s["old"], record, s["new"], scenario_options(s));
    ASSERT_TRUE(app.ok()) << app.message();
    EXPECT_EQ(app->ids, s["appended"].get<std::vector<int32_t>>());
  }
}

ojson msg(const char* role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// Several rounds of an agent loop on Qwen3 in thinking mode: every turn after the user query has
// its reasoning, so each tool result is append-only, and the record always equals a fresh
// tokenization.
TEST(ChatTemplateAppend, Qwen3ThinkingAgentLoopStaysAppendOnly) {
  const TestTokenizer tok;
  const ChatTemplate ct = golden_template("qwen3");
  const RenderOptions o;
  ojson msgs =
      ojson::array({msg("system", "You are an agent."), msg("user", "Plan a trip to Oslo.")});
  RenderOptions gen = o;
  gen.add_generation_prompt = true;
  std::vector<int32_t> record = tok.encode(ct.render(msgs, gen).value(), false);
  for (int round = 0; round < 3; ++round) {
    const std::string reasoning = "Step " + std::to_string(round) + ": call the tool.";
    const std::string args = "{\"q\": \"r" + std::to_string(round) + "\"}";
    ojson assistant = msg("assistant", "");
    assistant["reasoning_content"] = reasoning;
    assistant["tool_calls"] =
        ojson::array({{{"id", "c" + std::to_string(round)},
                       {"type", "function"},
                       {"function", {{"name", "search"}, {"arguments", args}}}}});
    const std::string output = "<think>\n" + reasoning +
                               "\n</think>\n\n<tool_call>\n{\"name\": \"search\", "
                               "\"arguments\": " +
                               args + "}\n</tool_call>";
    const auto out_ids = tok.encode(output + "<|im_end|>", false);
    record.insert(record.end(), out_ids.begin(), out_ids.end());
    msgs.push_back(assistant);
    ojson tool = msg("tool", "result " + std::to_string(round));
    tool["tool_call_id"] = "c" + std::to_string(round);
    auto app = ct.append_tokens(tok, msgs, record, ojson::array({tool}), o);
    ASSERT_TRUE(app.ok()) << "round " << round << ": " << app.message();
    record.insert(record.end(), app->ids.begin(), app->ids.end());
    msgs.push_back(tool);
    EXPECT_EQ(record, tok.encode(ct.render(msgs, gen).value(), false)) << "round " << round;
  }
}

// Earlier turns without reasoning and a last turn with it (thinking mode): a tool result is
// append-only; a new user message is not (the last turn's reasoning is dropped once a user query
// follows it), and the error says where the renderings diverge.
TEST(ChatTemplateAppend, Qwen3HistoryWithoutReasoning) {
  const TestTokenizer tok;
  const ChatTemplate ct = golden_template("qwen3");
  const RenderOptions o;
  const ojson prompt =
      ojson::array({msg("user", "Hi"), msg("assistant", "Hello!"), msg("user", "Weather?")});
  ojson assistant = msg("assistant", "Let me check.");
  assistant["reasoning_content"] = "Use the tool.";
  const Record r =
      generate(ct, tok, prompt, assistant, "<think>\nUse the tool.\n</think>\n\nLet me check.", o);

  auto tool_app = ct.append_tokens(tok, r.messages, r.ids, ojson::array({msg("tool", "21C")}), o);
  ASSERT_TRUE(tool_app.ok()) << tool_app.message();
  EXPECT_EQ(tok.decode(tool_app->ids),
            "\n<|im_start|>user\n<tool_response>\n21C\n</"
            "tool_response><|im_end|>\n<|im_start|>assistant\n");

  auto user_app =
      ct.append_tokens(tok, r.messages, r.ids, ojson::array({msg("user", "Thanks")}), o);
  ASSERT_FALSE(user_app.ok());
  EXPECT_NE(user_app.message().find("is not append-only for this conversation"), std::string::npos);
  EXPECT_NE(user_app.message().find("<think>\\nUse the tool.\\n</think>"), std::string::npos)
      << user_app.message();
}

// Qwen3 with thinking off: the empty <think></think> block of the generation prompt is rendered for
// the final assistant turn only while it is last, so any append re-renders that turn: refused.
TEST(ChatTemplateAppend, Qwen3ThinkingOffIsNotAppendOnly) {
  const TestTokenizer tok;
  const ChatTemplate ct = golden_template("qwen3");
  RenderOptions o;
  o.kwargs = {{"enable_thinking", false}};
  const Record r =
      generate(ct, tok, ojson::array({msg("user", "Hi")}), msg("assistant", "Hello!"), "Hello!", o);
  for (const char* role : {"user", "tool"}) {
    auto app = ct.append_tokens(tok, r.messages, r.ids, ojson::array({msg(role, "next")}), o);
    ASSERT_FALSE(app.ok()) << role;
    EXPECT_NE(app.message().find("not append-only"), std::string::npos) << app.message();
  }
}

TEST(ChatTemplateAppend, ChatMLMultiRoundRecordEqualsFreshTokenization) {
  const TestTokenizer tok;
  const ChatTemplate ct = golden_template("smollm2");
  const RenderOptions o;
  RenderOptions gen;
  gen.add_generation_prompt = true;
  ojson msgs = ojson::array({msg("user", "Salut 😀")});
  std::vector<int32_t> record = tok.encode(ct.render(msgs, gen).value(), false);
  const std::vector<std::pair<std::string, ojson>> rounds = {
      {"Bonjour !", ojson::array({msg("user", "Météo ?")})},
      {"Je regarde.", ojson::array({msg("tool", "21C"), msg("tool", "sunny")})},
      {"Il fait beau.", ojson::array({msg("user", "merci"), msg("system", "be brief")})},
  };
  for (const auto& [output, new_messages] : rounds) {
    const auto out_ids = tok.encode(output + "<|im_end|>", false);
    record.insert(record.end(), out_ids.begin(), out_ids.end());
    msgs.push_back(msg("assistant", output));
    auto app = ct.append_tokens(tok, msgs, record, new_messages, o);
    ASSERT_TRUE(app.ok()) << app.message();
    EXPECT_EQ(app->junction_size, 1u);
    record.insert(record.end(), app->ids.begin(), app->ids.end());
    for (const auto& m : new_messages) msgs.push_back(m);
    EXPECT_EQ(record, tok.encode(ct.render(msgs, gen).value(), false));
  }
}

TEST(ChatTemplateAppend, RefusesRecordsThatDoNotMatch) {
  const TestTokenizer tok;
  const ChatTemplate ct = golden_template("smollm2");
  const RenderOptions o;
  const ojson next = ojson::array({msg("user", "more")});
  const Record r =
      generate(ct, tok, ojson::array({msg("user", "Hi")}), msg("assistant", "Hello!"), "Hello!", o);

  // The messages say something else than the model produced.
  ojson other = r.messages;
  other[1]["content"] = "Howdy!";
  auto mismatch = ct.append_tokens(tok, other, r.ids, next, o);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.message().find("token record does not match the rendered conversation"),
            std::string::npos);
  EXPECT_NE(mismatch.message().find("Hello!"), std::string::npos) << mismatch.message();

  // A truncated output (no stop token): the template would add <|im_end|> itself.
  std::vector<int32_t> truncated(r.ids.begin(), r.ids.end() - 1);
  auto junction = ct.append_tokens(tok, r.messages, truncated, next, o);
  ASSERT_FALSE(junction.ok());
  EXPECT_NE(junction.message().find("only whitespace may follow the model's stop token"),
            std::string::npos)
      << junction.message();

  std::vector<int32_t> bad_ids = r.ids;
  bad_ids.push_back(100000);
  EXPECT_NE(ct.append_tokens(tok, r.messages, bad_ids, next, o).message().find("is not a token id"),
            std::string::npos);
  EXPECT_NE(ct.append_tokens(tok, r.messages, r.ids, ojson::array(), o).message().find("non-empty"),
            std::string::npos);
}

// A template that closes a conversation with a footer unless a generation prompt follows: the
// record matches P, but F does not start with P.
TEST(ChatTemplateAppend, RefusesTemplatesThatAreNotAppendOnly) {
  const TestTokenizer tok;
  auto ct = ChatTemplate::create(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% else %}<|endoftext|>{% endif %}",
      "", "", "footer");
  ASSERT_TRUE(ct.ok()) << ct.message();
  const RenderOptions o;
  const Record r =
      generate(*ct, tok, ojson::array({msg("user", "Hi")}), msg("assistant", "Yo"), "Yo", o);
  auto app = ct->append_tokens(tok, r.messages, r.ids, ojson::array({msg("user", "again")}), o);
  ASSERT_FALSE(app.ok());
  EXPECT_NE(app.message().find("chat template 'footer' is not append-only"), std::string::npos)
      << app.message();
  EXPECT_NE(app.message().find("<|endoftext|>"), std::string::npos) << app.message();
}

// A template whose header counts the messages re-renders the start of the conversation: the record
// no longer matches it once the assistant turn is among the messages.
TEST(ChatTemplateAppend, RefusesTemplatesThatRewriteTheRecordedPrompt) {
  const TestTokenizer tok;
  auto ct = ChatTemplate::create(
      "{{ messages | length }} messages\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ "
      "m.content }}"
      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      "", "", "counting");
  ASSERT_TRUE(ct.ok()) << ct.message();
  const RenderOptions o;
  const Record r =
      generate(*ct, tok, ojson::array({msg("user", "Hi")}), msg("assistant", "Yo"), "Yo", o);
  auto app = ct->append_tokens(tok, r.messages, r.ids, ojson::array({msg("user", "again")}), o);
  ASSERT_FALSE(app.ok());
  EXPECT_NE(app.message().find("at byte 0, the decoded record has \"1 messages"), std::string::npos)
      << app.message();
}

}  // namespace
}  // namespace miles
