// What the weight-lifecycle tests share: the test llama model on an engine with its lifecycle
// (EngineWeights), one optimizer step on a fixed sample, and a trainer's checksums as the engine
// reports them.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "miles/model.h"
#include "miles/rollout/engine.h"
#include "miles/rollout/engine_driver.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"
#include "miles/weight_sync/engine_weights.h"
#include "miles/weight_sync/weight_sync.h"
#include "test_paths.h"

namespace miles::test {

struct LlamaEngine {
  std::string model_dir = data_dir() + "/models/llama";
  Result<ModelFiles> files = load_model_files(model_dir);
  ThreadPool pool{1};
  std::unique_ptr<rollout::EngineDriver> driver;
  std::shared_ptr<EngineWeights> weights;
  WeightSyncTrust trust;  // set before start()

  Status start_engine() {
    MILES_RETURN_IF_ERROR(files.status());
    MILES_ASSIGN_OR_RETURN(auto model, Model::from_weights(files->config, files->weights));
    driver = std::make_unique<rollout::EngineDriver>(std::make_unique<Engine>(
        make_model_runner(std::shared_ptr<const Model>(std::move(model)), &pool),
        EngineOptions{.num_blocks = 64, .block_tokens = 8}));
    weights =
        std::make_shared<EngineWeights>(*driver, files->config, model_dir, &pool, nullptr, trust);
    return Status::Ok();
  }
};

// One optimizer step on a fixed sample.
inline void train_once(Trainer& t) {
  TrainSample x;
  x.tokens = {1, 17, 300, 42, 7, 99};
  x.response_length = 5;
  x.loss_mask.assign(5, 1.0f);
  std::vector<TrainSample> batch{x};
  ASSERT_TRUE(t.step(batch, sft_objective(batch, 5)).ok());
}

// The xxh3-128 of each of the trainer's tensors (float32), by name.
inline std::map<std::string, std::string> trainer_checksums(const Trainer& t,
                                                            const ParamLayout& layout) {
  std::map<std::string, std::string> sums;
  for (const ParamSpec& s : layout.specs()) {
    std::span<const float> v = t.params().get(s.name);
    sums[s.name] = xxh3_128_hex(v.data(), v.size_bytes());
  }
  return sums;
}

}  // namespace miles::test
