// Tests of the rewards (include/miles/controller/reward.h): each built-in verifier, validation and naming of
// specs, the weighted sum and its parts, the http kind against a real httplib server on 127.0.0.1
// (errors, a slow reply past the timeout, a server that is down), and the command kind against real
// shell scripts (a crash mid-batch, garbage, a hang, a command that cannot start).
#include "miles/controller/reward.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller/reward_internal.h"

namespace miles {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

RewardInput sample(std::string response, json label = nullptr, int64_t tokens = 0,
                   std::string finish_reason = "stop") {
  RewardInput in;
  in.prompt = "What is 6 times 7?";
  in.response = std::move(response);
  in.label = std::move(label);
  in.response_tokens = tokens;
  in.finish_reason = std::move(finish_reason);
  return in;
}

RewardSpec spec_of(std::string_view kind) {
  RewardSpec s;
  const auto& names = ConfigEnum<RewardKind>::names;
  const auto it = std::find(names.begin(), names.end(), kind);
  EXPECT_NE(it, names.end()) << kind;
  s.kind = static_cast<RewardKind>(it - names.begin());
  return s;
}

// The model for `specs`, which must be valid.
std::unique_ptr<RewardModel> make_model(std::vector<RewardSpec> specs) {
  auto model = RewardModel::create(std::move(specs));
  if (!model.ok()) {
    ADD_FAILURE() << model.message();
    return nullptr;
  }
  return std::move(model).value();
}

// The single part of a one-spec model on one sample; `error` gets the sample's error.
double score_one(const RewardSpec& spec, const RewardInput& input, std::string* error = nullptr) {
  auto model = make_model({spec});
  if (!model) return std::numeric_limits<double>::quiet_NaN();
  auto results = model->score(std::span<const RewardInput>(&input, 1));
  EXPECT_EQ(results.size(), 1u);
  if (error) {
    *error = results[0].error;
  } else {
    EXPECT_EQ(results[0].error, "");
  }
  return results[0].score;
}

std::string create_error(std::vector<RewardSpec> specs) {
  auto model = RewardModel::create(std::move(specs));
  EXPECT_FALSE(model.ok());
  return model.message();
}

// ---- text helpers -----------------------------------------------------------------------------

TEST(RewardText, LastNumber) {
  using reward::last_number;
  EXPECT_EQ(last_number("The answer is 42."), 42);
  EXPECT_EQ(last_number("first 3 then -3.5"), -3.5);
  EXPECT_EQ(last_number("it costs $1,234 in total"), 1234);
  EXPECT_EQ(last_number("1,234,567.25"), 1234567.25);
  EXPECT_EQ(last_number("a list 1,2,3"), 3);
  EXPECT_EQ(last_number("(-7)"), -7);
  EXPECT_EQ(last_number("x-5"), 5);  // a hyphen after a letter is not a sign
  EXPECT_EQ(last_number("3-5"), 5);
  EXPECT_EQ(last_number("about .5 of it"), 0.5);
  EXPECT_EQ(last_number("12,34"), 34);  // not a thousands group
  EXPECT_EQ(last_number("version 1.2.3"), 3);
  EXPECT_FALSE(last_number("no digits here").has_value());
  EXPECT_FALSE(last_number("").has_value());
}

TEST(RewardText, NumberLabel) {
  using reward::number_label;
  EXPECT_EQ(number_label(json(42)).value(), 42);
  EXPECT_EQ(number_label(json(-2.5)).value(), -2.5);
  EXPECT_EQ(number_label(json(" 1,234 ")).value(), 1234);
  EXPECT_EQ(number_label(json("+3")).value(), 3);
  EXPECT_NE(number_label(json("abc")).message().find("'abc' is not a number"), std::string::npos);
  EXPECT_FALSE(number_label(json("nan")).ok());
  EXPECT_FALSE(number_label(json("")).ok());
  EXPECT_FALSE(number_label(json(true)).ok());
  EXPECT_FALSE(number_label(json::array({1})).ok());
  EXPECT_NE(number_label(json(nullptr)).message().find("no label"), std::string::npos);
}

TEST(RewardText, ScoreReply) {
  using reward::parse_score_reply;
  EXPECT_EQ(parse_score_reply(R"({"score": 0.5})").value(), 0.5);
  EXPECT_EQ(parse_score_reply(R"({"score": -1, "extra": "ok"})").value(), -1);
  EXPECT_EQ(parse_score_reply("2").value(), 2);
  EXPECT_NE(parse_score_reply("hello").message().find("not JSON"), std::string::npos);
  EXPECT_NE(parse_score_reply(R"({"value": 1})").message().find("no \"score\""), std::string::npos);
  EXPECT_NE(parse_score_reply(R"({"score": "1"})").message().find("not a number"),
            std::string::npos);
  EXPECT_FALSE(parse_score_reply(R"({"score": null})").ok());
  EXPECT_FALSE(parse_score_reply(R"({"score": 1e999})").ok());
}

TEST(RewardText, RequestJsonSurvivesInvalidUtf8) {
  RewardInput in = sample("cut \xe4\xb8", json("x"), 3, "length");
  json j = json::parse(reward::request_json(in));
  EXPECT_EQ(j["label"], "x");
  EXPECT_EQ(j["response_tokens"], 3);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["prompt"], in.prompt);
  EXPECT_TRUE(j["response"].get<std::string>().starts_with("cut "));
}

