// Shared by the trainer-checkpoint tests: tiny models as trainers, a deterministic SFT run,
// per-tensor hashes of parameters and moments, logits on a fixed prompt, a per-test temp dir.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/trainer/train_checkpoint.h"
#include "test_paths.h"

namespace miles::test {

namespace fs = std::filesystem;

struct Source {
  ModelConfig config;
  TensorMap weights;
};

inline Source load_source(const std::string& name) {
  Source s;
  if (name == "stories260K") {
    auto m = read_llama2c(test::shared_dir() + "/models/stories260K/stories260K.bin");
    EXPECT_TRUE(m.ok()) << m.message();
    s.config = m->config;
    s.weights = std::move(m->weights);
    return s;
  }
  const std::string dir = test::data_dir() + "/models/" + name;
  auto c = load_model_config(dir + "/config.json");
  EXPECT_TRUE(c.ok()) << c.message();
  auto w = read_hf_weights(dir);
  EXPECT_TRUE(w.ok()) << w.message();
  s.config = *c;
  s.weights = std::move(*w);
  return s;
}

inline TrainerConfig train_config() {
  TrainerConfig tc;
  tc.optimizer.weight_decay = 0.1;
  tc.lr.lr = 1e-3;
  tc.lr.min_lr = 1e-4;
  tc.lr.warmup_steps = 2;
  tc.lr.total_steps = 6;
  tc.lr.decay = LrSchedule::Decay::kCosine;
  tc.micro_batch_size = 2;
  return tc;
}

inline std::unique_ptr<Trainer> make_trainer(const Source& s) {
  auto t = Trainer::create(s.config, s.weights, train_config(), nullptr);
  EXPECT_TRUE(t.ok()) << t.message();
  return std::move(*t);
}

// Step k's batch: 4 samples of 12 pseudo-random tokens, the last 6 scored.
inline std::vector<TrainSample> batch_for(int k, int64_t vocab) {
  std::vector<TrainSample> b(4);
  uint64_t x = 0x9e3779b97f4a7c15ull * (k + 1);
  for (TrainSample& s : b) {
    for (int i = 0; i < 12; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      s.tokens.push_back(static_cast<int32_t>(3 + (x >> 33) % (vocab - 3)));
    }
    s.response_length = 6;
    s.loss_mask.assign(6, 1.0f);
  }
  return b;
}

inline void train(Trainer& t, int from, int to) {
  for (int k = from; k < to; ++k) {
    const std::vector<TrainSample> b = batch_for(k, t.model_config().vocab_size);
    auto r = t.step(b, sft_objective(b, 24));
    ASSERT_TRUE(r.ok()) << r.message();
  }
}

// Per-tensor hashes of the parameters and both moments.
inline std::vector<std::string> hashes(Trainer& t) {
  std::vector<std::string> h;
  for (const ParamSpec& s : t.params().layout().specs()) {
    h.push_back(s.name + " " + tensor_sha256(t.params().get(s.name)));
    h.push_back("m " + tensor_sha256(std::as_const(t.optimizer()).exp_avg().get(s.name)));
    h.push_back("v " + tensor_sha256(std::as_const(t.optimizer()).exp_avg_sq().get(s.name)));
  }
  return h;
}

inline std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& tokens) {
  auto kv = m.make_kv_cache();
  const SeqSpan seq{0, 0, static_cast<int64_t>(tokens.size())};
  auto out = m.forward(tokens, std::span<const SeqSpan>(&seq, 1), *kv, ForwardOptions{}, nullptr);
  EXPECT_TRUE(out.ok()) << out.message();
  return out.ok() ? out->logits : std::vector<float>{};
}

inline const std::vector<int32_t> kPrompt = {1, 5, 9, 17, 33, 65, 129, 200, 7, 3, 11, 250};

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = (fs::temp_directory_path() / ("miles_ckpt_" + std::to_string(::getpid()) + "_" + name))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace miles::test
