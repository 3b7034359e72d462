// Trainer checkpoints: a resumed run is bit-identical to an uninterrupted one, the directory is an
// HF model directory our loader (and transformers: tests/reference/check_hf_export.sh) reads back
// to the same logits, and damaged or foreign checkpoints are refused with the file and tensor.
#include "miles/trainer/train_checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "miles/draft_head.h"
#include "train_checkpoint_case.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using namespace miles::test;  // NOLINT(google-build-using-namespace)

class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, IsBitIdenticalToAnUninterruptedRun) {
  TempDir tmp;
  const Source src = load_source(GetParam());
  auto straight = make_trainer(src);
  train(*straight, 0, 4);
  const std::vector<std::string> want = hashes(*straight);

  auto first = make_trainer(src);
  train(*first, 0, 2);
  TrainState st;
  st.step = 2;
  st.data_position = 8;
  st.rng_seed = 0xfedcba9876543210ull;
  st.rng_counter = 12345;
  st.extra_json = R"({"controller": {"rollout_id": 2, "name": "x"}})";
  const std::string dir = tmp.path() + "/checkpoints/" + checkpoint_dir_name(2);
  ASSERT_TRUE(save_checkpoint(dir, *first, st).ok());
  EXPECT_EQ(fs::path(dir).filename(), "step_00000002");

