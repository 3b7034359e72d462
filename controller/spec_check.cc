#include "controller/spec_check.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "miles/model.h"
#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"

namespace miles::controller {

namespace {

// The engine request GroupRunner sends for the group (its seed, sampling and stops).
GenerateRequest group_request(const RolloutSection& r, const RolloutGroup& g) {
  GenerateRequest q;
  q.input_ids = g.prompt->ids;
  q.n = static_cast<int32_t>(r.n_samples_per_prompt);
  q.max_new_tokens = r.max_new_tokens;
  q.sampling.temperature = static_cast<float>(r.temperature);
  q.sampling.top_p = static_cast<float>(r.top_p);
  q.sampling.top_k = static_cast<int32_t>(r.top_k);
  q.sampling.seed = group_seed(r.seed, g.position);
  q.stop_strings = r.stop;
  return q;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool same_sample(const SampleEvent& a, const SampleEvent& b) {
  if (a.output.size() != b.output.size() || a.finish_reason != b.finish_reason ||
      a.routed_experts != b.routed_experts)
    return false;
  for (size_t i = 0; i < a.output.size(); ++i) {
    const TokenOutput& x = a.output[i];
    const TokenOutput& y = b.output[i];
    if (x.id != y.id || !same_bits(x.logprob, y.logprob) ||
        !same_bits(x.raw_logprob, y.raw_logprob) || x.weight_version != y.weight_version)
      return false;
  }
  return true;
}

// Every group's request on `engine`, all submitted at once; finals by (group, sample).
std::map<std::pair<size_t, int>, SampleEvent> generate(Engine& engine,
                                                       const std::vector<GenerateRequest>& reqs) {
  std::map<uint64_t, size_t> group_of;
  std::map<std::pair<size_t, int>, SampleEvent> out;
  for (size_t k = 0; k < reqs.size(); ++k) {
    auto id = engine.submit(reqs[k], [&out, &group_of](const SampleEvent& e) {
      if (e.finished) out[{group_of.at(e.request_id), e.sample_index}] = e;
    });
    if (id.ok()) group_of[*id] = k;
  }
  while (engine.step()) {
  }
  return out;
}

}  // namespace

Result<SpecCheck> check_speculative(const RunConfig& config,
                                    const std::vector<RolloutGroup>& groups,
                                    std::shared_ptr<const Tokenizer> tokenizer) {
  const RolloutSection& r = config.rollout;
  if (r.environment != Environment::kNone || !r.function.empty())
    return Status::Error(
        "multi-turn jobs (rollout.environment, rollout.function) are not covered: their sessions "
        "are driven by the environment");
  MILES_ASSIGN_OR_RETURN(ModelFiles files, load_model_files(config.model.path));
  MILES_ASSIGN_OR_RETURN(auto model, Model::from_weights(files.config, files.weights));
  std::shared_ptr<const Model> shared(std::move(model));
  std::vector<GenerateRequest> reqs;
  for (const RolloutGroup& g : groups) reqs.push_back(group_request(r, g));
  for (const GenerateRequest& q : reqs)
    if (Status s = q.sampling.validate(); !s.ok()) return s;

  ThreadPool pool(static_cast<int>(r.engine_threads));
  EngineOptions eo;
  // KV for the whole batch at full length, not the job's engine size (two engines live here, beside
  // the trainer: a 4096-block pool of SmolLM2 would be 3 GB each).
  int64_t blocks = 16;
  for (const GenerateRequest& q : reqs)
    blocks +=
        q.n * ((static_cast<int64_t>(q.input_ids.size()) + q.max_new_tokens + eo.block_tokens) /
               eo.block_tokens);
  eo.num_blocks = std::min(r.engine_num_blocks, blocks);
  eo.max_batch_tokens = r.engine_max_batch_tokens;
  eo.max_running = r.engine_max_running;
  Engine plain(make_model_runner(shared, &pool), eo, tokenizer);
  eo.speculative.enabled = true;
  eo.speculative.adaptive = false;  // verify every proposal: the gate is about the bits
  eo.speculative.max_draft_tokens = r.speculative_max_draft_tokens;
  Engine spec(make_model_runner(shared, &pool), eo, tokenizer);
  // The job's responses stand for an earlier epoch's: what the model-free drafter keeps per prompt.
  auto drafter = make_suffix_drafter({});
  for (const RolloutGroup& g : groups)
    for (const RolloutSample& s : g.samples) {
      std::vector<int32_t> ids;
      for (const TokenOutput& t : s.tokens) ids.push_back(t.id);
      drafter->observe(g.prompt->ids, ids);
    }
  spec.set_drafter(std::move(drafter));

  const auto a = generate(plain, reqs);
  const auto b = generate(spec, reqs);
  SpecCheck c;
  for (size_t k = 0; k < groups.size(); ++k)
    for (const RolloutSample& job : groups[k].samples) {
      auto x = a.find({k, job.index});
      auto y = b.find({k, job.index});
      if (x == a.end() || y == b.end())
        return Status::Error("speculative check: group " + std::to_string(k) + " sample " +
                             std::to_string(job.index) + " did not finish");
      ++c.samples;
      c.tokens += static_cast<int64_t>(x->second.output.size());
      c.mismatched_samples += same_sample(x->second, y->second) ? 0 : 1;
      bool as_job = job.tokens.size() == x->second.output.size();
      for (size_t i = 0; as_job && i < job.tokens.size(); ++i)
        as_job = job.tokens[i].id == x->second.output[i].id &&
                 same_bits(job.tokens[i].logprob, x->second.output[i].logprob);
      c.same_as_job += as_job ? 1 : 0;
    }
  const EngineStats s = spec.stats();
  c.draft_tokens = s.spec_draft_tokens;
  c.accepted_tokens = s.spec_accepted_tokens;
  c.verifies = s.spec_verifies;
  c.emitted_tokens = s.spec_emitted_tokens;
  c.plain_iterations = plain.stats().iterations;
  c.spec_iterations = s.iterations;
  return c;
}

}  // namespace miles::controller