TEST(RewardText, HttpUrl) {
  auto a = reward::parse_http_url("127.0.0.1:8000/score");
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->scheme_host_port, "http://127.0.0.1:8000");
  EXPECT_EQ(a->path, "/score");
  auto b = reward::parse_http_url("http://localhost:9/a/b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->scheme_host_port, "http://localhost:9");
  EXPECT_EQ(b->path, "/a/b");
  auto c = reward::parse_http_url("https://rm.example.com");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->scheme_host_port, "https://rm.example.com");
  EXPECT_EQ(c->path, "/");
  EXPECT_FALSE(reward::parse_http_url("ftp://host/x").ok());
  EXPECT_FALSE(reward::parse_http_url(":80/x").ok());
  EXPECT_FALSE(reward::parse_http_url("host:99999/x").ok());
  EXPECT_FALSE(reward::parse_http_url("host:abc/x").ok());
  EXPECT_FALSE(reward::parse_http_url("host:/x").ok());
  // Bytes that would end up in the request line or the Host header (fuzz_rewards).
  for (const char* bad : {"host/a b", "host/x\r\nX-Injected: 1", "ho\tst/x", "host/\x7f"}) {
    const auto r = reward::parse_http_url(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.message().find("holds a space or a control character"), std::string::npos)
        << r.message();
  }
}

// ---- built-in verifiers -----------------------------------------------------------------------

TEST(RewardExactMatch, TrimsAndIgnoresCaseByDefault) {
  RewardSpec s = spec_of("exact_match");
  EXPECT_EQ(score_one(s, sample("  Paris\n", json("paris"))), 1);
  EXPECT_EQ(score_one(s, sample("Paris, France", json("Paris"))), 0);
  s.case_sensitive = true;
  EXPECT_EQ(score_one(s, sample("paris", json("Paris"))), 0);
  EXPECT_EQ(score_one(s, sample("Paris", json("Paris"))), 1);
}

TEST(RewardExactMatch, AnswerPrefix) {
  RewardSpec s = spec_of("exact_match");
  s.answer_prefix = "Answer:";
  EXPECT_EQ(score_one(s, sample("Answer: no. Let me redo it. Answer: Blue", json("blue"))), 1);
  EXPECT_EQ(score_one(s, sample("Blue", json("blue"))), 0);  // no prefix: no answer
}

TEST(RewardExactMatch, LabelOfTheWrongTypeIsASampleError) {
  std::string error;
  EXPECT_EQ(score_one(spec_of("exact_match"), sample("42", json(42)), &error), 0);
  EXPECT_NE(error.find("exact_match: label must be a string"), std::string::npos) << error;
  EXPECT_EQ(score_one(spec_of("exact_match"), sample("42"), &error), 0);
  EXPECT_NE(error.find("label must be a string, got null"), std::string::npos) << error;
}

TEST(RewardNumeric, LastNumberWithinTolerance) {
  RewardSpec s = spec_of("numeric");
  EXPECT_EQ(score_one(s, sample("6 times 7 is 42", json(42))), 1);
  EXPECT_EQ(score_one(s, sample("6 times 7 is 42", json("42"))), 1);
  EXPECT_EQ(score_one(s, sample("42 is wrong, it is 41", json(42))), 0);
  EXPECT_EQ(score_one(s, sample("The total is 1,234.", json(1234))), 1);
  EXPECT_EQ(score_one(s, sample("It drops to -3.5 degrees", json(-3.5))), 1);
  EXPECT_EQ(score_one(s, sample("I do not know", json(42))), 0);
  EXPECT_EQ(score_one(s, sample("3.14159", json(3.14))), 0);
  s.tolerance = 0.01;
  EXPECT_EQ(score_one(s, sample("3.14159", json(3.14))), 1);
}

TEST(RewardNumeric, AnswerPrefix) {
  RewardSpec s = spec_of("numeric");
  s.answer_prefix = "####";
  EXPECT_EQ(score_one(s, sample("She has 3 + 4 = 7 apples.\n#### 7", json("7"))), 1);
  EXPECT_EQ(score_one(s, sample("#### 7 then 8 is the answer", json(7))), 0);  // last after it
  EXPECT_EQ(score_one(s, sample("She has 7 apples.", json(7))), 0);            // no prefix
  s.answer_prefix = "Answer:";
  EXPECT_EQ(score_one(s, sample("Steps 1, 2, 3. Answer: -12", json(-12))), 1);
}

