// rollout.function (controller/rollout_function.h): the user's async Python function, its client's
// requests reaching the host, results and tracebacks coming back, samples running side by side.
#include "controller/rollout_function.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

namespace miles::controller {
namespace {

using nlohmann::json;

// Records the requests; answers chat with a canned reply; optionally waits until `gate` calls are
// in flight at once (a latch with a timeout) to show that the samples' Python runs concurrently.
class FakeHost : public RolloutHost {
 public:
  explicit FakeHost(int gate = 0) : gate_(gate) {}
  Result<json> call(const std::string& op, const nlohmann::ordered_json& ordered) override {
    const json request = json::parse(ordered.dump());
    {
      std::unique_lock<std::mutex> lock(mu_);
      raw_.push_back(ordered.dump());
      requests_.push_back({{"op", op}, {"request", request}});
      if (gate_ > 0) {
        ++waiting_;
        cv_.notify_all();
        if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return waiting_ >= gate_; }))
          return Status::Error("the other samples never arrived: the calls were serialised");
      }
    }
    if (op == "chat" && request["messages"].back()["content"] == "refuse")
      return json{{"rejected", "an earlier message was edited"}};
    if (op == "chat") {
      json messages = request["messages"];
      messages.push_back({{"role", "assistant"}, {"content", "4"}});
      return json{{"content", "4"},
                  {"finish_reason", "stop"},
                  {"completion_tokens", 2},
                  {"messages", messages}};
    }
    if (op == "generate") return Status::Error("the engines are gone");
    return Status::Error("unknown op " + op);
  }
  std::vector<json> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<std::string> raw() {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<json> requests_;
  std::vector<std::string> raw_;  // as received: keys in Python's order
  int gate_;
  int waiting_ = 0;
};

class RolloutFunctionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/miles_rollout_py_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/agents.py") << R"(import asyncio

async def two_turns(client, sample):
    assert client.sample == sample
    messages = sample['messages'] + [{'role': 'user', 'content': 'what is 2+2?'}]
    reply = await client.chat(messages, max_new_tokens=5, stop='\n',
                              tools=[{'type': 'function', 'function': {'name': 'calc'}}])
    messages = reply['messages'] + [{'role': 'tool', 'content': '4'}]
    reply = await client.chat(messages, chat_template_kwargs={'enable_thinking': False})
    return {'reward': 1.0, 'answer': reply['content'], 'index': sample['index']}

async def nothing(client, sample):
    return None

async def crash(client, sample):
    await client.chat(sample['messages'])
    raise ZeroDivisionError('no answer')

async def engines_gone(client, sample):
    return await client.generate('Once upon a time')

async def rejected(client, sample):
    try:
        await client.chat([{'role': 'user', 'content': 'refuse'}])
    except ValueError as e:
        return 'rejected: ' + str(e)

async def unserialisable(client, sample):
    return {1, 2}

async def gathered(client, sample):
    await client.chat(sample['messages'])
    return sample['index']

def not_async(client, sample):
    return 1
)";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<RolloutFunction> load(const std::string& name) {
    auto f = RolloutFunction::load("agents:" + name, dir_);
    EXPECT_TRUE(f.ok()) << f.message();
    return f.ok() ? std::move(f).value() : nullptr;
  }

  static nlohmann::ordered_json sample(int index) {
    using oj = nlohmann::ordered_json;
    return {{"messages", oj::array({{{"role", "system"}, {"content", "be brief"}}})},
            {"prompt", "be brief"},
            {"label", 4},
            {"row", 7},
            {"index", index}};
  }

  std::string dir_;
};

