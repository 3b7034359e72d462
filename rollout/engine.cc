// Engine: request admission and validation, the weight lifecycle, and reporting. The iteration
// itself (batch formation, forward, sampling) is in engine_step.cc.
#include <algorithm>
#include <cmath>
#include <random>

#include "rollout/engine_impl.h"

namespace miles {

using rollout::Request;
using rollout::Sample;
using rollout::SampleState;

Engine::Engine(std::unique_ptr<ModelRunner> runner, EngineOptions options,
               std::shared_ptr<const Tokenizer> tokenizer)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.runner = std::move(runner);
  m.opt = options;
  m.tok = std::move(tokenizer);
  const ModelConfig& c = m.runner->config();
  m.experts_per_pos = c.num_moe_layers() * c.moe.top_k;
  m.pool =
      std::make_unique<rollout::BlockPool>(options.num_blocks, options.block_tokens, c.num_layers,
                                           m.runner->kv_dim(), m.experts_per_pos);
  m.kv = std::make_unique<rollout::PagedKvCache>(*m.pool);
  m.radix = std::make_unique<rollout::RadixCache>(*m.pool);
  const SpeculativeOptions& spec = options.speculative;
  MILES_CHECK(!spec.enabled || (spec.max_draft_tokens >= 1 && spec.max_draft_tokens <= 64),
              "speculative.max_draft_tokens is validated to [1, 64] by the engine's callers");
  if (spec.enabled) m.drafter = make_suffix_drafter(spec.suffix);
  m.seed_state = options.random_seed ? *options.random_seed
                                     : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                           std::random_device{}();
}