TEST(RewardNumeric, BadLabelFailsOnlyThatSample) {
  auto model = make_model({spec_of("numeric")});
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch = {sample("7", json(7)), sample("7", json("abc")),
                                    sample("7", json::array({7})), sample("8", json(8))};
  auto results = model->score(batch);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].score, 1);
  EXPECT_EQ(results[0].error, "");
  EXPECT_EQ(results[1].score, 0);
  EXPECT_EQ(results[1].error, "numeric: label 'abc' is not a number");
  EXPECT_EQ(results[1].parts.at("numeric"), 0);
  EXPECT_NE(results[2].error.find("label must be a number"), std::string::npos);
  EXPECT_EQ(results[3].score, 1);
  EXPECT_EQ(results[3].error, "");
}

TEST(RewardRegex, PatternOrLabel) {
  RewardSpec s = spec_of("regex");
  s.pattern = R"(\\boxed\{\d+\})";
  EXPECT_EQ(score_one(s, sample(R"(so \boxed{42}.)")), 1);
  EXPECT_EQ(score_one(s, sample(R"(so \boxed{x}.)")), 0);
  RewardSpec from_label = spec_of("regex");
  EXPECT_EQ(score_one(from_label, sample("order 66 executed", json("^order [0-9]+"))), 1);
  EXPECT_EQ(score_one(from_label, sample("the order 66", json("^order [0-9]+"))), 0);
  std::string error;
  EXPECT_EQ(score_one(from_label, sample("x", json("(unclosed")), &error), 0);
  EXPECT_NE(error.find("'(unclosed' is not a valid regex"), std::string::npos) << error;
  EXPECT_EQ(score_one(from_label, sample("x", json(1)), &error), 0);
  EXPECT_NE(error.find("label must be a regex string"), std::string::npos) << error;
  // Numbers that libstdc++'s regex compiler reads without a bound (signed overflow: UB, found by
  // fuzz_rewards) are refused before it sees them; a literal brace in a class or a long literal
  // number is not one.
  for (const char* huge :
       {R"(a\88888888888888888888)", "i{222222222222222222222222", "x{1,99999999999}"}) {
    EXPECT_EQ(score_one(from_label, sample("x", json(huge)), &error), 0) << huge;
    EXPECT_NE(error.find("a back-reference or repeat count over 9 digits"), std::string::npos)
        << error;
  }
  EXPECT_EQ(score_one(from_label, sample("{12345678901", json("[{]12345678901"))), 1);
  EXPECT_EQ(score_one(from_label, sample("id 12345678901234", json("12345678901234"))), 1);
}

// std::regex's default executor recurses once per character: these would overflow the stack.
TEST(RewardRegex, LongResponsesDoNotCrash) {
  std::string long_text(300000, 'a');
  long_text += "x";
  RewardSpec s = spec_of("regex");
  s.pattern = "(a|b)*x";
  EXPECT_EQ(score_one(s, sample(long_text)), 1);
  s.pattern = "a.*x";
  EXPECT_EQ(score_one(s, sample(long_text)), 1);
  s.pattern = "\\boxed";
  EXPECT_EQ(score_one(s, sample(long_text)), 0);
  // Back-references need the backtracking executor: only short texts.
  s.pattern = R"((ab)\1)";
  EXPECT_EQ(score_one(s, sample("xxababyy")), 1);
  std::string error;
  EXPECT_EQ(score_one(s, sample(long_text), &error), 0);
  EXPECT_NE(error.find("a pattern with back-references is matched on at most"), std::string::npos)
      << error;
}

TEST(RewardRegex, InvalidPatternIsAConfigError) {
  RewardSpec s = spec_of("regex");
  s.pattern = "a[b";
  EXPECT_NE(s.validate().message().find("pattern 'a[b'"), std::string::npos);
  EXPECT_NE(create_error({s}).find("pattern 'a[b'"), std::string::npos);
}

TEST(RewardKeyword, FractionFound) {
  RewardSpec s = spec_of("keyword");
  EXPECT_EQ(score_one(s, sample("The CAPITAL is Paris", json("capital"))), 1);
  EXPECT_EQ(score_one(s, sample("nothing", json("capital"))), 0);
  EXPECT_DOUBLE_EQ(
      score_one(s, sample("red and GREEN", json::array({"red", "green", "blue", "pink"}))), 0.5);
  s.case_sensitive = true;
  EXPECT_DOUBLE_EQ(score_one(s, sample("red and GREEN", json::array({"red", "green"}))), 0.5);
  RewardSpec fixed = spec_of("keyword");
  fixed.keywords = {"step", "answer", "check"};
  EXPECT_DOUBLE_EQ(score_one(fixed, sample("Step 1 ... answer: 3")), 2.0 / 3.0);  // label unused
}

