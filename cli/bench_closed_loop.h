// Closed-loop load on an EngineDriver, for `miles bench rollout`.
//
// Why: rollout throughput depends on how many requests the engine batches, so the benchmark drives
// it the way RL clients do: `concurrency` client threads, each submitting its next request the
// moment the previous one finished, until N requests are done. It talks to the driver in-process
// (no HTTP), so the numbers are the engine's. Prompts are random token ids drawn from a fixed seed,
// and requests ignore EOS, so every run of a configuration does exactly the same work.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "miles/rollout/engine.h"
#include "miles/rollout/engine_driver.h"

namespace miles::cli {

using BenchClock = std::chrono::steady_clock;

inline double seconds_since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// CPU seconds used by this process so far, all threads: with the wall time it tells how many cores
// a measurement really got on a shared machine.
inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

struct LoadSpec {
  int64_t prompt_tokens = 64;  // P
  int64_t output_tokens = 64;  // O: max_new_tokens, always reached (ignore_eos)
  int32_t vocab_size = 0;
  uint64_t seed = 1234;
};

// The prompt of request `index`: P ids uniform over the vocabulary, a pure function of (seed,
// index).
inline std::vector<int32_t> bench_prompt(const LoadSpec& spec, uint64_t index) {
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + index);
  std::uniform_int_distribution<int32_t> id(0, spec.vocab_size - 1);
  std::vector<int32_t> out(spec.prompt_tokens);
  for (auto& t : out) t = id(rng);
  return out;
}

// Temperature 1, EOS ignored, O new tokens, `n` samples.
inline GenerateRequest bench_request(const LoadSpec& spec, std::vector<int32_t> prompt,
                                     uint64_t sampling_seed, int32_t n = 1) {
  GenerateRequest r;
  r.input_ids = std::move(prompt);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = sampling_seed;
  r.max_new_tokens = spec.output_tokens;
  r.ignore_eos = true;
  r.n = n;
  return r;
}

// What one request saw, in seconds from just before its submission.
struct RequestTiming {
  double latency_s = 0;  // until its last sample finished
  double ttft_s = -1;    // until the first event carrying tokens
  int64_t output_tokens = 0;
};

// Drains `stream` until `samples` samples have finished. An error when the engine goes silent for
// `stall_s` seconds (a bug, or a machine far too slow for the chosen sizes).
inline Status wait_request(rollout::RequestStream& stream, int32_t samples,
                           BenchClock::time_point t0, RequestTiming& out, double stall_s = 600) {
  int32_t finished = 0;
  auto last_event = BenchClock::now();
  while (finished < samples) {
    SampleEvent ev;
    if (!stream.next(ev, 1000)) {
      if (seconds_since(last_event) > stall_s)
        return Status::Error("no engine event for a request");
      continue;
    }
    last_event = BenchClock::now();
    if (!ev.new_tokens.empty() && out.ttft_s < 0) out.ttft_s = seconds_since(t0);
    out.output_tokens += static_cast<int64_t>(ev.new_tokens.size());
    if (ev.finished) ++finished;
  }
  out.latency_s = seconds_since(t0);
  return Status::Ok();
}

struct LoadResult {
  double wall_s = 0;
  double cpu_s = 0;  // process CPU time during the run
  int64_t output_tokens = 0;
  std::vector<double> latency_s, ttft_s;  // one per request
  Status status;                          // the first error, if any
};

// `requests` requests (prompt index = request index + first_index) from `concurrency` client
// threads.
inline LoadResult run_closed_loop(rollout::EngineDriver& driver, const LoadSpec& spec,
                                  int concurrency, int64_t requests, uint64_t first_index = 0) {
  std::vector<std::vector<int32_t>> prompts(requests);
  for (int64_t i = 0; i < requests; ++i) prompts[i] = bench_prompt(spec, first_index + i);
  std::vector<RequestTiming> timings(requests);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  LoadResult result;
  auto client = [&] {
    for (int64_t i; !failed && (i = next.fetch_add(1)) < requests;) {
      auto stream = std::make_shared<rollout::RequestStream>();
      const auto t0 = BenchClock::now();
      auto id =
          driver.submit(bench_request(spec, std::move(prompts[i]), spec.seed + 1 + i), stream);
      Status s = id.ok() ? wait_request(*stream, 1, t0, timings[i]) : id.status();
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!failed.exchange(true)) result.status = s.with_context("request " + std::to_string(i));
      }
    }
  };
  const double cpu0 = process_cpu_seconds();
  const auto t0 = BenchClock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) clients.emplace_back(client);
  for (auto& t : clients) t.join();
  result.wall_s = seconds_since(t0);
  result.cpu_s = process_cpu_seconds() - cpu0;
  for (const RequestTiming& t : timings) {
    result.output_tokens += t.output_tokens;
    result.latency_s.push_back(t.latency_s);
    result.ttft_s.push_back(t.ttft_s);
  }
  return result;
}

}  // namespace miles::cli
