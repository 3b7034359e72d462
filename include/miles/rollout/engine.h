// Engine: the rollout engine's core — continuous batching over a paged, prefix-shared KV cache,
// with exact logprobs, routed experts and weight versions for every generated token.
//
// Why: rollout dominates an RL step; every number it returns must be what the trainer recomputes.
// The engine runs the shared Model (or any ModelRunner) one iteration at a time: running decodes
// plus prefill chunks under a token budget, packed into one batch-invariant forward. The HTTP and
// gRPC servers (include/miles/rollout/http_server.h, include/miles/rollout/grpc_server.h) sit on
// top, talking to it only through include/miles/rollout/engine_driver.h; tests drive step()
// directly as timelines.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "miles/device_model.h"
#include "miles/model.h"
#include "miles/rollout/drafter.h"
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
  // The same runner without weights (SGLang's release of "weights"): its forward is an error and
  // with_weights() builds the full runner again. Backends that cannot say so refuse (the default).
  virtual Result<std::unique_ptr<ModelRunner>> without_weights() const;
};
// A runner over a loaded model and a thread pool (both outlive it).
std::unique_ptr<ModelRunner> make_model_runner(std::shared_ptr<const Model> model,
                                               ThreadPool* pool);

// Speculative decoding (docs/speculative.md): a running sample may feed, after its newest token,
// up to max_draft_tokens drafted ones; one forward verifies them and the sample keeps the longest
// prefix equal to what it would have drawn itself, then its own next token. Outputs are the same
// bits as without speculation: only speed changes.
struct SpeculativeOptions {
  bool enabled = false;
  int64_t max_draft_tokens = 4;
  // true: draft only where the engine's measured cost of an iteration (per token count) and the
  // sample's acceptance history say it pays; false: every proposal is verified.
  bool adaptive = true;
  SuffixDrafterOptions suffix{};  // the default drafter (Engine::set_drafter replaces it)
};

struct EngineOptions {
  int64_t num_blocks = 4096;      // KV blocks in the pool
  int64_t block_tokens = 16;      // positions per block
  int64_t max_batch_tokens = 2048;  // token budget of one iteration (decodes + prefill chunks)
  int64_t max_running = 256;      // samples decoding at once (+ max_running / 8 for new requests)
  bool enable_prefix_cache = true;
  // Seeds the generator of fresh sampling seeds (requests that give none, GenerateRequest::
  // draw_seed); unset: a random start-up value, so a restarted server does not repeat its samples.
  std::optional<uint64_t> random_seed;
  SpeculativeOptions speculative{};
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

// Changes to a sample's logits before temperature and filters, in SGLang's order (docs/api.md,
// "Sampling"): frequency and presence penalties, the min-new-tokens mask, the repetition penalty,
// then logit_bias; the penalties count output tokens only. They shape the distribution a token is
// drawn from (the sampling logprob) but never the raw model logprob.
struct LogitAdjustments {
  float repetition_penalty = 1.0f;  // (0, 2]: each token of the output: x < 0 ? x * r : x / r
  float frequency_penalty = 0.0f;   // [-2, 2]: minus this times the token's count in the output
  float presence_penalty = 0.0f;    // [-2, 2]: minus this once for each token in the output
  int64_t min_new_tokens = 0;       // EOS and stop_token_ids masked (-inf) until this many outputs
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logit of each id
  bool any() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f ||
           min_new_tokens > 0 || !logit_bias.empty();
  }
};

struct GenerateRequest {
  std::vector<int32_t> input_ids;
  SamplingParams sampling;
  // A request that gave no seed: the engine replaces sampling.seed with a fresh one from its
  // generator (EngineOptions::random_seed), so two such requests draw different samples; the seed
  // used is reported (SampleEvent::seed) and replays the sample bit for bit.
  bool draw_seed = false;
  LogitAdjustments adjust;
  int64_t max_new_tokens = 128;
  std::vector<int32_t> stop_token_ids;    // besides the tokenizer's EOS (unless ignore_eos)
  std::vector<std::string> stop_strings;  // needs the engine's tokenizer
  bool ignore_eos = false;
  int32_t n = 1;  // samples of this prompt (a GRPO group): the prompt is prefilled once
  // Logprobs beyond the sampled token's (docs/api.md, "Logprobs"): the `top_logprobs` most likely
  // tokens at every output position (and input position, below), under the tempered, unfiltered
  // distribution; and the prompt's own tokens from position `logprob_start_len` on (-1: none; the
  // prompt's length: none either), under the raw model (SGLang: no temperature on input tokens).
  int32_t top_logprobs = 0;
  int64_t logprob_start_len = -1;
  // The logprobs of these tokens at every output (and input) position, in this order, under the
  // same distributions as `top_logprobs` (SGLang's token_ids_logprob).
  std::vector<int32_t> token_ids_logprob;
};

enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason r);

// One of the most likely tokens at a position, under the tempered distribution.
struct TopLogprob {
  int32_t id = -1;
  float logprob = 0;
};