TEST(RewardKeyword, BadLabels) {
  RewardSpec s = spec_of("keyword");
  std::string error;
  EXPECT_EQ(score_one(s, sample("x", json(3)), &error), 0);
  EXPECT_NE(error.find("label must be a keyword or a list"), std::string::npos) << error;
  EXPECT_EQ(score_one(s, sample("x", json::array()), &error), 0);
  EXPECT_NE(error.find("no keywords"), std::string::npos) << error;
  EXPECT_EQ(score_one(s, sample("x", json::array({"x", 2})), &error), 0);
  EXPECT_NE(error.find("must be strings"), std::string::npos) << error;
  s.keywords = {"a", ""};
  EXPECT_NE(create_error({s}).find("empty string"), std::string::npos);
}

TEST(RewardLength, Penalty) {
  RewardSpec s = spec_of("length");
  s.max_tokens = 100;
  EXPECT_EQ(score_one(s, sample("", nullptr, 0)), 0);
  EXPECT_EQ(score_one(s, sample("", nullptr, 100)), 0);
  EXPECT_DOUBLE_EQ(score_one(s, sample("", nullptr, 150)), -0.5);
  EXPECT_EQ(score_one(s, sample("", nullptr, 200)), -1);
  EXPECT_EQ(score_one(s, sample("", nullptr, 1000)), -1);         // floored
  EXPECT_EQ(score_one(s, sample("", nullptr, 50, "length")), 0);  // truncation not penalised
  s.require_finish = true;
  EXPECT_EQ(score_one(s, sample("", nullptr, 50, "length")), -1);
  EXPECT_EQ(score_one(s, sample("", nullptr, 1000, "length")), -2);
  EXPECT_EQ(score_one(s, sample("", nullptr, 50, "stop")), 0);
}

// ---- validation, names, the weighted sum ------------------------------------------------------

TEST(RewardModelCreate, ValidationNamesTheField) {
  EXPECT_NE(create_error({}).find("at least one"), std::string::npos);

  RewardSpec w = spec_of("numeric");
  w.weight = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(create_error({w}).find("weight must be finite"), std::string::npos);
  w.weight = std::numeric_limits<double>::infinity();
  EXPECT_NE(create_error({w}).find("weight must be finite"), std::string::npos);
  RewardSpec tol = spec_of("numeric");
  tol.tolerance = -1;
  EXPECT_NE(create_error({tol}).find("tolerance"), std::string::npos);
  EXPECT_NE(create_error({spec_of("length")}).find("max_tokens must be > 0"), std::string::npos);
  EXPECT_NE(create_error({spec_of("http")}).find("url is required"), std::string::npos);
  RewardSpec bad_url = spec_of("http");
  bad_url.url = "ftp://x/y";
  EXPECT_NE(create_error({bad_url}).find("ftp://x/y"), std::string::npos);
  EXPECT_NE(create_error({spec_of("command")}).find("command is required"), std::string::npos);
  RewardSpec t = spec_of("command");
  t.command = "cat";
  t.timeout_s = 0;
  EXPECT_NE(create_error({t}).find("timeout_s must be finite and > 0"), std::string::npos);
  RewardSpec h = spec_of("http");
  h.url = "127.0.0.1:1/x";
  h.timeout_s = -1;
  EXPECT_NE(create_error({h}).find("timeout_s"), std::string::npos);
  RewardSpec named = spec_of("length");
  named.name = "brevity";
  EXPECT_NE(create_error({named}).find("reward 'brevity'"), std::string::npos);
}

TEST(RewardModelCreate, UniqueNames) {
  RewardSpec acc = spec_of("exact_match");
  acc.name = "acc";
  RewardSpec acc2 = spec_of("numeric");
  acc2.name = "acc";
  auto model = make_model({spec_of("numeric"), spec_of("numeric"), acc, spec_of("numeric"), acc2});
  ASSERT_TRUE(model);
  std::vector<std::string> names;
  for (const auto& s : model->specs()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"numeric", "numeric_2", "acc", "numeric_3", "acc_2"}));
}

