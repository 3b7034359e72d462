// The SGLang surface of `miles serve` over real loopback sockets: fresh seeds that replay bit for
// bit, logprobs pinned to the teacher-forced forward `miles score` runs (output, input, top,
// tempered and the exact sampling value), penalties and logit_bias, batched prompts, abort_all, the
// load, health, version and memory routes, and refused fields named in the error.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "miles/rollout/engine.h"
#include "miles/kernels.h"
#include "miles/sampler.h"
#include "miles/thread_pool.h"
#include "miles/rollout/http_server.h"
#include "rollout/logit_adjust.h"
#include "rollout/tool_calls.h"
#include "test_paths.h"

namespace miles::rollout {
namespace {

using nlohmann::json;

struct Served {
  std::shared_ptr<const Model> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<EngineDriver> driver;
  std::unique_ptr<HttpServer> server;

  explicit Served(std::optional<uint64_t> random_seed = std::nullopt) {
    auto m = Model::load(test::data_dir() + "/models/qwen3_moe");
    EXPECT_TRUE(m.ok()) << m.message();
    model = std::shared_ptr<const Model>(std::move(m).value());
    pool = std::make_unique<ThreadPool>(2);
    EngineOptions eo{.num_blocks = 256, .block_tokens = 8};
    eo.random_seed = random_seed;
    driver = std::make_unique<EngineDriver>(
        std::make_unique<Engine>(make_model_runner(model, pool.get()), eo, nullptr));
    ServerOptions so;
    so.port = 0;
    so.block_tokens = 8;
    so.random_seed = random_seed;
    so.weight_dirs = {test::data_dir() + "/models/qwen3_moe"};
    server =
        std::make_unique<HttpServer>(*driver, model->config(), nullptr, nullptr, pool.get(), so);
    Status s = server->start();
    EXPECT_TRUE(s.ok()) << s.message();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(60, 0);
    return c;
  }
};

json post(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response from " << path;
  if (!r) return json();
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

json get(httplib::Client& c, const std::string& path, int* status = nullptr) {
  auto r = c.Get(path.c_str());
  EXPECT_TRUE(r) << "no response from " << path;
  if (!r) return json();
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

const std::vector<int> kPrompt = {5, 9, 33, 100, 7, 8, 1000, 12, 13};

json sample(const std::vector<int>& ids, json sp, bool logprob = true) {
  if (sp.is_null()) sp = json::object();
  sp["max_new_tokens"] = sp.value("max_new_tokens", 8);
  return {{"input_ids", ids}, {"sampling_params", sp}, {"return_logprob", logprob}};
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// What `miles score` computes: one teacher-forced forward over the whole sequence, logits rows.
std::vector<float> teacher_forced_logits(const Model& m, const std::vector<int32_t>& ids) {
  auto kv = m.make_kv_cache();
  SeqSpan span{0, 0, static_cast<int64_t>(ids.size())};
  ForwardOptions fo;
  auto out = m.forward(ids, {&span, 1}, *kv, fo, nullptr);
  EXPECT_TRUE(out.ok()) << out.message();
  return out->logits;
}

std::vector<int32_t> ids_of(const json& r) {
  std::vector<int32_t> ids;
  for (const auto& x : r["output_ids"]) ids.push_back(x.get<int32_t>());
  return ids;
}

// The teacher-forced logits of kPrompt followed by `out` (a response's output ids).
std::vector<float> logits_of_prompt_and(const Model& m, const std::vector<int32_t>& out) {
  std::vector<int32_t> seq(kPrompt.begin(), kPrompt.end());
  seq.insert(seq.end(), out.begin(), out.end());
  return teacher_forced_logits(m, seq);
}

TEST(ServerApi, RequestsWithoutASeedDrawFreshSamplesThatReplayBitForBit) {
  Served s;
  auto c = s.client();
  int status = 0;
  json a = post(c, "/generate", sample(kPrompt, {{"temperature", 1.0}, {"max_new_tokens", 16}}),
                &status);
  ASSERT_EQ(status, 200) << a.dump();
  json b = post(c, "/generate", sample(kPrompt, {{"temperature", 1.0}, {"max_new_tokens", 16}}));
  EXPECT_NE(a["output_ids"], b["output_ids"]) << "two unseeded requests drew the same sample";
  EXPECT_NE(a["meta_info"]["sampling_seed"], b["meta_info"]["sampling_seed"]);
  // The reported seed replays the sample: ids and every logprob field to the bit.
  json replay = post(c, "/generate",
                     sample(kPrompt, {{"temperature", 1.0},
                                      {"max_new_tokens", 16},
                                      {"sampling_seed", a["meta_info"]["sampling_seed"]}}));
  EXPECT_EQ(replay["output_ids"], a["output_ids"]);
  EXPECT_EQ(replay["meta_info"]["output_token_logprobs"], a["meta_info"]["output_token_logprobs"]);
  EXPECT_EQ(replay["meta_info"]["output_token_sampling_logprobs"],
            a["meta_info"]["output_token_sampling_logprobs"]);

  // n > 1 without a seed: distinct streams, each replayable alone with its own seed.
  json group = post(c, "/generate",
                    sample(kPrompt, {{"temperature", 1.0}, {"max_new_tokens", 12}, {"n", 4}}));
  ASSERT_TRUE(group.is_array());
  ASSERT_EQ(group.size(), 4u);
  std::set<std::string> outputs;
  for (const auto& g : group) outputs.insert(g["output_ids"].dump());
  EXPECT_EQ(outputs.size(), 4u);
  json third = post(c, "/generate",
                    sample(kPrompt, {{"temperature", 1.0},
                                     {"max_new_tokens", 12},
                                     {"sampling_seed", group[2]["meta_info"]["sampling_seed"]}}));
  EXPECT_EQ(third["output_ids"], group[2]["output_ids"]);
}

TEST(ServerApi, RandomSeedMakesTheServerReproducible) {
  std::vector<json> runs;
  for (int i = 0; i < 2; ++i) {
    Served s(uint64_t{1234});
    auto c = s.client();
    json r = post(c, "/generate", sample(kPrompt, {{"temperature", 1.0}, {"n", 3}}));
    for (json& one : r) one["meta_info"].erase("e2e_latency");  // wall time, not a sample
    runs.push_back(r);
    EXPECT_EQ(get(c, "/get_server_info")["random_seed"], 1234);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(ServerApi, GreedyLogprobsAreTheModelsLogSoftmaxAsMilesScoreComputesThem) {
  Served s;
  auto c = s.client();
  int status = 0;
  json body = sample(kPrompt, {{"temperature", 0}, {"max_new_tokens", 6}});
  body["logprob_start_len"] = 0;
  body["top_logprobs_num"] = 3;
  json r = post(c, "/generate", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const std::vector<int32_t> out = ids_of(r);
  const std::vector<float> logits = logits_of_prompt_and(*s.model, out);
  const int64_t v = s.model->config().vocab_size;
  std::vector<float> lp(v);
  const json& meta = r["meta_info"];
  // Output tokens: log_softmax of the raw logits (never a constant 0), and the top 3 of that row.
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(kPrompt.size() + i) - 1;
    kernels::log_softmax_row(logits.data() + pos * v, v, lp.data());
    const float got = meta["output_token_logprobs"][i][0].get<float>();
    EXPECT_TRUE(same_bits(got, lp[out[i]])) << i << ": " << got << " vs " << lp[out[i]];
    EXPECT_LT(got, 0.0f);
    EXPECT_EQ(meta["output_token_logprobs"][i][1], out[i]);
    EXPECT_EQ(meta["output_top_logprobs"][i].size(), 3u);
    EXPECT_EQ(meta["output_top_logprobs"][i][0][1], out[i]);  // greedy: the top token
    EXPECT_TRUE(same_bits(meta["output_top_logprobs"][i][0][0].get<float>(), lp[out[i]]));
    EXPECT_EQ(meta["output_token_sampling_logprobs"][i], 0.0);  // a point mass: log 1
    EXPECT_TRUE(same_bits(meta["output_token_raw_logprobs"][i].get<float>(), lp[out[i]]));
  }
  // Input tokens from position 0: the first has no logprob, the rest are teacher-forced.
  const json& in = meta["input_token_logprobs"];
  ASSERT_EQ(in.size(), kPrompt.size());
  EXPECT_TRUE(in[0][0].is_null());
  EXPECT_EQ(in[0][1], kPrompt[0]);
  EXPECT_TRUE(meta["input_top_logprobs"][0].is_null());
  for (size_t k = 1; k < kPrompt.size(); ++k) {
    kernels::log_softmax_row(logits.data() + (k - 1) * v, v, lp.data());
    EXPECT_TRUE(same_bits(in[k][0].get<float>(), lp[kPrompt[k]])) << k;
    EXPECT_EQ(meta["input_top_logprobs"][k].size(), 3u);
  }
}

TEST(ServerApi, InputLogprobsFromAStartPositionSurvivePrefixCacheHits) {
  Served s;
  auto c = s.client();
  const std::vector<int> prompt = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  // Fill the prefix cache with this prompt first: the logprob request must still compute
  // positions from logprob_start_len - 1 on.
  post(c, "/generate", sample(prompt, {{"temperature", 0}}, false));
  json body = sample(prompt, {{"temperature", 0}, {"max_new_tokens", 2}});
  body["logprob_start_len"] = 12;
  int status = 0;
  json r = post(c, "/generate", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& in = r["meta_info"]["input_token_logprobs"];
  ASSERT_EQ(in.size(), prompt.size() - 12);
  const std::vector<float> logits =
      teacher_forced_logits(*s.model, std::vector<int32_t>(prompt.begin(), prompt.end()));
  const int64_t v = s.model->config().vocab_size;
  std::vector<float> lp(v);
  EXPECT_TRUE(in[0][0].is_null());  // SGLang: the first entry never has a logprob
  EXPECT_EQ(in[0][1], prompt[12]);
  for (size_t k = 13; k < prompt.size(); ++k) {
    kernels::log_softmax_row(logits.data() + (k - 1) * v, v, lp.data());
    EXPECT_TRUE(same_bits(in[k - 12][0].get<float>(), lp[prompt[k]])) << k;
    EXPECT_EQ(in[k - 12][1], prompt[k]);
  }
  body["logprob_start_len"] = static_cast<int>(prompt.size());  // the prompt's length: none
  json none = post(c, "/generate", body, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(none["meta_info"]["input_token_logprobs"].size(), 0u);
  body["logprob_start_len"] = static_cast<int>(prompt.size()) + 1;
  post(c, "/generate", body, &status);
  EXPECT_EQ(status, 400);
}

TEST(ServerApi, TemperedLogprobsFollowSGLangAndTheSamplingValueStaysExplicit) {
  Served s;
  auto c = s.client();
  json r = post(
      c, "/generate",
      sample(kPrompt,
             {{"temperature", 0.7}, {"top_k", 5}, {"sampling_seed", 11}, {"max_new_tokens", 6}}));
  const std::vector<int32_t> out = ids_of(r);
  const std::vector<float> logits = logits_of_prompt_and(*s.model, out);
  const int64_t v = s.model->config().vocab_size;
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 5;
  p.seed = 11;
  const json& meta = r["meta_info"];
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(kPrompt.size() + i) - 1;
    const std::span<const float> row(logits.data() + pos * v, static_cast<size_t>(v));
    // SGLang's value: log_softmax(logits / T), before top-k.
    EXPECT_TRUE(same_bits(meta["output_token_logprobs"][i][0].get<float>(),
                          tempered_logprob(row, p, out[i])))
        << i;
    // The trainer's value: the renormalised top-k distribution the token was drawn from.
    const SampleResult want = sample_token(row, p, i);
    EXPECT_EQ(want.token, out[i]);
    EXPECT_TRUE(same_bits(meta["output_token_sampling_logprobs"][i].get<float>(), want.logprob));
    EXPECT_GT(want.logprob, meta["output_token_logprobs"][i][0].get<float>());
  }
}

TEST(ServerApi, TokenIdsLogprobsAreTheRequestedTokensOfTheSameRowsInTheirOrder) {
  Served s;
  auto c = s.client();
  const std::vector<int32_t> ids = {100, 5, 7};  // not sorted: answered in this order
  json body = sample(kPrompt, {{"temperature", 0.7}, {"sampling_seed", 3}, {"max_new_tokens", 5}});
  body["logprob_start_len"] = 0;
  body["token_ids_logprob"] = ids;
  body["top_logprobs_num"] = 2;
  int status = 0;
  json r = post(c, "/generate", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const std::vector<int32_t> out = ids_of(r);
  const std::vector<float> logits = logits_of_prompt_and(*s.model, out);
  const int64_t v = s.model->config().vocab_size;
  SamplingParams tempered, raw;
  tempered.temperature = 0.7f;
  const json& meta = r["meta_info"];
  auto expect_row = [&](const json& got, int64_t pos, const SamplingParams& p) {
    const std::span<const float> row(logits.data() + pos * v, static_cast<size_t>(v));
    ASSERT_EQ(got.size(), ids.size()) << got.dump();
    for (size_t j = 0; j < ids.size(); ++j) {
      EXPECT_EQ(got[j][1], ids[j]);
      EXPECT_TRUE(same_bits(got[j][0].get<float>(), tempered_logprob(row, p, ids[j])))
          << "position " << pos << " token " << ids[j];
    }
  };
  // Output positions: the tempered row the top logprobs come from (the same bits for a shared id).
  ASSERT_EQ(meta["output_token_ids_logprobs"].size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(kPrompt.size() + i) - 1;
    expect_row(meta["output_token_ids_logprobs"][i], pos, tempered);
    for (const auto& top : meta["output_top_logprobs"][i])
      for (const auto& e : meta["output_token_ids_logprobs"][i])
        if (top[1] == e[1]) EXPECT_TRUE(same_bits(top[0].get<float>(), e[0].get<float>()));
  }
  // Input positions: the raw model, none for the first token (null, as SGLang).
  const json& in = meta["input_token_ids_logprobs"];
  ASSERT_EQ(in.size(), kPrompt.size());
  EXPECT_TRUE(in[0].is_null());
  for (size_t k = 1; k < kPrompt.size(); ++k) expect_row(in[k], static_cast<int64_t>(k) - 1, raw);

  // Batched: a list of lists is per prompt, one list is for every prompt; shapes are checked.
  json batch = {{"input_ids", json::array({kPrompt, std::vector<int>{1, 2, 3}})},
                {"sampling_params", {{"max_new_tokens", 2}}},
                {"return_logprob", true},
                {"token_ids_logprob", json::array({json::array({4}), json::array({6, 8})})}};
  json rb = post(c, "/generate", batch, &status);
  ASSERT_EQ(status, 200) << rb.dump();
  EXPECT_EQ(rb[0]["meta_info"]["output_token_ids_logprobs"][0].size(), 1u);
  EXPECT_EQ(rb[1]["meta_info"]["output_token_ids_logprobs"][0][1][1], 8);
  batch["token_ids_logprob"] = json::array({9});
  rb = post(c, "/generate", batch, &status);
  EXPECT_EQ(rb[1]["meta_info"]["output_token_ids_logprobs"][0][0][1], 9);
  batch["token_ids_logprob"] = json::array({json::array({4})});
  json e = post(c, "/generate", batch, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(e.dump().find("token_ids_logprob"), std::string::npos) << e.dump();
  body["token_ids_logprob"] = json::array({v});  // outside the vocabulary
  e = post(c, "/generate", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(e.dump().find("outside the vocabulary"), std::string::npos) << e.dump();
  // The default start (-1) is SGLang's: the last prompt token, one entry without a logprob.
  json dflt = post(c, "/generate", sample(kPrompt, {{"max_new_tokens", 1}}), &status);
  ASSERT_EQ(status, 200) << dflt.dump();
  ASSERT_EQ(dflt["meta_info"]["input_token_logprobs"].size(), 1u);
  EXPECT_TRUE(dflt["meta_info"]["input_token_logprobs"][0][0].is_null());
  EXPECT_EQ(dflt["meta_info"]["input_token_logprobs"][0][1], kPrompt.back());
  body["return_logprob"] = false;  // SGLang: no logprobs of any kind without return_logprob
  e = post(c, "/generate", body, &status);
  EXPECT_EQ(status, 200);
  EXPECT_FALSE(e["meta_info"].contains("output_token_ids_logprobs"));
}

TEST(ServerApi, LogitBiasPenaltiesAndMinNewTokensShapeSampling) {
  Served s;
  auto c = s.client();
  int status = 0;
  json biased =
      post(c, "/generate", sample(kPrompt, {{"temperature", 0}, {"logit_bias", {{"77", 100.0}}}}),
           &status);
  ASSERT_EQ(status, 200) << biased.dump();
  for (const auto& id : biased["output_ids"]) EXPECT_EQ(id, 77);
  // The raw logprob stays the model's; the tempered one is the adjusted row's.
  EXPECT_LT(biased["meta_info"]["output_token_raw_logprobs"][0].get<float>(), -1.0f);
  EXPECT_GT(biased["meta_info"]["output_token_logprobs"][0][0].get<float>(), -0.01f);

  // A frequency penalty forbids repeating the forced token once it has appeared.
  json penalised =
      post(c, "/generate",
           sample(kPrompt,
                  {{"temperature", 0}, {"frequency_penalty", 2.0}, {"logit_bias", {{"77", 3.0}}}}));
  std::set<int> distinct;
  for (const auto& id : penalised["output_ids"]) distinct.insert(id.get<int>());
  EXPECT_GT(distinct.size(), 1u);

  // min_new_tokens: a stop token that would end the sample at once is masked until then.
  json stop_now =
      post(c, "/generate",
           sample(kPrompt,
                  {{"temperature", 0}, {"logit_bias", {{"42", 100.0}}}, {"stop_token_ids", {42}}}));
  EXPECT_EQ(stop_now["output_ids"].size(), 1u);
  json min_new = post(c, "/generate",
                      sample(kPrompt, {{"temperature", 0},
                                       {"logit_bias", {{"42", 100.0}}},
                                       {"stop_token_ids", {42}},
                                       {"min_new_tokens", 4}}));
  ASSERT_EQ(min_new["output_ids"].size(), 5u);
  EXPECT_EQ(min_new["output_ids"][4], 42);
  EXPECT_EQ(min_new["meta_info"]["finish_reason"]["matched"], 42);

  for (const auto& [sp, needle] : std::vector<std::pair<json, std::string>>{
           {{{"repetition_penalty", 0.0}}, "repetition_penalty"},
           {{{"presence_penalty", 3.0}}, "presence_penalty"},
           {{{"min_new_tokens", 100}}, "min_new_tokens"},
           {{{"logit_bias", {{"99999", 1.0}}}}, "logit_bias"},
           {{{"logit_bias", {{"x", 1.0}}}}, "logit_bias"}}) {
    json e = post(c, "/generate", sample(kPrompt, sp), &status);
    EXPECT_EQ(status, 400) << sp.dump();
    EXPECT_NE(e.dump().find(needle), std::string::npos) << e.dump();
  }
}

TEST(LogitAdjust, EachAdjustmentIsItsFormula) {
  const std::vector<float> x = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  const std::vector<int32_t> seq = {0, 1, 1, 3};  // prompt {0, 1}, output {1, 3}
  LogitAdjustments a;
  a.repetition_penalty = 1.5f;  // output tokens only (SGLang), prompt token 0 untouched
  std::vector<float> y = adjust_logits(x, a, seq, 2, {});
  EXPECT_EQ(y, (std::vector<float>{2.0f, -1.0f * 1.5f, 0.5f, 3.0f / 1.5f, -2.0f}));
  a = {};
  a.frequency_penalty = 0.5f;
  a.presence_penalty = 0.25f;
  y = adjust_logits(x, a, std::vector<int32_t>{0, 1, 1, 1, 3}, 3, {});
  EXPECT_EQ(y, (std::vector<float>{2.0f, -1.0f - (0.5f * 2 + 0.25f), 0.5f, 3.0f - (0.5f + 0.25f),
                                   -2.0f}));
  a = {};
  a.min_new_tokens = 2;
  a.logit_bias = {{2, 1.0f}, {2, 0.5f}};
  y = adjust_logits(x, a, seq, 1, std::vector<int32_t>{4});
  EXPECT_EQ(y[4], -INFINITY);
  EXPECT_EQ(y[2], 0.5f + 1.0f + 0.5f);
  y = adjust_logits(x, a, seq, 2, std::vector<int32_t>{4});
  EXPECT_EQ(y[4], -2.0f);
}

TEST(ServerApi, BatchedPromptsAnswerInPromptMajorOrderAndEqualSingleRequests) {
  Served s;
  auto c = s.client();
  const std::vector<std::vector<int>> prompts = {{1, 2, 3, 4}, {50, 60, 70}};
  int status = 0;
  json batch =
      post(c, "/generate",
           {{"input_ids", prompts},
            {"sampling_params",
             {{"temperature", 1.0}, {"n", 2}, {"sampling_seed", 5}, {"max_new_tokens", 5}}},
            {"rid", {"a", "b"}},
            {"return_logprob", true}},
           &status);
  ASSERT_EQ(status, 200) << batch.dump();
  ASSERT_EQ(batch.size(), 4u);
  for (int p = 0; p < 2; ++p) {
    json one =
        post(c, "/generate",
             sample(prompts[p],
                    {{"temperature", 1.0}, {"n", 2}, {"sampling_seed", 5}, {"max_new_tokens", 5}}));
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(batch[p * 2 + j]["output_ids"], one[j]["output_ids"]) << p << " " << j;
      EXPECT_EQ(batch[p * 2 + j]["meta_info"]["id"], p == 0 ? "a" : "b");
    }
  }
  json mismatched = post(c, "/generate", {{"input_ids", prompts}, {"rid", {"a"}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(mismatched.dump().find("rid"), std::string::npos);
  // One text prompt in a list is still a list.
  json listed = post(c, "/generate",
                     {{"input_ids", {{1, 2, 3}}}, {"sampling_params", {{"max_new_tokens", 2}}}});
  EXPECT_TRUE(listed.is_array());
}

// SGLang's release of "weights" (no CPU backup): the weights are freed, generation is refused
// until a weight update loads them, and the model then samples exactly what it sampled before.
TEST(ServerApi, ReleasedWeightsRefuseGenerationUntilAWeightUpdateBringsTheSameBits) {
  Served s;
  auto c = s.client();
  int status = 0;
  const json body = sample(kPrompt, {{"temperature", 1.0}, {"sampling_seed", 5}});
  const json before = post(c, "/generate", body, &status);
  ASSERT_EQ(status, 200) << before.dump();
  json r = post(c, "/release_memory_occupation", {{"tags", {"weights", "kv_cache"}}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["message"], "weights and kv_cache released");
  EXPECT_TRUE(get(c, "/get_server_info").contains("weight_version"));
  r = post(c, "/resume_memory_occupation", {{"tags", {"kv_cache"}}}, &status);
  ASSERT_EQ(status, 200);
  EXPECT_NE(r["message"].get<std::string>().find("weights stay released"), std::string::npos)
      << r.dump();
  json refused = post(c, "/generate", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(refused.dump().find("weights are released"), std::string::npos) << refused.dump();
  auto health = c.Get("/health_generate");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  r = post(c, "/update_weights_from_disk", {{"model_path", test::data_dir() + "/models/qwen3_moe"}},
           &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json after = post(c, "/generate", body, &status);
  ASSERT_EQ(status, 200) << after.dump();
  EXPECT_EQ(after["output_ids"], before["output_ids"]);
  EXPECT_EQ(after["meta_info"]["output_token_logprobs"],
            before["meta_info"]["output_token_logprobs"]);
}

TEST(ServerApi, RefusedFieldsAreNamedAndOffValuesAccepted) {
  Served s;
  auto c = s.client();
  int status = 0;
  for (const auto& [body, needle] : std::vector<std::pair<json, std::string>>{
           {{{"input_ids", {1}}, {"lora_path", "adapter"}}, "lora_path"},
           {{{"input_ids", {1}}, {"return_hidden_states", true}}, "return_hidden_states"},
           {{{"input_ids", {1}}, {"sampling_params", {{"json_schema", "{}"}}}}, "json_schema"},
           {{{"input_ids", {1}}, {"sampling_params", {{"regex", "a+"}}}}, "regex"},
           {{{"input_ids", {1}}, {"sampling_params", {{"custom_params", {{"k", 1}}}}}},
            "custom_params"}}) {
    json e = post(c, "/generate", body, &status);
    EXPECT_EQ(status, 400) << body.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos) << e.dump();
  }
  // slime's stock payload: the decode options and "off" values of unsupported fields pass.
  json slime = post(c, "/generate",
                    {{"input_ids", {1, 2, 3}},
                     {"sampling_params",
                      {{"temperature", 1.0},
                       {"top_p", 1.0},
                       {"top_k", -1},
                       {"max_new_tokens", 4},
                       {"stop", nullptr},
                       {"stop_token_ids", nullptr},
                       {"skip_special_tokens", false},
                       {"spaces_between_special_tokens", false},
                       {"no_stop_trim", true},
                       {"custom_params", nullptr}}},
                     {"return_logprob", true},
                     {"lora_path", nullptr},
                     {"return_routed_experts", false}},
                    &status);
  EXPECT_EQ(status, 200) << slime.dump();
  // A number beyond a double and bytes that are not UTF-8: 400 with a JSON body, never a 500.
  for (const std::string& raw :
       {std::string(R"({"input_ids": [1], "sampling_params": {"temperature": 1e999}})"),
        std::string("{\"input_ids\": [1], \"te\xffxt\": 1}"),
        std::string(R"({"input_ids": [1], "sampling_params": {"temperature": 1e300}})")}) {
    auto r = c.Post("/generate", raw, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << raw;
    EXPECT_FALSE(json::parse(r->body, nullptr, false).is_discarded()) << r->body;
  }
  // A value nested a million levels deep parsed, then overflowed the stack of the thread that
  // quoted it in its error message: the server died. Refused before it is parsed.
  for (const char* route : {"/generate", "/v1/completions", "/v1/chat/completions"}) {
    const std::string deep =
        R"({"input_ids": )" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
    auto r = c.Post(route, deep, "application/json");
    ASSERT_TRUE(r) << route << ": no reply (the server died?)";
    EXPECT_EQ(r->status, 400) << route;
    EXPECT_NE(r->body.find("nest more than 512 levels deep"), std::string::npos) << r->body;
  }
  // response_format: {"type": "text"} or a 400 that says what is wrong (a string, a list or a
  // non-string type threw out of nlohmann's value(): a 500).
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  for (const auto& [format, needle] : std::vector<std::pair<json, std::string>>{
           {"json_object", "response_format must be an object with a string \"type\""},
           {json::array({1}), "response_format must be an object"},
           {{{"type", 5}}, "response_format must be an object"},
           {{{"type", "json_object"}}, "response_format other than text is not supported"},
           {{{"type", "text"}, {"strict", true}}, "response_format: unknown field 'strict'"}}) {
    json e =
        post(c, "/v1/chat/completions",
             {{"messages", messages}, {"max_tokens", 1}, {"response_format", format}}, &status);
    EXPECT_EQ(status, 400) << format.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos) << e.dump();
  }
  json text =
      post(c, "/v1/chat/completions",
           {{"messages", messages}, {"max_tokens", 1}, {"response_format", {{"type", "text"}}}},
           &status);
  EXPECT_EQ(text.dump().find("response_format"), std::string::npos) << text.dump();
  auto missing = c.Get("/no_such_route");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("no route"), std::string::npos) << missing->body;
}

TEST(ServerApi, AbortAllHealthLoadVersionAndMemoryRoutes) {
  Served s;
  auto c = s.client();
  int status = 0;
  // A request held by an in-place pause, then abort_all: it ends with finish_reason abort.
  post(c, "/pause_generation", {{"mode", "in_place"}}, &status);
  ASSERT_EQ(status, 200);
  json body =
      sample(kPrompt, {{"temperature", 1.0}, {"max_new_tokens", 200}, {"ignore_eos", true}});
  std::thread aborter([&] {
    auto c2 = s.client();
    for (int i = 0; i < 100 && get(c2, "/v1/loads")["loads"][0]["num_waiting_reqs"] == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    post(c2, "/abort_request", {{"abort_all", true}});
  });
  json aborted = post(c, "/generate", body, &status);
  aborter.join();
  post(c, "/continue_generation", json::object());
  ASSERT_EQ(status, 200);
  EXPECT_EQ(aborted["meta_info"]["finish_reason"]["type"], "abort");
  post(c, "/abort_request", {{"rid", "never-existed"}}, &status);
  EXPECT_EQ(status, 200);  // as SGLang: it may have finished already

  auto health = c.Get("/health_generate");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  json load = get(c, "/get_load", &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(load.is_array());
  EXPECT_EQ(load[0]["num_reqs"], 0);
  json loads = get(c, "/v1/loads", &status);
  EXPECT_EQ(loads["loads"][0]["max_total_num_tokens"], 256 * 8);
  json info = get(c, "/get_server_info", &status);
  EXPECT_EQ(info["page_size"], 8);
  EXPECT_TRUE(info.contains("internal_states"));

  // String versions, as SGLang types them; tokens keep integers.
  json v = post(c, "/update_weight_version", {{"new_version", "policy-step-3"}}, &status);
  ASSERT_EQ(status, 200) << v.dump();
  json r = post(c, "/generate", sample(kPrompt, {{"max_new_tokens", 2}}));
  EXPECT_EQ(r["meta_info"]["weight_version"], "policy-step-3");
  EXPECT_EQ(get(c, "/get_weight_version")["weight_version"], "policy-step-3");
  post(c, "/update_weight_version", {{"new_version", "12"}}, &status);
  r = post(c, "/generate", sample(kPrompt, {{"max_new_tokens", 2}}));
  EXPECT_EQ(r["meta_info"]["weight_version"], "12");
  EXPECT_EQ(r["meta_info"]["output_token_weight_versions"][0], 12);

  // The KV cache's memory: released (generation refused), then resumed.
  post(c, "/release_memory_occupation", {{"tags", {"kv_cache"}}}, &status);
  EXPECT_EQ(status, 200);
  json refused = post(c, "/generate", sample(kPrompt, {}), &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(refused.dump().find("resume_memory_occupation"), std::string::npos);
  post(c, "/resume_memory_occupation", json::object(), &status);
  EXPECT_EQ(status, 200);
  post(c, "/generate", sample(kPrompt, {}), &status);
  EXPECT_EQ(status, 200);
  json dist = post(c, "/init_weights_update_group", {{"master_address", "127.0.0.1"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(dist.dump().find("join_weight_group"), std::string::npos);
}

TEST(ToolCalls, QwenAndHermesBlocksBecomeOpenAiToolCalls) {
  // Qwen2.5 / Qwen3 spelling (newlines inside the tags), text around it, two calls.
  ParsedToolCalls p = parse_tool_calls(
      "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "add");
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"a", 2}, {"b", 3}}));
  EXPECT_EQ(p.calls[1].name, "now");
  EXPECT_EQ(p.content, "Let me add.");
  const json j = tool_calls_json(p.calls, "x");
  EXPECT_EQ(j[1]["type"], "function");
  EXPECT_EQ(j[1]["index"], 1);
  EXPECT_EQ(j[0]["function"]["name"], "add");
  EXPECT_TRUE(j[0]["function"]["arguments"].is_string());
  // An unclosed last block (stopped on the stop token), "parameters" as the arguments' name.
  p = parse_tool_calls("<tool_call>{\"name\": \"f\", \"parameters\": {\"x\": 1}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"x", 1}}));
  EXPECT_EQ(p.content, "");
  // Not JSON, or no name: the text stays content, no call.
  p = parse_tool_calls("<tool_call>not json</tool_call>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>not json</tool_call>");
  p = parse_tool_calls("<tool_call>{\"arguments\": {}}</tool_call> hi");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(tool_call_free_prefix("Hi <tool_call>{"), 3u);
  EXPECT_EQ(tool_call_free_prefix("Hi <tool_c"), 3u);
  EXPECT_EQ(tool_call_free_prefix("Hi <b>"), 6u);
  EXPECT_EQ(tool_call_free_prefix("a<"), 1u);
  p = parse_tool_calls("plain answer");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "plain answer");
}

}  // namespace
}  // namespace miles::rollout
