// The GRPO prefix-sharing workload, for `miles bench rollout`.
//
// Why: GRPO samples a group of n completions of one prompt. The engine can compute the prompt once
// and fork (one request with n = group), or a client can send n separate requests and rely on the
// radix prefix cache. This measures the prefill work each way — from the engine's own counters
// (prompt positions computed vs served from the cache) — and the wall time, with the cache off as
// the baseline. Separate requests are sent two ways: all of a group at once (a burst, as an async
// client does: the copies are prefilled side by side, before any of them is in the cache) and the
// leader first, its siblings after the leader's first token (the prompt is then resident).
#pragma once

#include <memory>
#include <vector>

#include "cli/bench_closed_loop.h"

namespace miles::cli {

enum class GrpoMode {
  kForkN,                // one request with n = group size
  kSeparateBurst,        // group size requests submitted together
  kSeparateLeaderFirst,  // one request, then the rest after its first token
  kSeparateNoCache,      // as kSeparateBurst; the engine runs with enable_prefix_cache = false
};

struct GrpoResult {
  double wall_s = 0;
  double cpu_s = 0;             // process CPU time during the run
  uint64_t prefill_tokens = 0;  // prompt positions computed (EngineStats::prompt_tokens)
  uint64_t cached_tokens = 0;   // prompt positions shared or served from the cache
  int64_t output_tokens = 0;
  Status status;
};

namespace grpo_detail {

// One submission unit: a request and the stream its events go to.
struct Pending {
  GenerateRequest request;
  std::shared_ptr<rollout::RequestStream> stream = std::make_shared<rollout::RequestStream>();
  int64_t output_tokens = 0;  // seen before the final wait (the leader's first tokens)
  int32_t finished = 0;       // samples finished before the final wait
};

// Submits all of `batch` in one engine command, so they arrive in the same iteration.
inline Status submit_together(rollout::EngineDriver& driver, std::vector<Pending*> batch) {
  Status out;
  driver.run_sync([&](Engine& e) {
    for (Pending* p : batch) {
      auto stream = p->stream;
      auto id = e.submit(p->request, [stream](const SampleEvent& ev) { stream->push(ev); });
      if (!id.ok() && out.ok()) out = id.status();
    }
  });
  return out;
}

}  // namespace grpo_detail

// `groups` groups of `group_size` samples, all groups submitted at once on a fresh engine (one with
// enable_prefix_cache = false for kSeparateNoCache), prompt index = first_index + group.
inline GrpoResult run_grpo(rollout::EngineDriver& driver, const LoadSpec& spec, int groups,
                           int group_size, GrpoMode mode, uint64_t first_index) {
  using grpo_detail::Pending;
  const int per_group = mode == GrpoMode::kForkN ? 1 : group_size;
  const int32_t n = mode == GrpoMode::kForkN ? group_size : 1;
  std::vector<Pending> pending(static_cast<size_t>(groups) * per_group);
  for (int g = 0; g < groups; ++g)
    for (int i = 0; i < per_group; ++i)
      pending[g * per_group + i].request = bench_request(spec, bench_prompt(spec, first_index + g),
                                                         spec.seed + 1 + g * group_size + i, n);

  const EngineStats before = driver.call<EngineStats>([](Engine& e) { return e.stats(); });
  GrpoResult r;
  const double cpu0 = process_cpu_seconds();
  const auto t0 = BenchClock::now();
  std::vector<Pending*> first, later;
  for (int g = 0; g < groups; ++g)
    for (int i = 0; i < per_group; ++i) {
      const bool wait = mode == GrpoMode::kSeparateLeaderFirst && i > 0;
      (wait ? later : first).push_back(&pending[g * per_group + i]);
    }
  r.status = grpo_detail::submit_together(driver, first);
  if (r.status.ok() && !later.empty()) {
    // Wait for each leader's first token; its prompt is in the cache from then on.
    for (int g = 0; g < groups && r.status.ok(); ++g) {
      Pending& leader = pending[g * per_group];
      for (SampleEvent ev; leader.output_tokens == 0 && r.status.ok();) {
        if (!leader.stream->next(ev, 600'000)) r.status = Status::Error("a leader never started");
        leader.output_tokens += static_cast<int64_t>(ev.new_tokens.size());
        leader.finished += ev.finished ? 1 : 0;
      }
      if (r.status.ok())
        r.status = grpo_detail::submit_together(
            driver, std::vector<Pending*>(later.begin() + g * (per_group - 1),
                                          later.begin() + (g + 1) * (per_group - 1)));
    }
  }
  for (Pending& p : pending) {
    if (!r.status.ok()) break;
    RequestTiming t;
    r.status = wait_request(*p.stream, n - p.finished, t0, t);
    r.output_tokens += p.output_tokens + t.output_tokens;
  }
  r.wall_s = seconds_since(t0);
  r.cpu_s = process_cpu_seconds() - cpu0;
  const EngineStats after = driver.call<EngineStats>([](Engine& e) { return e.stats(); });
  r.prefill_tokens = after.prompt_tokens - before.prompt_tokens;
  r.cached_tokens = after.cached_prompt_tokens - before.cached_prompt_tokens;
  return r;
}

}  // namespace miles::cli