TEST(RewardModelScore, WeightedSumAndParts) {
  RewardSpec correct = spec_of("numeric");
  correct.name = "correct";
  RewardSpec brevity = spec_of("length");
  brevity.max_tokens = 10;
  brevity.weight = 0.5;
  RewardSpec words = spec_of("keyword");
  words.keywords = {"because", "so"};
  words.weight = 2;
  auto model = make_model({correct, brevity, words});
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch = {sample("because 6*7, so 42", json(42), 15),
                                    sample("so 41", json(42), 5),
                                    sample("because 42", json("forty-two"), 10)};
  auto r = model->score(batch);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0].score, 1 + 0.5 * -0.5 + 2 * 1.0);
  EXPECT_EQ(r[0].parts,
            (std::map<std::string, double>{{"correct", 1}, {"length", -0.5}, {"keyword", 1}}));
  EXPECT_EQ(r[0].error, "");
  EXPECT_DOUBLE_EQ(r[1].score, 0 + 0 + 2 * 0.5);
  // A failed part counts 0, the others still count.
  EXPECT_DOUBLE_EQ(r[2].score, 2 * 0.5);
  EXPECT_EQ(r[2].parts.at("correct"), 0);
  EXPECT_EQ(r[2].error, "correct: label 'forty-two' is not a number");
  EXPECT_TRUE(model->score({}).empty());
}

// ---- http -------------------------------------------------------------------------------------

// A reward service on 127.0.0.1. The response text picks the behaviour: "fail" (500), "slow"
// (held until the test ends), "garbage", "noscore", "bare" (a bare number), "huge" (a 2 MiB
// reply); anything else scores
// label + response_tokens / 1000, after a delay that reverses the completion order of a batch.
class RewardHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.set_tcp_nodelay(true);
    server_.Post("/score",
                 [this](const httplib::Request& req, httplib::Response& res) { handle(req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  void TearDown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    server_.stop();
    thread_.join();
  }

  void handle(const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    for (const char* key : {"prompt", "response", "label", "finish_reason", "response_tokens"}) {
      if (body.is_discarded() || !body.contains(key)) {
        res.status = 400;
        res.set_content(std::string("missing ") + key, "text/plain");
        return;
      }
    }
    std::string response = body["response"];
    if (response == "fail") {
      res.status = 500;
      res.set_content("boom", "text/plain");
    } else if (response == "slow") {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(10), [this] { return released_; });
      res.set_content(R"({"score": 1})", "application/json");
    } else if (response == "garbage") {
      res.set_content("<html>oops</html>", "text/html");
    } else if (response == "noscore") {
      res.set_content(R"({"value": 1})", "application/json");
    } else if (response == "bare") {
      res.set_content("0.25", "application/json");
    } else if (response == "huge") {  // a valid reply, padded past the 1 MiB bound
      res.set_content(R"({"score": 1, "pad": ")" + std::string(2 << 20, 'x') + "\"}",
                      "application/json");
    } else {
      int64_t tokens = body["response_tokens"];
      std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(0, 20 - tokens)));
      json reply = {{"score", body["label"].get<double>() + static_cast<double>(tokens) / 1000}};
      res.set_content(reply.dump(), "application/json");
    }
  }

  RewardSpec http_spec(const std::string& url, double timeout_s = 5) {
    RewardSpec s = spec_of("http");
    s.name = "rm";
    s.url = url;
    s.timeout_s = timeout_s;
    return s;
  }
  std::string base() const { return "127.0.0.1:" + std::to_string(port_); }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST_F(RewardHttpTest, BatchScoredConcurrentlyInInputOrder) {
  auto model = make_model({http_spec("http://" + base() + "/score")});
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch;
  for (int i = 0; i < 20; ++i) batch.push_back(sample("ok", json(i), i, "stop"));
  auto t0 = Clock::now();
  auto r = model->score(batch);
  ASSERT_EQ(r.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(r[i].error, "") << i;
    EXPECT_DOUBLE_EQ(r[i].score, i + i / 1000.0) << i;
    EXPECT_DOUBLE_EQ(r[i].parts.at("rm"), i + i / 1000.0) << i;
  }
  // 20 requests of up to 20 ms each: concurrency keeps it well under the serial 210 ms.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  // The same model scores again (new connections per batch).
  auto again = model->score(std::vector<RewardInput>{sample("ok", json(1), 2)});
  EXPECT_DOUBLE_EQ(again[0].score, 1.002);
}

TEST_F(RewardHttpTest, BadRepliesFailOnlyTheirSamples) {
  auto model = make_model({http_spec(base() + "/score")});  // no scheme
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch = {sample("ok", json(1)),      sample("fail", json(1)),
                                    sample("garbage", json(1)), sample("noscore", json(1)),
                                    sample("bare", json(1)),    sample("ok", json(2), 5),
                                    sample("huge", json(1))};
  auto r = model->score(batch);
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[0].score, 1);
  EXPECT_EQ(r[0].error, "");
  EXPECT_EQ(r[1].score, 0);
  EXPECT_TRUE(r[1].error.starts_with("rm: http 500 from " + base() + "/score: boom")) << r[1].error;
  EXPECT_EQ(r[2].score, 0);
  EXPECT_NE(r[2].error.find("not JSON"), std::string::npos) << r[2].error;
  EXPECT_NE(r[3].error.find("no \"score\""), std::string::npos) << r[3].error;
  EXPECT_EQ(r[4].score, 0.25);
  EXPECT_EQ(r[4].error, "");
  EXPECT_DOUBLE_EQ(r[5].score, 2.005);
  // A reply past 1 MiB is not read on (a broken service must not fill the controller's memory).
  EXPECT_EQ(r[6].score, 0);
  EXPECT_NE(r[6].error.find("is longer than 1048576 bytes"), std::string::npos) << r[6].error;
}

