// The HTTP server over real loopback sockets: /generate (plain, streamed, n > 1) returns exactly
// what the engine computes; bad requests get a 4xx with a message and the server stays up; a client
// that disconnects mid-stream frees its KV blocks, and one that goes away aborts its samples
// whatever the reply's shape; the weight lifecycle endpoints; 256 concurrent clients.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"
#include "miles/rollout/http_server.h"
#include "test_paths.h"

namespace miles::rollout {
namespace {

using nlohmann::json;

struct Served {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<EngineDriver> driver;
  std::unique_ptr<HttpServer> server;
  int64_t idle_blocks = 0;

  Served(const std::string& model_path, const std::string& tokenizer_path, EngineOptions eo) {
    auto m = Model::load(model_path);
    EXPECT_TRUE(m.ok()) << m.message();
    model = std::shared_ptr<const Model>(std::move(m).value());
    if (!tokenizer_path.empty()) {
      auto t = load_tokenizer(tokenizer_path, static_cast<int32_t>(model->config().vocab_size));
      EXPECT_TRUE(t.ok()) << t.message();
      tok = std::shared_ptr<const Tokenizer>(std::move(t).value());
    }
    pool = std::make_unique<ThreadPool>(2);
    driver = std::make_unique<EngineDriver>(
        std::make_unique<Engine>(make_model_runner(model, pool.get()), eo, tok));
    ServerOptions so;
    so.port = 0;
    so.model_path = model_path;
    server = std::make_unique<HttpServer>(*driver, model->config(), tok, nullptr, pool.get(), so);
    Status s = server->start();
    EXPECT_TRUE(s.ok()) << s.message();
    idle_blocks = eo.num_blocks;
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  EngineStats stats() const {
    return driver->call<EngineStats>([](Engine& e) { return e.stats(); });
  }
  int64_t free_blocks() const { return stats().free_blocks; }
};

std::string moe_dir() { return test::data_dir() + "/models/qwen3_moe"; }

json post(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response from " << path;
  if (!r) return json();
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

json gen_body(std::vector<int> ids, int max_new, uint64_t seed) {
  return {{"input_ids", ids},
          {"sampling_params", {{"temperature", 0.8}, {"max_new_tokens", max_new}, {"seed", seed}}},
          {"return_logprob", true},
          {"return_routed_experts", true}};
}

TEST(Server, GenerateEqualsTheEngineAndStreamsTheSameTokens) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 256, .block_tokens = 8});
  auto c = s.client();
  int status = 0;
  json r = post(c, "/generate", gen_body({5, 9, 33, 100, 7, 8, 1000}, 10, 4), &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["output_ids"].size(), 10u);
  EXPECT_EQ(r["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(r["meta_info"]["output_token_logprobs"].size(), 10u);
  EXPECT_EQ(r["meta_info"]["routed_experts"].size(), (7u + 10u - 1u) * 4u);
  EXPECT_EQ(r["meta_info"]["routed_experts_shape"], json::array({16, 2, 2}));

  // The engine directly, same request: same ids and logprobs to the bit.
  Engine e(make_model_runner(s.model, nullptr), EngineOptions{.num_blocks = 64, .block_tokens = 8});
  GenerateRequest g;
  g.input_ids = {5, 9, 33, 100, 7, 8, 1000};
  g.sampling.temperature = 0.8f;
  g.sampling.seed = 4;
  g.max_new_tokens = 10;
  SampleEvent fin;
  ASSERT_TRUE(e.submit(g, [&](const SampleEvent& ev) { if (ev.finished) fin = ev; }).ok());
  while (!e.idle()) e.step();
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(r["output_ids"][i].get<int>(), fin.output[i].id);
    const float lp = r["meta_info"]["output_token_logprobs"][i][0].get<float>();
    EXPECT_EQ(std::memcmp(&lp, &fin.output[i].tempered_logprob, 4), 0);
    const float sampling = r["meta_info"]["output_token_sampling_logprobs"][i].get<float>();
    EXPECT_EQ(std::memcmp(&sampling, &fin.output[i].logprob, 4), 0);
  }

  // Streamed: SSE chunks ending with [DONE]; the last chunk carries the same ids.
  json body = gen_body({5, 9, 33, 100, 7, 8, 1000}, 10, 4);
  body["stream"] = true;
  std::string sse;
  auto res = c.Post("/generate", body.dump(), "application/json");
  ASSERT_TRUE(res);
  sse = res->body;
  ASSERT_NE(sse.find("data: [DONE]"), std::string::npos);
  const size_t last = sse.rfind("data: {");
  json final_chunk = json::parse(sse.substr(last + 6, sse.find("\n\n", last) - last - 6));
  EXPECT_EQ(final_chunk["output_ids"], r["output_ids"]);
  EXPECT_EQ(s.free_blocks(), s.idle_blocks - s.stats().cached_blocks);
}

TEST(Server, GroupOfEightReturnsEightSamples) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 256, .block_tokens = 8});
  auto c = s.client();
  json body = gen_body({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 6, 9);
  body["sampling_params"]["n"] = 8;
  int status = 0;
  json r = post(c, "/generate", body, &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(r.is_array());
  ASSERT_EQ(r.size(), 8u);
  EXPECT_EQ(r[3]["meta_info"]["cached_tokens"], 11);
}

TEST(Server, BadRequestsGet4xxAndTheServerStaysUp) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 64, .block_tokens = 8});
  auto c = s.client();
  auto expect_400 = [&](const std::string& body, const std::string& needle) {
    auto r = c.Post("/generate", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_NE(r->body.find(needle), std::string::npos) << r->body;
  };
  expect_400("{\"input_ids\": [1, 2", "malformed JSON");
  expect_400(R"({"input_ids": [1], "bogus": 1})", "unknown field 'bogus'");
  expect_400(R"({"input_ids": [1, 99999]})", "outside the vocabulary");
  expect_400(json{{"input_ids", std::vector<int>(300, 1)}}.dump(), "context length");
  expect_400(R"({"input_ids": [1], "sampling_params": {"max_new_tokens": -5}})", "max_new_tokens");
  expect_400(R"({"input_ids": [1], "sampling_params": {"temperature": "hot"}})", "temperature");
  expect_400(R"({"input_ids": [1], "sampling_params": {"n": 100000}})", "n = 100000");
  expect_400(R"({"text": "hello"})", "tokenizer");
  expect_400(R"({"input_ids": [1], "text": "x"})", "exactly one");
  expect_400(R"([1, 2, 3])", "JSON object");
  expect_400(R"({"input_ids": [1], "lora_path": "adapter"})", "lora_path");
  auto r = c.Post("/pause_generation", R"({"mode": "sideways"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("miles_http_errors_total 12"), std::string::npos) << m->body;
}

// A streaming client that leaves after its first read: the engine is paused in place before it
// closes, so its sample cannot finish on its own; only the abort the server sends when it finds the
// client gone frees its blocks. The sample asks for most of the blocks' tokens, and the pause is
// checked to have caught it unfinished: when the engine finished it first (a fast machine, a
// descheduled client), that attempt shows nothing and is made again.
TEST(Server, ClientDisconnectMidStreamFreesItsBlocks) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 64, .block_tokens = 8,
                                        .enable_prefix_cache = false});
  auto c = s.client();
  constexpr int kMaxNew = 236;  // with the 17 prompt tokens, within the model's 256 positions
  bool caught_unfinished = false;
  for (int attempt = 0; attempt < 5 && !caught_unfinished; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    json body = gen_body({3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, kMaxNew, 1);
    body["stream"] = true;
    body["sampling_params"]["ignore_eos"] = true;
    const uint64_t generated_before = s.stats().generated_tokens;
    int chunks = 0;
    uint64_t generated_at_pause = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/generate";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      EXPECT_EQ(std::string(data, std::min<size_t>(size, 5)), "data:") << std::string(data, size);
      ++chunks;
      s.driver->run_sync([&](Engine& e) {  // what /pause_generation in_place does, sooner
        e.pause(PauseMode::kInPlace);
        caught_unfinished = !e.idle();
        generated_at_pause = e.stats().generated_tokens;
      });
      return false;  // the client goes
    };
    httplib::Client streaming("127.0.0.1", s.server->port());
    httplib::Response res;
    httplib::Error err;
    streaming.send(req, res, err);
    streaming.stop();
    ASSERT_EQ(chunks, 1);
    for (int i = 0; i < 100 && s.free_blocks() != s.idle_blocks; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(s.free_blocks(), s.idle_blocks);
    EXPECT_TRUE(s.driver->call<bool>([](Engine& e) { return e.idle(); }));
    // Paused, the engine generated nothing after the pause; caught unfinished (no EOS:
    // ignore_eos), the abort ended the sample short of its length.
    EXPECT_EQ(s.stats().generated_tokens, generated_at_pause);
    if (caught_unfinished) {
      EXPECT_LT(generated_at_pause - generated_before, kMaxNew);
    }
    int status = 0;
    post(c, "/continue_generation", json::object(), &status);
    EXPECT_EQ(status, 200);
  }
  EXPECT_TRUE(caught_unfinished) << "every attempt's sample finished before the pause landed";
}

