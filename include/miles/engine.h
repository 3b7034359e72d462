// Engine: the rollout engine's core — continuous batching over a paged, prefix-shared KV cache, with
// exact logprobs, routed experts and weight versions for every generated token.
//
// Why: rollout dominates an RL step; every number it returns must be what the trainer recomputes. The
// engine runs the shared Model (or any ModelRunner) one iteration at a time: running decodes plus prefill
// chunks under a token budget, packed into one batch-invariant forward. HTTP and gRPC servers sit on top
// (rollout/server_*); tests drive step() directly as timelines.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "miles/device_model.h"
#include "miles/model.h"
#include "miles/sampler.h"
#include "miles/status.h"
#include "miles/tokenizer.h"

namespace miles {

class ThreadPool;

// What the engine runs: the shared Model, or a fake one in scheduler tests.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Result<ForwardOutput> forward(std::span<const int32_t> tokens,
                                        std::span<const SeqSpan> seqs, KvStore& kv,
                                        const ForwardOptions& options) = 0;
  // Threads the engine may use for per-sample work between forwards (sampling); null: none.
  virtual ThreadPool* thread_pool() const { return nullptr; }
  // Floats per position and layer of the KV this runner's forward writes into the engine's blocks
  // (a tensor-parallel rank holds only its KV heads).
  virtual int64_t kv_dim() const { return config().kv_dim(); }
  // The engine copied the first `positions` of KV block `src` into `dst` (a GRPO sibling's partial
  // prompt block); runners that keep KV elsewhere too (tensor-parallel followers) repeat it before
  // their next forward.
  virtual void copied_kv_prefix(int32_t src, int32_t dst, int64_t positions) {}
  // A runner of the same kind (same threads, same process group) over new full weights (HF names,
  // this config's shapes); errors name the missing or mis-shaped tensor. Used by weight updates.
  virtual Result<std::unique_ptr<ModelRunner>> with_weights(const TensorMap& weights) const;
};
// A runner over a loaded model and a thread pool (both outlive it).
std::unique_ptr<ModelRunner> make_model_runner(std::shared_ptr<const Model> model, ThreadPool* pool);

struct EngineOptions {
  int64_t num_blocks = 4096;      // KV blocks in the pool
  int64_t block_tokens = 16;      // positions per block
  int64_t max_batch_tokens = 2048;  // token budget of one iteration (decodes + prefill chunks)
  int64_t max_running = 256;      // requests decoding at once
  bool enable_prefix_cache = true;
};

// A runner whose forwards run on `device` (cuda or emulated, device_model.h), with every KV block
// in device memory under the engine's block ids: the engine's pool then keeps only block tables
// and reference counts (kv_dim() is 0). kv_geometry: the engine's num_blocks and block_tokens.
// pool: host threads for sampling (and for the emulated kernels).
Result<std::unique_ptr<ModelRunner>> make_device_model_runner(Device device,
                                                              const ModelConfig& config,
                                                              const TensorMap& weights,
                                                              const EngineOptions& kv_geometry,
                                                              ThreadPool* pool);

struct GenerateRequest {
  std::vector<int32_t> input_ids;
  SamplingParams sampling;
  int64_t max_new_tokens = 128;
  std::vector<int32_t> stop_token_ids;    // besides the tokenizer's EOS (unless ignore_eos)
  std::vector<std::string> stop_strings;  // needs the engine's tokenizer
  bool ignore_eos = false;
  int32_t n = 1;  // samples of this prompt (a GRPO group): the prompt is prefilled once
};

enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason r);

struct TokenOutput {
  int32_t id = -1;
  float logprob = 0;      // under the distribution it was sampled from
  float raw_logprob = 0;  // under the untempered, untruncated model
  int64_t weight_version = 0;
};

// One sample's state as reported to its listener: new tokens since the last event, and when finished,
// the whole record (routed experts: [prompt + output - 1, moe layers, top_k]).
struct SampleEvent {
  uint64_t request_id = 0;
  int32_t sample_index = 0;
  std::vector<TokenOutput> new_tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;  // the stop string or token id that ended it
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt positions served from the prefix cache
  std::vector<TokenOutput> output;     // when finished: every output token
  std::vector<int32_t> routed_experts; // when finished, for MoE models
};
using SampleListener = std::function<void(const SampleEvent&)>;

enum class PauseMode { kRetract, kInPlace, kAbort };

struct EngineStats {
  int64_t free_blocks = 0, total_blocks = 0, cached_blocks = 0;
  int64_t waiting = 0, running = 0;
  int64_t weight_version = 0;
  bool paused = false;
  bool updating_weights = false;
  uint64_t iterations = 0, generated_tokens = 0, prompt_tokens = 0, cached_prompt_tokens = 0;
  uint64_t retractions = 0;  // samples whose KV was dropped to be recomputed (memory or pause)
};

// What one iteration ran (scheduler timelines in tests).
struct IterationRecord {
  struct Item {
    uint64_t request_id;
    int32_t sample_index;
    int64_t start_pos;
    int64_t n_tokens;
    bool prefill;
  };
  std::vector<Item> items;
};

class Engine {
 public:
  // The tokenizer (optional) gives EOS and stop strings.
  Engine(std::unique_ptr<ModelRunner> runner, EngineOptions options,
         std::shared_ptr<const Tokenizer> tokenizer = nullptr);
  ~Engine();

  // Validates and queues a request; errors name the bad field. The listener is called from the thread
  // that runs step().
  Result<uint64_t> submit(GenerateRequest request, SampleListener listener);
  // Finishes a request (all its samples) with kAbort and frees its blocks. False if unknown.
  bool abort(uint64_t request_id);

  // One scheduler iteration; false when there was nothing to run.
  bool step();
  bool idle() const;
  const IterationRecord& last_iteration() const;

  // Weight lifecycle.
  void pause(PauseMode mode);
  void resume();
  Status flush_cache();  // refused while requests hold blocks
  void update_weight_version(int64_t version);
  // Brackets a weight update: refused unless paused or idle; until end_weight_update() the engine runs
  // no iteration (resume() waits for the end), so no token can mix old and new weights.
  Status begin_weight_update();
  Status end_weight_update();
  // Swaps the runner's weights; only inside begin/end, or while paused or idle.
  Status update_weights(std::unique_ptr<ModelRunner> runner);
  // The same with the current runner's kind over new full weights (ModelRunner::with_weights):
  // what every weight-update path calls, so a tensor-parallel engine reshards them.
  Status update_weights(const TensorMap& weights);
  EngineStats stats() const;
  const ModelConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace miles