TEST_F(RewardHttpTest, WrongPathIs404) {
  auto model = make_model({http_spec(base() + "/nope")});
  ASSERT_TRUE(model);
  auto r = model->score(std::vector<RewardInput>{sample("ok", json(1))});
  EXPECT_TRUE(r[0].error.starts_with("rm: http 404")) << r[0].error;
}

TEST_F(RewardHttpTest, SlowReplyTimesOut) {
  auto model = make_model({http_spec(base() + "/score", 0.3)});
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch = {sample("ok", json(1)), sample("slow", json(1)),
                                    sample("ok", json(3))};
  auto t0 = Clock::now();
  auto r = model->score(batch);
  auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  EXPECT_EQ(r[0].score, 1);
  EXPECT_EQ(r[1].score, 0);
  EXPECT_NE(r[1].error.find("rm: http POST " + base() + "/score failed: no reply within 0.3 s"),
            std::string::npos)
      << r[1].error;
  EXPECT_EQ(r[2].score, 3);
}

// A port nothing listens on: bound, then closed.
int dead_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(RewardHttp, ServerDown) {
  RewardSpec s = spec_of("http");
  s.url = "http://127.0.0.1:" + std::to_string(dead_port()) + "/score";
  s.timeout_s = 2;
  RewardSpec len = spec_of("length");
  len.max_tokens = 1;
  auto model = make_model({s, len});
  ASSERT_TRUE(model);
  auto t0 = Clock::now();
  auto r = model->score(std::vector<RewardInput>{sample("a", json(1), 2), sample("b", json(1))});
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  ASSERT_EQ(r.size(), 2u);
  for (const auto& x : r) {
    EXPECT_NE(x.error.find("http: http POST " + s.url + " failed: could not connect"),
              std::string::npos)
        << x.error;
    EXPECT_EQ(x.parts.at("http"), 0);
  }
  EXPECT_EQ(r[0].score, -1);  // the length part still counts
}

// ---- command ----------------------------------------------------------------------------------

// Scripts in a temporary folder, run through /bin/sh.
class RewardCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/miles_reward_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // Scores response_tokens; the responses "crash", "garbage", "hang", "twice"
    // misbehave.
    write("grader.sh", R"(while IFS= read -r line; do
  case "$line" in
    *'"response":"crash"'*) exit 3 ;;
    *'"response":"garbage"'*) echo "this is not json" ;;
    *'"response":"hang"'*) sleep 30 ;;
    *'"response":"twice"'*) printf '{"score": 1}\n{"score": 2}\n' ;;
    *) n=$(printf '%s\n' "$line" | sed -n 's/.*"response_tokens":\([0-9]*\).*/\1/p')
       echo "{\"score\": $n}" ;;
  esac
done
)");
    // Counts the requests it has answered: shows whether the process was kept or restarted.
    write("counter.sh", R"(i=0
while IFS= read -r line; do
  case "$line" in *'"response":"crash"'*) exit 1 ;; esac
  i=$((i + 1))
  echo "{\"score\": $i}"
done
)");
    write("once.sh", "read -r line\necho '{\"score\": 1}'\n");
  }

  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }

  RewardSpec command_spec(const std::string& script, double timeout_s = 5) {
    RewardSpec s = spec_of("command");
    s.command = "sh " + dir_ + "/" + script;
    s.timeout_s = timeout_s;
    return s;
  }

  // Tokens → samples that the grader scores as their token count.
  static std::vector<RewardInput> batch_of(const std::vector<std::string>& responses) {
    std::vector<RewardInput> out;
    for (size_t i = 0; i < responses.size(); ++i) {
      out.push_back(sample(responses[i], json("label"), static_cast<int64_t>(i + 1)));
    }
    return out;
  }

  static void expect_no_children() {
    errno = 0;
    EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
    EXPECT_EQ(errno, ECHILD) << "a child process was left behind";
  }

  std::string dir_;
};

TEST_F(RewardCommandTest, ScoresInOrderAndKeepsTheProcess) {
  auto model = make_model({command_spec("grader.sh"), command_spec("counter.sh")});
  ASSERT_TRUE(model);
  auto r = model->score(batch_of({"a", "b", "c"}));
  ASSERT_EQ(r.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].error, "");
    EXPECT_EQ(r[i].parts.at("command"), i + 1);    // the token count
    EXPECT_EQ(r[i].parts.at("command_2"), i + 1);  // the request count
  }
  auto again = model->score(batch_of({"d", "e"}));
  EXPECT_EQ(again[0].parts.at("command_2"), 4);  // the same process answers
  EXPECT_EQ(again[1].parts.at("command_2"), 5);
  model.reset();
  expect_no_children();
}