// Every reply shape (/generate and /v1/completions, a body at the end or a stream) aborts the
// samples of a client that has gone. The engine is paused in place first, so the request can only
// wait: without the abort it would wait until the engine continues; the client gives up after a
// second and closes its connection, and the server must notice (the heartbeat's write, or the
// stream's check while no event comes) and abort.
TEST(Server, AClientThatGoesAwayAbortsItsSamplesInEveryReplyShape) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 64, .block_tokens = 8});
  auto c = s.client();
  const std::vector<int> prompt = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  struct Shape {
    const char* path;
    bool stream;
  };
  for (const Shape& shape : {Shape{"/generate", false}, Shape{"/generate", true},
                             Shape{"/v1/completions", false}, Shape{"/v1/completions", true}}) {
    SCOPED_TRACE(std::string(shape.path) + (shape.stream ? ", streamed" : ", at the end"));
    int status = 0;
    post(c, "/pause_generation", {{"mode", "in_place"}}, &status);
    ASSERT_EQ(status, 200);
    json body = std::string(shape.path) == "/generate"
                    ? gen_body(prompt, 20, 1)
                    : json{{"prompt", prompt}, {"max_tokens", 20}, {"n", 2}};
    body["stream"] = shape.stream;
    httplib::Client gone("127.0.0.1", s.server->port());
    gone.set_read_timeout(1, 0);
    auto r = gone.Post(shape.path, body.dump(), "application/json");
    EXPECT_FALSE(r) << "the paused engine answered: " << r->body;
    gone.stop();
    bool idle = false;  // no request left in the engine: the gone client's was aborted
    for (int i = 0; i < 100 && !idle; ++i) {
      idle = s.driver->call<bool>([](Engine& e) { return e.idle(); });
      if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(idle);
    post(c, "/continue_generation", json::object(), &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(s.free_blocks(), s.idle_blocks);
  }
  // The server still answers.
  int status = 0;
  post(c, "/generate", gen_body(prompt, 3, 1), &status);
  EXPECT_EQ(status, 200);
}

TEST(Server, WeightLifecycleEndpoints) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 64, .block_tokens = 8});
  auto c = s.client();
  int status = 0;
  post(c, "/pause_generation", {{"mode", "retract"}}, &status);
  EXPECT_EQ(status, 200);
  post(c, "/flush_cache", json::object(), &status);
  EXPECT_EQ(status, 200);
  json bad = post(c, "/update_weights_from_disk", {{"model_path", "/no/such/dir"}}, &status);
  EXPECT_EQ(status, 400);
  json ok = post(c, "/update_weights_from_disk", {{"model_path", moe_dir()}, {"weight_version", 7}},
                 &status);
  EXPECT_EQ(status, 200) << ok.dump();
  post(c, "/continue_generation", json::object(), &status);
  EXPECT_EQ(status, 200);
  json r = post(c, "/generate", gen_body({1, 2, 3}, 3, 1), &status);
  ASSERT_EQ(status, 200);
  for (auto& v : r["meta_info"]["output_token_weight_versions"]) EXPECT_EQ(v, 7);
  post(c, "/update_weight_version", {{"new_version", 8}}, &status);
  EXPECT_EQ(status, 200);
  auto info = c.Get("/get_model_info");
  ASSERT_TRUE(info);
  EXPECT_EQ(json::parse(info->body)["weight_version"], "8");
  EXPECT_EQ(json::parse(info->body)["architecture"], "Qwen3MoeForCausalLM");
}