struct TokenOutput {
  int32_t id = -1;
  float logprob = 0;      // under the distribution it was sampled from (what the trainer recomputes)
  float raw_logprob = 0;  // under the untempered, untruncated model
  int64_t weight_version = 0;
  // log_softmax(adjusted logits / temperature)[id] before top-k / top-p / min-p; temperature 1 for
  // greedy requests: SGLang's output_token_logprobs, and OpenAI's logprobs.
  float tempered_logprob = 0;
  std::vector<TopLogprob> top;  // GenerateRequest::top_logprobs of them, most likely first
  std::vector<TopLogprob> ids;  // GenerateRequest::token_ids_logprob's tokens, in its order
};

// A prompt token's logprob given the tokens before it under the raw model (the first entry, at
// logprob_start_len, has none: NaN, as in SGLang), and the most likely tokens at its position.
struct InputLogprob {
  int32_t id = -1;
  float logprob = 0;
  std::vector<TopLogprob> top;
  std::vector<TopLogprob> ids;  // GenerateRequest::token_ids_logprob's tokens, in its order
};

// One sample's state as reported to its listener: new tokens since the last event, and when
// finished, the whole record (routed experts: [prompt + output - 1, moe layers, top_k]).
struct SampleEvent {
  uint64_t request_id = 0;
  int32_t sample_index = 0;
  std::vector<TokenOutput> new_tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;  // the stop string or token id that ended it
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt positions served from the prefix cache
  uint64_t seed = 0;          // this sample's own seed: a request with it and n = 1 replays it
  std::vector<TokenOutput> output;     // when finished: every output token
  std::vector<int32_t> routed_experts; // when finished, for MoE models
  // When finished and GenerateRequest::logprob_start_len >= 0: prompt positions from there on.
  std::vector<InputLogprob> input_logprobs;
};
using SampleListener = std::function<void(const SampleEvent&)>;

enum class PauseMode { kRetract, kInPlace, kAbort };

struct EngineStats {
  int64_t free_blocks = 0, total_blocks = 0, cached_blocks = 0;
  int64_t waiting = 0, running = 0;
  int64_t weight_version = 0;
  bool paused = false;
  bool updating_weights = false;
  bool kv_released = false;
  bool weights_released = false;
  uint64_t iterations = 0, generated_tokens = 0, prompt_tokens = 0, cached_prompt_tokens = 0;
  uint64_t retractions = 0;  // samples whose KV was dropped to be recomputed (memory or pause)
  // Speculative decoding: sample-steps that verified a draft, the draft tokens verified, those
  // accepted, and the tokens those steps emitted (accepted + the sample's own next token).
  uint64_t spec_verifies = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0,
           spec_emitted_tokens = 0;
};

// What one iteration ran (scheduler timelines in tests).
struct IterationRecord {
  struct Item {
    uint64_t request_id;
    int32_t sample_index;
    int64_t start_pos;
    int64_t n_tokens;
    bool prefill;
    int64_t draft_tokens = 0;  // of n_tokens, drafted ones being verified
  };
  std::vector<Item> items;
};

class Engine {
 public:
  // The tokenizer (optional) gives EOS and stop strings.
  Engine(std::unique_ptr<ModelRunner> runner, EngineOptions options,
         std::shared_ptr<const Tokenizer> tokenizer = nullptr);
  ~Engine();

  // Validates and queues a request; errors name the bad field. The listener is called from the
  // thread that runs step().
  Result<uint64_t> submit(GenerateRequest request, SampleListener listener);
  // Finishes a request (all its samples) with kAbort and frees its blocks. False if unknown.
  bool abort(uint64_t request_id);
  // Aborts every request; returns how many there were.
  int64_t abort_all();

  // One scheduler iteration; false when there was nothing to run.
  bool step();
  bool idle() const;
  const IterationRecord& last_iteration() const;

  // Weight lifecycle.
  void pause(PauseMode mode);
  void resume();
  Status flush_cache();  // refused while requests hold blocks
  void update_weight_version(int64_t version);
  // Brackets a weight update: refused unless paused or idle; until end_weight_update() the engine
  // runs no iteration (resume() waits for the end), so no token can mix old and new weights.
  Status begin_weight_update();
  Status end_weight_update();
  // Swaps the runner's weights; only inside begin/end, or while paused or idle.
  Status update_weights(std::unique_ptr<ModelRunner> runner);
  // The same with the current runner's kind over new full weights (ModelRunner::with_weights):
  // what every weight-update path calls, so a tensor-parallel engine reshards them.
  Status update_weights(const TensorMap& weights);
  // SGLang's release / resume_memory_occupation for the KV cache: frees the KV pool's memory (and
  // the prefix cache); refused while requests are in flight. Until resumed, submit() is refused.
  Status release_kv_memory();
  void resume_kv_memory();
  // SGLang's release of "weights" without a backup: the runner's weights are freed (refused while
  // requests are in flight, or by a backend that cannot); submit() is refused until a weight update
  // (update_weights) brings weights back.
  Status release_weights();
  EngineStats stats() const;
  const ModelConfig& config() const;
  // Replaces the drafter of speculative decoding (EngineOptions::speculative must be enabled).
  void set_drafter(std::unique_ptr<Drafter> drafter);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace miles
