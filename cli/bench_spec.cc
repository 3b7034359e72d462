// `miles bench rollout --spec`: speculative decoding on GRPO workloads of real prompts
// (docs/speculative.md).
//
// Why: speculation changes no bit, so the only question is speed, and that depends on the text:
// how often a sample repeats its siblings, its prompt or an earlier epoch's answer. Two tasks with
// the model's chat template — two-operand arithmetic (configs/data/arithmetic.jsonl, the
// smollm2_arithmetic job's) and short stories — each at concurrency 1 (one sample at a time: the
// long tail of a batch), 8 (one GRPO group of 8) and 32 (four groups of 8), temperature 1 as in RL.
// Every engine runs two epochs over the same prompts with new seeds (RL recycles prompts); the
// second is measured, so the suffix drafter has the first epoch's responses, as it would from step
// two of a run. Plain and speculative engines must emit the same samples: the bench compares them
// and fails if one token or logprob differs.
#include "cli/bench_spec.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/bench_closed_loop.h"
#include "miles/chat_template.h"
#include "miles/kernels.h"

namespace miles::cli {

namespace {

struct Task {
  std::string name;
  std::vector<std::vector<int32_t>> prompts;
  int64_t max_new_tokens = 32;
};

const char* const kStorySubjects[] = {
    "a cat who learns to swim",
    "a robot who plants a garden",
    "a girl who finds a map",
    "a dragon who is afraid of the dark",
    "a boy and his kite",
    "an old man who feeds the birds",
    "a fox who wants to fly",
    "a little boat in a storm",
    "a bear who cannot sleep",
    "two friends who build a treehouse",
    "a mouse in a big library",
    "a star that falls into the sea",
    "a dog who waits at the station",
    "a baker who bakes a giant cake",
    "a snail that wins a race",
    "a lighthouse keeper and a whale",
};

Result<std::vector<int32_t>> chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                                         const std::string& text) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", text}});
  RenderOptions ro;
  ro.add_generation_prompt = true;
  MILES_ASSIGN_OR_RETURN(std::string rendered, tmpl.render(messages, ro));
  return tok.encode(rendered, /*add_special=*/false);
}

Result<std::vector<Task>> load_tasks(const SpecBenchOptions& o, const Tokenizer& tok) {
  MILES_ASSIGN_OR_RETURN(ChatTemplate tmpl,
                         ChatTemplate::from_tokenizer_config(o.model + "/tokenizer_config.json"));
  Task arith{"arithmetic", {}, 32};
  std::ifstream in(o.arithmetic_data);
  if (!in) return Status::Error("--spec-arithmetic-data: cannot read " + o.arithmetic_data);
  for (std::string line; std::getline(in, line) && arith.prompts.size() < size_t(o.prompts);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("prompt") || !j["prompt"].is_string())
      return Status::Error(o.arithmetic_data + ": a line without a \"prompt\" string");
    MILES_ASSIGN_OR_RETURN(auto ids, chat_prompt(tmpl, tok, j["prompt"].get<std::string>()));
    arith.prompts.push_back(std::move(ids));
  }
  Task story{"story", {}, 96};
  for (int64_t i = 0; i < o.prompts; ++i) {
    const std::string text = std::string("Write a very short story about ") +
                             kStorySubjects[i % std::size(kStorySubjects)] + ".";
    MILES_ASSIGN_OR_RETURN(auto ids, chat_prompt(tmpl, tok, text));
    story.prompts.push_back(std::move(ids));
  }
  return std::vector<Task>{std::move(arith), std::move(story)};
}

struct EpochResult {
  double wall_s = 0;
  int64_t output_tokens = 0;
  EngineStats before, after;
  std::map<std::pair<size_t, int>, std::vector<TokenOutput>> samples;  // (prompt, sample)
};

// One epoch: every prompt as a request of `group` samples, `concurrency / group` requests in
// flight at once (closed loop), on the engine's own thread (this one).
EpochResult run_epoch(Engine& e, const Task& task, int concurrency, uint64_t seed,
                      float temperature) {
  const int group = std::min(concurrency, 8);
  const int in_flight = std::max(1, concurrency / group);
  EpochResult r;
  r.before = e.stats();
  size_t next = 0;
  int running = 0;
  std::map<uint64_t, size_t> prompt_of;
  std::map<uint64_t, int> left;
  auto submit = [&] {
    GenerateRequest q;
    q.input_ids = task.prompts[next];
    q.n = group;
    q.max_new_tokens = task.max_new_tokens;
    q.sampling.temperature = temperature;
    q.sampling.seed = seed * 1000003ull + next;
    const size_t p = next++;
    auto id = e.submit(q, [&r, &prompt_of, &left, &running](const SampleEvent& ev) {
      if (!ev.finished) return;
      r.samples[{prompt_of.at(ev.request_id), ev.sample_index}] = ev.output;
      r.output_tokens += static_cast<int64_t>(ev.output.size());
      if (--left.at(ev.request_id) == 0) --running;
    });
    MILES_CHECK(id.ok(), "bench requests are valid");
    prompt_of[*id] = p;
    left[*id] = group;
    ++running;
  };
  const auto t0 = BenchClock::now();
  while (next < task.prompts.size() || running > 0) {
    while (running < in_flight && next < task.prompts.size()) submit();
    if (!e.step()) break;
  }
  r.wall_s = seconds_since(t0);
  r.after = e.stats();
  return r;
}