// splitmix64: a full-period sequence, so fresh seeds do not repeat within a server's lifetime.
uint64_t Engine::Impl::fresh_seed() {
  uint64_t z = (seed_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Engine::~Engine() = default;

const ModelConfig& Engine::config() const { return impl_->runner->config(); }

namespace {

constexpr int64_t kMaxTopLogprobs = 1024;

Status validate_adjustments(const GenerateRequest& r, int64_t vocab) {
  const LogitAdjustments& a = r.adjust;
  auto range = [](const char* name, float v, float lo, float hi, bool open_lo) -> Status {
    if (std::isfinite(v) && (open_lo ? v > lo : v >= lo) && v <= hi) return Status::Ok();
    return Status::Error(std::string(name) + " = " + std::to_string(v) + " must be in " +
                         (open_lo ? "(" : "[") + std::to_string(lo) + ", " + std::to_string(hi) +
                         "]");
  };
  MILES_RETURN_IF_ERROR(range("repetition_penalty", a.repetition_penalty, 0.0f, 2.0f, true));
  MILES_RETURN_IF_ERROR(range("frequency_penalty", a.frequency_penalty, -2.0f, 2.0f, false));
  MILES_RETURN_IF_ERROR(range("presence_penalty", a.presence_penalty, -2.0f, 2.0f, false));
  if (a.min_new_tokens < 0 || a.min_new_tokens > r.max_new_tokens)
    return Status::Error("min_new_tokens = " + std::to_string(a.min_new_tokens) +
                         " must be in [0, max_new_tokens = " + std::to_string(r.max_new_tokens) +
                         "]");
  for (const auto& [id, bias] : a.logit_bias) {
    if (id < 0 || id >= vocab)
      return Status::Error("logit_bias: token id " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    if (!std::isfinite(bias) || std::fabs(bias) > 1e6f)
      return Status::Error("logit_bias[" + std::to_string(id) + "] = " + std::to_string(bias) +
                           " must be a finite number in [-1e6, 1e6]");
  }
  return Status::Ok();
}

}  // namespace

Status Engine::Impl::validate(const GenerateRequest& r) const {
  const ModelConfig& c = runner->config();
  if (r.input_ids.empty()) return Status::Error("input_ids: the prompt is empty");
  for (size_t i = 0; i < r.input_ids.size(); ++i)
    if (r.input_ids[i] < 0 || r.input_ids[i] >= c.vocab_size)
      return Status::Error("input_ids[" + std::to_string(i) +
                           "] = " + std::to_string(r.input_ids[i]) +
                           " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  const int64_t len = r.input_ids.size();
  if (len >= c.max_position_embeddings)
    return Status::Error("the prompt has " + std::to_string(len) +
                         " tokens; the context length is " +
                         std::to_string(c.max_position_embeddings) +
                         " and at least one position must remain for generation");
  if (r.max_new_tokens < 0 || r.max_new_tokens > c.max_position_embeddings)
    return Status::Error("max_new_tokens = " + std::to_string(r.max_new_tokens) +
                         " must be in [0, " + std::to_string(c.max_position_embeddings) + "]");
  if (r.n < 1 || r.n > 1024)
    return Status::Error("n = " + std::to_string(r.n) + " must be in [1, 1024]");
  MILES_RETURN_IF_ERROR(r.sampling.validate());
  for (int32_t id : r.stop_token_ids)
    if (id < 0 || id >= c.vocab_size)
      return Status::Error("stop_token_ids: " + std::to_string(id) + " is outside the vocabulary");
  for (const auto& s : r.stop_strings)
    if (s.empty()) return Status::Error("stop: empty stop string");
  MILES_RETURN_IF_ERROR(validate_adjustments(r, c.vocab_size));
  if (r.top_logprobs < 0 || r.top_logprobs > std::min<int64_t>(c.vocab_size, kMaxTopLogprobs))
    return Status::Error("top_logprobs_num = " + std::to_string(r.top_logprobs) +
                         " must be in [0, " +
                         std::to_string(std::min<int64_t>(c.vocab_size, kMaxTopLogprobs)) + "]");
  if (static_cast<int64_t>(r.token_ids_logprob.size()) > kMaxTopLogprobs)
    return Status::Error("token_ids_logprob lists " + std::to_string(r.token_ids_logprob.size()) +
                         " tokens; at most " + std::to_string(kMaxTopLogprobs) + " are returned");
  for (int32_t id : r.token_ids_logprob)
    if (id < 0 || id >= c.vocab_size)
      return Status::Error("token_ids_logprob: " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (r.logprob_start_len < -1 || r.logprob_start_len > len)
    return Status::Error("logprob_start_len = " + std::to_string(r.logprob_start_len) +
                         " must be -1 (no input logprobs) or in [0, " + std::to_string(len) +
                         "] (the prompt's length); use a smaller logprob_start_len");
  if (!r.stop_strings.empty() && !tok)
    return Status::Error("stop strings need a tokenizer; this engine has none");
  const int64_t total = std::min<int64_t>(len + r.max_new_tokens, c.max_position_embeddings);
  const int64_t blocks = (total + opt.block_tokens - 1) / opt.block_tokens;
  if (blocks > opt.num_blocks)
    return Status::Error("the request needs up to " + std::to_string(blocks) +
                         " KV blocks; the cache has " + std::to_string(opt.num_blocks));
  return Status::Ok();
}

Result<uint64_t> Engine::submit(GenerateRequest request, SampleListener listener) {
  Impl& m = *impl_;
  if (m.pool->storage_released())
    return Status::Error("the KV cache memory is released; POST /resume_memory_occupation first");
  if (m.weights_released)
    return Status::Error(
        "the weights are released (release_memory_occupation); a weight update "
        "(update_weights_from_disk, _from_disk_delta, _from_group) brings them back");
  MILES_RETURN_IF_ERROR(m.validate(request));
  if (request.draw_seed) {
    request.sampling.seed = m.fresh_seed();
    request.draw_seed = false;
  }
  auto r = std::make_unique<Request>();
  r->id = m.next_request_id++;
  r->listener = std::move(listener);
  for (int32_t i = 0; i < request.n; ++i) {
    auto s = std::make_unique<Sample>();
    s->request_id = r->id;
    s->index = i;
    s->slot = m.next_slot++;
    s->tokens = request.input_ids;
    s->prompt_len = static_cast<int64_t>(request.input_ids.size());
    s->prompt_key = prompt_key(request.input_ids);
    s->sampling = request.sampling;
    // Siblings draw different numbers from the same (seed, step) counter space.
    s->sampling.seed = request.sampling.seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    s->state = i == 0 ? SampleState::kWaiting : SampleState::kForkWaiting;
    if (i == 0) m.waiting.push_back(s.get());
    r->samples.push_back(std::move(s));
  }
  if (request.logprob_start_len >= 0)
    for (int64_t k = request.logprob_start_len; k < static_cast<int64_t>(request.input_ids.size());
         ++k)
      r->input_logprobs.push_back(
          {request.input_ids[k], k == request.logprob_start_len ? NAN : 0.0f, {}});
  r->req = std::move(request);
  const uint64_t id = r->id;
  m.requests.emplace(id, std::move(r));
  return id;
}

bool Engine::abort(uint64_t request_id) {
  Impl& m = *impl_;
  auto it = m.requests.find(request_id);
  if (it == m.requests.end()) return false;
  for (auto& s : it->second->samples)
    if (s->state != SampleState::kFinished) m.finish(*s, FinishReason::kAbort, "");
  m.report_and_reap();
  return true;
}

int64_t Engine::abort_all() {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(m.requests.size());
  for (auto& [id, r] : m.requests)
    for (auto& s : r->samples)
      if (s->state != SampleState::kFinished) m.finish(*s, FinishReason::kAbort, "");
  m.report_and_reap();
  return n;
}

bool Engine::idle() const { return impl_->requests.empty(); }
const IterationRecord& Engine::last_iteration() const { return impl_->last; }

void Engine::pause(PauseMode mode) {
  Impl& m = *impl_;
  m.paused = true;
  if (mode == PauseMode::kInPlace) return;
  std::vector<Sample*> active;
  for (auto& [id, r] : m.requests)
    for (auto& s : r->samples)
      if (s->state != SampleState::kFinished) active.push_back(s.get());
  for (Sample* s : active) {
    if (mode == PauseMode::kAbort) {
      m.finish(*s, FinishReason::kAbort, "");
    } else if (s->state != SampleState::kForkWaiting) {
      m.retract(*s);
    }
  }
  m.report_and_reap();
}

void Engine::resume() { impl_->paused = false; }

Status Engine::flush_cache() {
  Impl& m = *impl_;
  for (auto& [id, r] : m.requests)
    for (auto& s : r->samples)
      if (m.kv->has(s->slot))
        return Status::Error("flush_cache: request " + std::to_string(id) +
                             " holds KV blocks; pause with retract or abort first");
  m.radix->clear();
  return Status::Ok();
}

void Engine::update_weight_version(int64_t version) { impl_->version = version; }

Status Engine::begin_weight_update() {
  Impl& m = *impl_;
  if (m.updating) return Status::Error("begin_weight_update: an update is already in progress");
  if (!m.paused && !m.requests.empty())
    return Status::Error("begin_weight_update: the engine is generating; pause it first");
  m.updating = true;
  return Status::Ok();
}

Status Engine::end_weight_update() {
  Impl& m = *impl_;
  if (!m.updating) return Status::Error("end_weight_update: no update in progress");
  m.updating = false;
  return Status::Ok();
}

Status Engine::update_weights(std::unique_ptr<ModelRunner> runner) {
  Impl& m = *impl_;
  if (!m.updating && !m.paused && !m.requests.empty())
    return Status::Error("update_weights: the engine is generating; pause it first");
  const ModelConfig& a = m.runner->config();
  const ModelConfig& b = runner->config();
  if (a.vocab_size != b.vocab_size || a.num_layers != b.num_layers ||
      m.runner->kv_dim() != runner->kv_dim() ||
      a.num_moe_layers() * a.moe.top_k != b.num_moe_layers() * b.moe.top_k)
    return Status::Error("update_weights: the new weights have another architecture");
  m.runner = std::move(runner);
  m.weights_released = false;
  // Cached prefixes hold KV of the old weights: drop them (blocks still used by paused in-place
  // samples stay theirs), and never cache KV that began before this point.
  m.radix->clear();
  ++m.weights_epoch;
  return Status::Ok();
}

Status Engine::update_weights(const TensorMap& weights) {
  Impl& m = *impl_;
  if (!m.updating && !m.paused && !m.requests.empty())
    return Status::Error("update_weights: the engine is generating; pause it first");
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> next, m.runner->with_weights(weights));
  return update_weights(std::move(next));
}

Status Engine::release_kv_memory() {
  Impl& m = *impl_;
  if (!m.requests.empty())
    return Status::Error("release_memory_occupation: " + std::to_string(m.requests.size()) +
                         " requests are in flight; abort or finish them first");
  m.radix->clear();
  if (!m.pool->storage_released()) m.pool->release_storage();
  return Status::Ok();
}

void Engine::resume_kv_memory() { impl_->pool->restore_storage(); }

Status Engine::release_weights() {
  Impl& m = *impl_;
  if (!m.requests.empty())
    return Status::Error("release_memory_occupation: " + std::to_string(m.requests.size()) +
                         " requests are in flight; abort or finish them first");
  if (m.weights_released) return Status::Ok();
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> shell, m.runner->without_weights());
  m.runner = std::move(shell);  // the old runner, and with it the weights, is freed here
  m.radix->clear();
  m.weights_released = true;
  return Status::Ok();
}

void Engine::set_drafter(std::unique_ptr<Drafter> drafter) {
  MILES_CHECK(impl_->opt.speculative.enabled, "set_drafter() on an engine without speculation");
  impl_->drafter = std::move(drafter);
}

EngineStats Engine::stats() const {
  const Impl& m = *impl_;
  EngineStats s = m.counters;
  s.free_blocks = m.pool->free_blocks();
  s.total_blocks = m.pool->num_blocks();
  s.cached_blocks = m.radix->num_nodes();
  s.waiting = static_cast<int64_t>(m.waiting.size());
  s.running = static_cast<int64_t>(m.running.size());
  s.weight_version = m.version;
  s.paused = m.paused || m.updating;
  s.updating_weights = m.updating;
  s.kv_released = m.pool->storage_released();
  s.weights_released = m.weights_released;
  return s;
}

}  // namespace miles