  // Into a second trainer while the first still lives, then after destroying both.
  for (int round = 0; round < 2; ++round) {
    if (round == 1) first.reset();
    auto resumed = make_trainer(src);
    auto loaded = load_checkpoint(dir, *resumed);
    ASSERT_TRUE(loaded.ok()) << loaded.message();
    EXPECT_EQ(loaded->step, 2);
    EXPECT_EQ(loaded->data_position, 8);
    EXPECT_EQ(loaded->rng_seed, st.rng_seed);
    EXPECT_EQ(loaded->rng_counter, 12345u);
    EXPECT_EQ(loaded->extra_json, R"({"controller":{"name":"x","rollout_id":2}})");
    EXPECT_EQ(resumed->steps_done(), 2);
    train(*resumed, 2, 4);
    EXPECT_EQ(resumed->steps_done(), 4);
    EXPECT_EQ(hashes(*resumed), want) << "round " << round;
    EXPECT_EQ(logits_of(resumed->model(), kPrompt), logits_of(straight->model(), kPrompt));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Resume,
                         ::testing::Values("llama", "qwen3_moe", "llama_tied", "glm4_moe",
                                           "deepseek_v3"));

// The co-trained draft head rides in the checkpoint: a resumed trainer's head continues the
// straight one's bit for bit; a damaged draft file is refused by name, the trainer untouched; a
// trainer without a head loads the policy and ignores it.
std::unique_ptr<Trainer> make_draft_trainer(const Source& s) {
  TrainerConfig tc = train_config();
  tc.draft.enabled = true;
  tc.draft.lr = 3e-3;
  tc.draft.vocab_size = 64;
  auto t = Trainer::create(s.config, s.weights, tc, nullptr);
  EXPECT_TRUE(t.ok()) << t.message();
  return std::move(*t);
}

std::vector<std::string> draft_hashes(const Trainer& t) {
  auto d = t.draft_state();
  EXPECT_TRUE(d.ok()) << d.message();
  if (!d.ok()) return {};
  std::vector<std::string> h = {tensor_sha256(d->params.all()), tensor_sha256(d->exp_avg.all()),
                                tensor_sha256(d->exp_avg_sq.all()), std::to_string(d->steps)};
  for (int32_t id : t.draft()->vocab()) h.push_back(std::to_string(id));
  return h;
}

TEST(TrainCheckpoint, DraftHeadResumesExactlyAndIsVerified) {
  TempDir tmp;
  const Source src = load_source("llama");
  auto straight = make_draft_trainer(src);
  train(*straight, 0, 4);
  auto first = make_draft_trainer(src);
  train(*first, 0, 2);
  const std::string dir = tmp.path() + "/" + checkpoint_dir_name(2);
  ASSERT_TRUE(save_checkpoint(dir, *first, TrainState{}).ok());
  ASSERT_TRUE(fs::exists(dir + "/draft.safetensors"));

  auto resumed = make_draft_trainer(src);
  auto loaded = load_checkpoint(dir, *resumed);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(draft_hashes(*resumed), draft_hashes(*first));
  train(*resumed, 2, 4);
  EXPECT_EQ(draft_hashes(*resumed), draft_hashes(*straight));
  EXPECT_EQ(hashes(*resumed), hashes(*straight));

  auto plain = make_trainer(src);  // no head: the policy loads, the head's file is not read
  ASSERT_TRUE(load_checkpoint(dir, *plain).ok());
  EXPECT_EQ(plain->steps_done(), 2);

  std::fstream f(dir + "/draft.safetensors", std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(-3, std::ios::end);
  f.put('\x7f');
  f.close();
  auto fresh = make_draft_trainer(src);
  const std::vector<std::string> before = draft_hashes(*fresh);
  auto bad = load_checkpoint(dir, *fresh);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("draft.safetensors: fails its sha256 check"), std::string::npos)
      << bad.message();
  EXPECT_EQ(draft_hashes(*fresh), before);
  EXPECT_EQ(fresh->steps_done(), 0);
}

TEST(TrainCheckpoint, IsAnHfDirectoryOurLoaderReadsToTheSameLogits) {
  TempDir tmp;
  for (const std::string name : {"llama", "qwen3_moe", "glm4_moe", "deepseek_v3", "stories260K"}) {
    if (name == "stories260K" && !test::shared_available()) continue;
    const Source src = load_source(name);
    auto t = make_trainer(src);
    train(*t, 0, 2);
    const std::string dir = tmp.path() + "/" + name;
    ASSERT_TRUE(save_checkpoint(dir, *t, TrainState{}).ok());
    auto cfg = load_model_config(dir + "/config.json");
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    auto w = read_hf_weights(dir);
    ASSERT_TRUE(w.ok()) << w.message();
    auto m = Model::from_weights(*cfg, *w);
    ASSERT_TRUE(m.ok()) << m.message();
    const std::vector<float> a = logits_of(**m, kPrompt), b = logits_of(t->model(), kPrompt);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name;
  }
}

// Saves an exported checkpoint + our logits for tests/reference/check_hf_export.sh.
TEST(TrainCheckpoint, ExportForTransformers) {
  const char* out = std::getenv("MILES_EXPORT_DIR");
  if (!out) GTEST_SKIP() << "MILES_EXPORT_DIR not set (tests/reference/check_hf_export.sh sets it)";
  for (const std::string name : {"llama", "llama_tied", "qwen3", "qwen3_moe", "llama_rope_llama3",
                                 "llama_rope_yarn", "llama_bias", "qwen2", "mistral", "gemma3",
                                 "glm4_moe", "deepseek_v3", "deepseek_v3_noq", "stories260K"}) {
    if (name == "stories260K" && !test::shared_available()) continue;
    const Source src = load_source(name);
    auto t = make_trainer(src);
    train(*t, 0, 2);
    const std::string dir = std::string(out) + "/" + name;
    fs::remove_all(dir);
    ASSERT_TRUE(save_checkpoint(dir, *t, TrainState{}).ok());
    const std::vector<float> logits = logits_of(t->model(), kPrompt);
    const int64_t n = kPrompt.size();
    Tensor ids = Tensor::zeros(DType::kI32, {n});
    std::memcpy(ids.mutable_data<int32_t>(), kPrompt.data(), n * sizeof(int32_t));
    ASSERT_TRUE(
        write_safetensors(dir + "/miles_logits.safetensors",
                          {{"input_ids", ids},
                           {"logits", Tensor::from_f32({n, t->model_config().vocab_size}, logits)}})
            .ok());
  }
}

TEST(TrainCheckpoint, CopiesTokenizerFiles) {
  TempDir tmp;
  const Source src = load_source("llama");
  auto t = make_trainer(src);
  SaveOptions o;
  o.tokenizer_dir = test::data_dir() + "/models/llama";
  ASSERT_TRUE(save_checkpoint(tmp.path() + "/c", *t, TrainState{}, o).ok());
  EXPECT_TRUE(fs::exists(tmp.path() + "/c/generation_config.json"));
  o.tokenizer_dir = tmp.path() + "/none";
  EXPECT_NE(save_checkpoint(tmp.path() + "/d", *t, TrainState{}, o).message().find("tokenizer"),
            std::string::npos);
  // The save failed after writing the weights: nothing of it is left, not even its .tmp-* dir.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path())) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"c"});
}

}  // namespace
}  // namespace miles