TEST_F(RewardCommandTest, CrashMidBatchRestartsForLaterSamples) {
  auto model = make_model({command_spec("grader.sh")});
  ASSERT_TRUE(model);
  auto r = model->score(batch_of({"a", "b", "crash", "d", "e"}));
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].score, 1);
  EXPECT_EQ(r[1].score, 2);
  EXPECT_EQ(r[2].score, 0);
  EXPECT_NE(r[2].error.find("command: the command exited with status 3 before replying"),
            std::string::npos)
      << r[2].error;
  EXPECT_EQ(r[3].score, 4);
  EXPECT_EQ(r[3].error, "");
  EXPECT_EQ(r[4].score, 5);
  auto counter = make_model({command_spec("counter.sh")});
  ASSERT_TRUE(counter);
  auto c = counter->score(batch_of({"a", "b", "crash", "d", "e"}));
  std::vector<double> scores;
  for (const auto& x : c) scores.push_back(x.score);
  EXPECT_EQ(scores, (std::vector<double>{1, 2, 0, 1, 2}));  // a fresh process after the crash
  model.reset();
  counter.reset();
  expect_no_children();
}

TEST_F(RewardCommandTest, KilledBySignal) {
  RewardSpec s = spec_of("command");
  s.command = "read -r line; kill -KILL $$";
  auto model = make_model({s});
  ASSERT_TRUE(model);
  auto r = model->score(batch_of({"a"}));
  EXPECT_NE(r[0].error.find("the command was killed by signal 9 (SIGKILL) before replying"),
            std::string::npos)
      << r[0].error;
}

TEST_F(RewardCommandTest, GarbageFailsThatSample) {
  auto model = make_model({command_spec("grader.sh")});
  ASSERT_TRUE(model);
  auto r = model->score(batch_of({"a", "garbage", "c", "twice", "e", "f"}));
  EXPECT_EQ(r[0].score, 1);
  EXPECT_NE(r[1].error.find("reply is not JSON: 'this is not json'"), std::string::npos)
      << r[1].error;
  EXPECT_EQ(r[2].score, 3);
  EXPECT_EQ(r[2].error, "");
  EXPECT_EQ(r[3].score, 1);  // the first of its two lines
  // The extra line answers no request: the next sample fails rather than take it as its reply.
  EXPECT_NE(r[4].error.find("answers no request"), std::string::npos) << r[4].error;
  EXPECT_EQ(r[5].score, 6);
  EXPECT_EQ(r[5].error, "");
}

TEST_F(RewardCommandTest, HangTimesOut) {
  auto model = make_model({command_spec("grader.sh", 0.3)});
  ASSERT_TRUE(model);
  auto t0 = Clock::now();
  auto r = model->score(batch_of({"a", "hang", "c"}));
  auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  EXPECT_EQ(r[0].score, 1);
  EXPECT_NE(r[1].error.find("command: no reply within 0.3 s (command 'sh "), std::string::npos)
      << r[1].error;
  EXPECT_EQ(r[2].score, 3);
  EXPECT_EQ(r[2].error, "");
  model.reset();
  expect_no_children();
}

TEST_F(RewardCommandTest, ExitBetweenRequestsIsRestartedQuietly) {
  auto model = make_model({command_spec("once.sh")});
  ASSERT_TRUE(model);
  for (int round = 0; round < 3; ++round) {
    auto r = model->score(batch_of({"a"}));
    EXPECT_EQ(r[0].score, 1);
    EXPECT_EQ(r[0].error, "");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it has exited by now
  }
}

TEST_F(RewardCommandTest, CommandThatCannotStart) {
  RewardSpec s = spec_of("command");
  s.command = dir_ + "/does-not-exist";
  s.timeout_s = 5;
  auto model = make_model({s});
  ASSERT_TRUE(model);
  auto t0 = Clock::now();
  auto r = model->score(batch_of({"a", "b"}));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(4));
  for (const auto& x : r) {
    EXPECT_EQ(x.score, 0);
    EXPECT_NE(x.error.find("exited with status 127"), std::string::npos) << x.error;
  }
  model.reset();
  expect_no_children();
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

// The python kind: a module of the test's, imported by the embedded interpreter from python_path.
class RewardPythonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/miles_reward_py_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/graders");
    std::ofstream(dir_ + "/graders/__init__.py") << "";
    std::ofstream(dir_ + "/graders/arith.py") << R"(import asyncio, threading

calls = []