TEST(Server, TextPromptsStopStringsAndAbortByRid) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::shared_dir() + "/models/stories260K/";
  Served s(dir + "stories260K.bin", dir + "tok512.bin", EngineOptions{.num_blocks = 256});
  auto c = s.client();
  int status = 0;
  json r = post(c, "/generate",
                {{"text", "Once upon a time"},
                 {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 56}}}},
                &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(r["text"].get<std::string>(),
            ", there was a little girl named Lily. She loved to play outside in the park. One day, "
            "she saw a big, red ball. She wanted to play with it, but it was too high");
  r = post(c, "/generate",
           {{"text", "Once upon a time"},
            {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 56}, {"stop", "Lily"}}}},
           &status);
  EXPECT_EQ(r["text"].get<std::string>(), ", there was a little girl named ");
  EXPECT_EQ(r["meta_info"]["finish_reason"]["matched"], "Lily");
  EXPECT_EQ(r["meta_info"]["finish_reason"]["type"], "stop");
  auto missing = c.Post("/abort_request", R"({"rid": "nope"})", "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 200);  // SGLang's answer: the request may have finished already
}

// 256 concurrent clients, a quarter of them invalid: every valid request completes.
TEST(Server, LoadOf256ConcurrentClients) {
  Served s(moe_dir(), "", EngineOptions{.num_blocks = 2048, .block_tokens = 8,
                                        .max_batch_tokens = 512});
  std::atomic<int> ok{0}, rejected{0}, wrong{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 256; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", s.server->port());
      c.set_read_timeout(120, 0);
      c.set_connection_timeout(30, 0);
      const bool valid = i % 4 != 0;
      json body = valid ? gen_body({1 + i % 50, 2, 3, 4 + i % 7}, 4 + i % 5, i)
                        : json{{"input_ids", {1, 5000 + i}}};
      if (valid && i % 3 == 0) body["stream"] = true;
      auto r = c.Post("/generate", body.dump(), "application/json");
      if (!r) {
        if (wrong++ == 0) ADD_FAILURE() << "client " << i << ": " << httplib::to_string(r.error());
      } else if (valid && r->status == 200) {
        ++ok;
      } else if (!valid && r->status == 400) {
        ++rejected;
      } else {
        if (wrong++ == 0) ADD_FAILURE() << "client " << i << ": status " << r->status << " " << r->body;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok, 192);
  EXPECT_EQ(rejected, 64);
  EXPECT_EQ(wrong, 0);
}

}  // namespace
}  // namespace miles::rollout
