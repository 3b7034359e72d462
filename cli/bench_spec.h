// `miles bench rollout --spec` (bench_spec.cc): speculative decoding off and on, side by side, on
// GRPO workloads of real prompts; the samples must be the same bits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/model_files.h"
#include "miles/model.h"
#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"
#include "miles/tokenizer.h"

namespace miles::cli {

struct SpecBenchOptions {
  std::string model, json;
  std::string arithmetic_data = "configs/data/arithmetic.jsonl";
  std::vector<int> concurrency{1, 8, 32};
  int64_t prompts = 8;  // per task and epoch
  int64_t max_draft_tokens = 4;
  float temperature = 1.0f;  // RL's; 0: greedy (an evaluation's)
};

int run_spec_bench(const SpecBenchOptions& o, std::shared_ptr<const Model> model,
                   std::shared_ptr<const Tokenizer> tok, ThreadPool& pool);

}  // namespace miles::cli