bool same_samples(const EpochResult& a, const EpochResult& b) {
  if (a.samples.size() != b.samples.size()) return false;
  for (const auto& [k, x] : a.samples) {
    auto it = b.samples.find(k);
    if (it == b.samples.end() || it->second.size() != x.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].id != it->second[i].id ||
          std::memcmp(&x[i].logprob, &it->second[i].logprob, sizeof(float)) != 0)
        return false;
  }
  return true;
}

struct Row {
  std::string task;
  int concurrency = 0;
  EpochResult plain, spec;
  double plain_tps() const { return plain.output_tokens / plain.wall_s; }
  double spec_tps() const { return spec.output_tokens / spec.wall_s; }
  // Mean probability of the sampled token: what a drafter proposing a sample of the policy itself
  // would get accepted (how predictable the policy's text is at this temperature).
  double mean_p() const {
    double sum = 0;
    int64_t n = 0;
    for (const auto& [k, out] : plain.samples)
      for (const TokenOutput& t : out) {
        sum += std::exp(static_cast<double>(t.logprob));
        ++n;
      }
    return n ? sum / static_cast<double>(n) : 0.0;
  }
  uint64_t d(uint64_t EngineStats::*f) const { return spec.after.*f - spec.before.*f; }
};

}  // namespace

int run_spec_bench(const SpecBenchOptions& o, std::shared_ptr<const Model> model,
                   std::shared_ptr<const Tokenizer> tok, ThreadPool& pool) {
  if (!tok) return fail("bench rollout --spec", "needs the model's tokenizer");
  auto tasks = load_tasks(o, *tok);
  if (!tasks.ok()) return fail("bench rollout --spec", tasks.message());
  std::printf(
      "miles bench rollout --spec: %s, %d threads (%s); GRPO groups of up to 8, temperature %g; "
      "epoch 2 of the same %lld prompts measured (the drafter has epoch 1's responses)\n",
      o.model.c_str(), pool.num_threads(), kernels::isa_name(kernels::detect_isa()),
      static_cast<double>(o.temperature), static_cast<long long>(o.prompts));
  std::printf("%-10s %4s %9s %12s %6s %10s %8s %8s %7s %9s %s\n", "task", "c", "off tok/s",
              "suffix tok/s", "x off", "tok/verify", "accepted", "drafted", "mean p", "co-train",
              "same samples");
  std::vector<Row> rows;
  for (const Task& task : *tasks)
    for (int c : o.concurrency) {
      Row row{task.name, c, {}, {}};
      for (bool spec : {false, true}) {
        EngineOptions eo;
        eo.max_batch_tokens = 2048;
        eo.max_running = std::max<int64_t>(256, c);
        eo.num_blocks = (c + 8) * ((1024 + eo.block_tokens - 1) / eo.block_tokens) + 64;
        eo.speculative.enabled = spec;
        eo.speculative.max_draft_tokens = o.max_draft_tokens;
        Engine e(make_model_runner(model, &pool), eo, tok);
        run_epoch(e, task, c, 1, o.temperature);  // warm-up, and the drafter's history
        (spec ? row.spec : row.plain) = run_epoch(e, task, c, 2, o.temperature);
      }
      const bool same = same_samples(row.plain, row.spec);
      const uint64_t verifies = row.d(&EngineStats::spec_verifies);
      std::printf("%-10s %4d %9.1f %12.1f %6.2f %10.2f %8llu %8llu %7.3f %9s %s\n",
                  task.name.c_str(), c, row.plain_tps(), row.spec_tps(),
                  row.spec_tps() / row.plain_tps(),
                  verifies ? double(row.d(&EngineStats::spec_emitted_tokens)) / verifies : 0.0,
                  static_cast<unsigned long long>(row.d(&EngineStats::spec_accepted_tokens)),
                  static_cast<unsigned long long>(row.d(&EngineStats::spec_draft_tokens)),
                  row.mean_p(), "not built", same ? "yes" : "NO");
      std::fflush(stdout);
      if (!same) return fail("bench rollout --spec", "speculative samples differ from plain ones");
      rows.push_back(std::move(row));
    }
  if (!o.json.empty()) {
    nlohmann::json j = {{"model", o.model},
                        {"threads", pool.num_threads()},
                        {"isa", kernels::isa_name(kernels::detect_isa())},
                        {"prompts", o.prompts},
                        {"temperature", o.temperature},
                        {"rows", nlohmann::json::array()}};
    for (const Row& r : rows)
      j["rows"].push_back({{"task", r.task},
                           {"concurrency", r.concurrency},
                           {"off_tokens_per_s", r.plain_tps()},
                           {"suffix_tokens_per_s", r.spec_tps()},
                           {"verifies", r.d(&EngineStats::spec_verifies)},
                           {"emitted_tokens", r.d(&EngineStats::spec_emitted_tokens)},
                           {"draft_tokens", r.d(&EngineStats::spec_draft_tokens)},
                           {"accepted_tokens", r.d(&EngineStats::spec_accepted_tokens)},
                           {"mean_token_probability", r.mean_p()},
                           {"output_tokens", r.spec.output_tokens}});
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace miles::cli
