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
  std::vector<std::string> tasks{"arithmetic", "story"};  // which of the two workloads run
  int64_t prompts = 8;  // per task and epoch
  int64_t max_draft_tokens = 4;
  float temperature = 1.0f;  // RL's; 0: greedy (an evaluation's)
  // The co-trained draft head's column: fitted to the policy on `head_epochs` plain epochs of the
  // task's prompts (groups of 8, their own seeds), `head_passes` passes over them of one AdamW
  // step per `head_batch` samples.
  bool head = true;
  // false: every proposal verified (SpeculativeOptions::adaptive off), whatever the timings say.
  bool adaptive = true;
  int64_t head_epochs = 2;
  int64_t head_passes = 20;
  int64_t head_batch = 16;
  double head_lr = 1e-3;
  int64_t head_vocab = 4096;
  // The policy layers whose outputs the head reads (DraftHead::feature_layers_for; empty: the
  // last).
  std::vector<int64_t> head_layers;
  // Training passes per sample (DraftHead::accumulate_grad: > 1, EAGLE-3's training-time test).
  int64_t head_ttt_length = 1;
};

int run_spec_bench(const SpecBenchOptions& o, std::shared_ptr<const Model> model,
                   std::shared_ptr<const Tokenizer> tok, ThreadPool& pool);

}  // namespace miles::cli