TEST_F(RolloutFunctionTest, ChatTurnsReachTheHostAndTheResultComesBack) {
  auto fn = load("two_turns");
  ASSERT_TRUE(fn);
  FakeHost host;
  RolloutOutcome out = fn->run(sample(3), host);
  EXPECT_EQ(out.error, "");
  EXPECT_EQ(out.result, (json{{"reward", 1.0}, {"answer", "4"}, {"index", 3}}));
  const auto req = host.requests();
  ASSERT_EQ(req.size(), 2u);
  EXPECT_EQ(req[0]["op"], "chat");
  EXPECT_EQ(req[0]["request"]["max_new_tokens"], 5);
  EXPECT_EQ(req[0]["request"]["stop"], json::array({"\n"}));
  EXPECT_EQ(req[0]["request"]["tools"][0]["function"]["name"], "calc");
  EXPECT_EQ(req[0]["request"]["messages"].size(), 2u);
  EXPECT_EQ(req[1]["request"]["messages"].size(), 4u);  // + the reply + the tool message
  EXPECT_EQ(req[1]["request"]["messages"][2]["content"], "4");
  EXPECT_EQ(req[1]["request"]["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_FALSE(req[1]["request"].contains("max_new_tokens"));
  // Keys arrive in the order Python wrote them (templates render tool schemas in that order).
  EXPECT_NE(host.raw()[0].find("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
                               "\"calc\"}}]"),
            std::string::npos)
      << host.raw()[0];
  EXPECT_NE(host.raw()[0].find("{\"role\":\"system\",\"content\":\"be brief\"}"), std::string::npos)
      << host.raw()[0];
}

TEST_F(RolloutFunctionTest, ErrorsComeBackAsTracebacks) {
  FakeHost host;
  RolloutOutcome crash = load("crash")->run(sample(0), host);
  EXPECT_NE(crash.error.find("ZeroDivisionError: no answer"), std::string::npos) << crash.error;
  EXPECT_NE(crash.error.find("agents.py\", line 17, in crash"), std::string::npos) << crash.error;
  EXPECT_NE(crash.error.find("agents:crash"), std::string::npos) << crash.error;
  RolloutOutcome gone = load("engines_gone")->run(sample(0), host);
  EXPECT_NE(gone.error.find("RuntimeError: the engines are gone"), std::string::npos) << gone.error;
  RolloutOutcome odd = load("unserialisable")->run(sample(0), host);
  EXPECT_NE(odd.error.find("TypeError"), std::string::npos) << odd.error;
  EXPECT_NE(odd.error.find("not JSON serializable"), std::string::npos) << odd.error;
  RolloutOutcome none = load("nothing")->run(sample(0), host);
  EXPECT_EQ(none.error, "");
  EXPECT_TRUE(none.result.is_null());
}

TEST_F(RolloutFunctionTest, ARejectedConversationIsAValueError) {
  FakeHost host;
  RolloutOutcome out = load("rejected")->run(sample(0), host);
  EXPECT_EQ(out.error, "");
  EXPECT_EQ(out.result, "rejected: an earlier message was edited");
}

TEST_F(RolloutFunctionTest, LoadErrorsNameTheFunction) {
  auto missing = RolloutFunction::load("agents:nope", dir_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cannot load agents:nope"), std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find("AttributeError"), std::string::npos) << missing.message();
  auto sync = RolloutFunction::load("agents:not_async", dir_);
  ASSERT_FALSE(sync.ok());
  EXPECT_NE(sync.message().find("agents:not_async must be an async def function"),
            std::string::npos)
      << sync.message();
  auto module = RolloutFunction::load("no_such_agents:run", dir_);
  ASSERT_FALSE(module.ok());
  EXPECT_NE(module.message().find("ModuleNotFoundError"), std::string::npos) << module.message();
}

// Four samples on four threads: each one's chat waits (in the host, the GIL released) until all
// four are in flight. Were Python holding the GIL through a request, they would never meet.
TEST_F(RolloutFunctionTest, SamplesRunSideBySide) {
  auto fn = load("gathered");
  ASSERT_TRUE(fn);
  FakeHost host(/*gate=*/4);
  std::vector<RolloutOutcome> out(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { out[i] = fn->run(sample(i), host); });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i].error, "") << i;
    EXPECT_EQ(out[i].result, i);
  }
}

}  // namespace
}  // namespace miles::controller