def exact(sample):
    calls.append(sample['prompt'])
    return sample['response'].strip() == str(sample['label'])

def parts(sample):
    return {'score': 0.25 * sample['response_tokens']}

def crash(sample):
    if sample['response'] == 'boom':
        raise ValueError('no answer in ' + repr(sample['response']))
    return 1

def wrong_type(sample):
    return 'high'

_running = 0
peak = 0

async def judge(sample):
    global _running, peak
    _running += 1
    peak = max(peak, _running)
    await asyncio.sleep(0.05)
    _running -= 1
    return len(sample['response'])

async def peak_of(sample):
    return peak

class Grader:
    class Nested:
        @staticmethod
        def score(sample):
            return -1.5
)";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  RewardSpec python_spec(const std::string& function) {
    RewardSpec s = spec_of("python");
    s.function = function;
    s.python_path = dir_;
    return s;
  }

  std::string dir_;
};

TEST_F(RewardPythonTest, ScoresWithTheUsersFunction) {
  EXPECT_EQ(score_one(python_spec("graders.arith:exact"), sample(" 42 ", json(42))), 1.0);
  EXPECT_EQ(score_one(python_spec("graders.arith:exact"), sample("41", json(42))), 0.0);
  EXPECT_EQ(score_one(python_spec("graders.arith:parts"), sample("x", nullptr, 6)), 1.5);
  EXPECT_EQ(score_one(python_spec("graders.arith:Grader.Nested.score"), sample("x")), -1.5);
}

TEST_F(RewardPythonTest, ExceptionsAndBadResultsFailOnlyTheirSample) {
  auto model = make_model({python_spec("graders.arith:crash")});
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch = {sample("fine"), sample("boom"), sample("fine too")};
  auto r = model->score(batch);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].score, 1.0);
  EXPECT_EQ(r[0].error, "");
  EXPECT_EQ(r[1].score, 0.0);
  // The Python traceback, down to the user's line.
  EXPECT_NE(r[1].error.find("Traceback (most recent call last)"), std::string::npos) << r[1].error;
  EXPECT_NE(r[1].error.find("arith.py\", line 14, in crash"), std::string::npos) << r[1].error;
  EXPECT_NE(r[1].error.find("ValueError: no answer in 'boom'"), std::string::npos) << r[1].error;
  EXPECT_EQ(r[2].score, 1.0);
  std::string error;
  EXPECT_EQ(score_one(python_spec("graders.arith:wrong_type"), sample("x"), &error), 0.0);
  EXPECT_NE(error.find("TypeError: returned str, not a number"), std::string::npos) << error;
}

// An async function gets the batch at once: its calls overlap.
TEST_F(RewardPythonTest, AsyncFunctionsRunTheBatchConcurrently) {
  auto model = make_model({python_spec("graders.arith:judge")});
  ASSERT_TRUE(model);
  std::vector<RewardInput> batch;
  for (int i = 0; i < 8; ++i) batch.push_back(sample(std::string(i + 1, 'a')));
  auto r = model->score(batch);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(r[i].score, i + 1) << r[i].error;
  // The most calls the module saw running at once: a count, which other tests sharing the two cores
  // cannot stretch as they can a time.
  EXPECT_EQ(score_one(python_spec("graders.arith:peak_of"), sample("x")), 8.0);
}

// What cannot work is refused when the reward is created, naming the function.
TEST_F(RewardPythonTest, ImportErrorsStopTheJobAtStart) {
  EXPECT_NE(create_error({python_spec("graders.nothere:fn")})
                .find("cannot load function graders.nothere:fn: ModuleNotFoundError: No module "
                      "named 'graders.nothere'"),
            std::string::npos);
  EXPECT_NE(create_error({python_spec("graders.arith:missing")})
                .find("AttributeError: module 'graders.arith' has no attribute 'missing'"),
            std::string::npos);
  EXPECT_NE(create_error({python_spec("graders.arith:peak")}).find("is int, not a function"),
            std::string::npos);
  RewardSpec no_colon = python_spec("graders.arith.exact");
  EXPECT_NE(create_error({no_colon})
                .find("function must be \"package.module:name\", got \"graders.arith.exact\""),
            std::string::npos);
  EXPECT_NE(create_error({python_spec("")}).find("function is required for a python reward"),
            std::string::npos);
}

// Scorers on several threads at once (one model each, as concurrent runners have): the GIL is
// taken per call.
TEST_F(RewardPythonTest, ScorersOnSeveralThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto model = RewardModel::create({python_spec("graders.arith:exact")});
      if (!model.ok()) return;
      for (int i = 0; i < 50; ++i) {
        RewardInput in = sample(std::to_string(i), json(i));
        right += (*model)->score(std::span<const RewardInput>(&in, 1))[0].score == 1.0;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(right.load(), 200);
}

}  // namespace
}  // namespace miles
