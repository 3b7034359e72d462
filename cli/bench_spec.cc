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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/bench_closed_loop.h"
#include "miles/chat_template.h"
#include "miles/draft_head.h"
#include "miles/json_text.h"
#include "miles/kernels.h"
#include "miles/rollout/drafter.h"
#include "miles/trainer/optimizer.h"

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
    const auto j = parse_json_or_discarded(line);
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
  std::vector<Task> tasks;
  for (Task& t : {std::ref(arith), std::ref(story)})
    if (std::ranges::find(o.tasks, t.name) != o.tasks.end()) tasks.push_back(std::move(t));
  return tasks;
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

// The co-trained head's training data: a plain engine's epochs over the task's prompts (groups of
// 8, seeds of their own), each sample's ids, its response's first position, and the policy's
// feature layers' outputs and logits over them (what the trainer's forward gives the head in a
// run).
struct HeadData {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> prompt_len;
  std::vector<std::vector<float>> hidden, logits;
};

Result<HeadData> head_data(const SpecBenchOptions& o, const Model& model, ThreadPool& pool,
                           const Task& task, int64_t first_epoch, int64_t epochs) {
  HeadData h;
  EngineOptions eo;
  eo.num_blocks = 48 * ((1024 + eo.block_tokens - 1) / eo.block_tokens) + 64;
  Engine e(make_model_runner(std::shared_ptr<const Model>(&model, [](const Model*) {}), &pool), eo);
  for (int64_t epoch = first_epoch; epoch < first_epoch + epochs; ++epoch) {
    const EpochResult r = run_epoch(e, task, 32, 101 + static_cast<uint64_t>(epoch), o.temperature);
    for (const auto& [key, out] : r.samples) {
      std::vector<int32_t> seq = task.prompts[key.first];
      h.prompt_len.push_back(static_cast<int64_t>(seq.size()));
      for (const TokenOutput& t : out) seq.push_back(t.id);
      h.tokens.push_back(std::move(seq));
    }
  }
  MILES_ASSIGN_OR_RETURN(const std::vector<int64_t> layers,
                         DraftHead::feature_layers_for(model.config(), o.head_layers));
  for (const auto& seq : h.tokens) {
    auto kv = model.make_kv_cache();
    const SeqSpan s{0, 0, static_cast<int64_t>(seq.size())};
    ForwardOptions fo;
    fo.tap_layers = layers;
    MILES_ASSIGN_OR_RETURN(ForwardOutput f, model.forward(seq, {&s, 1}, *kv, fo, &pool));
    h.hidden.push_back(std::move(f.taps));
    h.logits.push_back(std::move(f.logits));
  }
  return h;
}

// Fits a fresh head (DraftHead::create: the policy's layer 0, fc = [I | 0]) to the policy on the
// data: passes over it in order, one AdamW step per head_batch samples (response rows weighted 1,
// each step's loss a mean over its rows); prints the first and last pass's draft metrics.
Result<std::shared_ptr<const DraftHead>> train_head(const SpecBenchOptions& o, const Model& model,
                                                    ThreadPool& pool, const HeadData& h) {
  MILES_ASSIGN_OR_RETURN(TensorMap weights, read_hf_weights(o.model));
  std::vector<uint64_t> counts(static_cast<size_t>(model.config().vocab_size), 0);
  double rows = 0;
  for (size_t i = 0; i < h.tokens.size(); ++i) {
    for (int32_t id : h.tokens[i]) ++counts[static_cast<size_t>(id)];
    rows += static_cast<double>(h.tokens[i].size()) - static_cast<double>(h.prompt_len[i]);
  }
  MILES_ASSIGN_OR_RETURN(
      std::unique_ptr<DraftHead> head,
      DraftHead::create(model.config(), weights,
                        top_ids(counts, std::min<int64_t>(o.head_vocab, counts.size())),
                        o.head_layers));
  FlatTensors params = head->params();
  AdamWConfig ac;
  ac.clip_grad_norm = 0;
  AdamW opt(params.layout_ptr(), ac);
  const auto t0 = BenchClock::now();
  const size_t n = h.tokens.size(), batch = static_cast<size_t>(o.head_batch);
  int64_t steps = 0;
  for (int64_t pass = 0; pass < o.head_passes; ++pass) {
    DraftTrainSums total;
    for (size_t b0 = 0; b0 < n; b0 += batch) {
      const size_t b1 = std::min(n, b0 + batch);
      double step_rows = 0;
      for (size_t i = b0; i < b1; ++i)
        step_rows += static_cast<double>(h.tokens[i].size()) - static_cast<double>(h.prompt_len[i]);
      FlatTensors grads(params.layout_ptr());
      for (size_t i = b0; i < b1; ++i) {
        const int64_t t = static_cast<int64_t>(h.tokens[i].size());
        std::vector<float> weight(static_cast<size_t>(t), 0.0f);
        for (int64_t r = h.prompt_len[i] - 1; r + 1 < t; ++r) weight[static_cast<size_t>(r)] = 1;
        const SeqSpan s{0, 0, t};
        const DraftTrainRows tr{h.tokens[i], {&s, 1}, h.hidden[i], h.logits[i], weight};
        MILES_ASSIGN_OR_RETURN(DraftTrainSums d, head->accumulate_grad(tr, 1.0 / step_rows, grads,
                                                                       &pool, o.head_ttt_length));
        total.rows += d.rows;
        total.loss += d.loss;
        total.agree += d.agree;
        total.accept += d.accept;
      }
      opt.step(params, grads, o.head_lr);
      MILES_RETURN_IF_ERROR(head->set_params(params));
      ++steps;
    }
    if (pass == 0 || pass + 1 == o.head_passes)
      std::printf(
          "  draft head, pass %lld (%lld training passes each): loss %.3f, argmax = policy's %.3f, "
          "p(argmax) %.3f\n",
          static_cast<long long>(pass + 1), static_cast<long long>(o.head_ttt_length),
          total.loss / total.rows, total.agree / total.rows, total.accept / total.rows);
  }
  std::printf("  draft head: %zu samples, %.0f response rows, %lld AdamW steps in %.1f s\n",
              h.tokens.size(), rows, static_cast<long long>(steps), seconds_since(t0));
  std::fflush(stdout);
  return std::shared_ptr<const DraftHead>(std::move(head));
}

// The chance that two inverse-CDF draws with one uniform number give the same token: the sum over
// tokens of the overlap of their two intervals. p and q over the policy's vocabulary, walked in the
// sampler's order without filters (ids ascending, sample_token).
double coupled_agreement(std::span<const double> p, std::span<const double> q) {
  double cp = 0, cq = 0, sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    sum += std::max(0.0, std::min(cp + p[i], cq + q[i]) - std::max(cp, cq));
    cp += p[i];
    cq += q[i];
  }
  return sum;
}

// Drafting 2 and 3 tokens ahead on the held-out epoch, given the drafts before right: the
// training-time test's passes 2 and 3 (what the engine's draft KV holds there), evaluated only
// (the gradients are thrown away); argmax agreement and the policy's probability of the argmax
// at temperature 1.
void print_ahead(const DraftHead& head, const HeadData& h, ThreadPool& pool) {
  constexpr int64_t kPasses = 3;
  double rows[kPasses] = {}, agree[kPasses] = {}, accept[kPasses] = {};
  FlatTensors scratch(head.params().layout_ptr());
  for (size_t i = 0; i < h.tokens.size(); ++i) {
    const int64_t t = static_cast<int64_t>(h.tokens[i].size());
    std::vector<float> weight(static_cast<size_t>(t), 0.0f);
    for (int64_t r = h.prompt_len[i] - 1; r + 1 < t; ++r) weight[static_cast<size_t>(r)] = 1;
    const SeqSpan s{0, 0, t};
    const DraftTrainRows tr{h.tokens[i], {&s, 1}, h.hidden[i], h.logits[i], weight};
    auto d = head.accumulate_grad(tr, 1.0, scratch, &pool, kPasses);
    if (!d.ok()) {
      std::printf("  drafting ahead: %s\n", d.message().c_str());
      return;
    }
    for (int64_t p = 1; p < kPasses; ++p) {
      rows[p] += d->ahead[p - 1].rows;
      agree[p] += d->ahead[p - 1].agree;
      accept[p] += d->ahead[p - 1].accept;
    }
  }
  std::printf("  held-out epoch, drafting ahead given the drafts before right (temperature 1):");
  for (int64_t p = 1; p < kPasses; ++p)
    std::printf(" %lld ahead: argmax = policy's %.3f, p(argmax) %.3f;",
                static_cast<long long>(p + 1), agree[p] / rows[p], accept[p] / rows[p]);
  std::printf("\n");
}

// How the fitted head drafts on an epoch it was not fitted on: per response row, whether its
// argmax is the policy's, the policy's probability of it, the policy's mass inside the head's
// vocabulary, and (sampled) the chance that its coupled draw (the head's own inverse-CDF draw with
// the policy's uniform number, at head temperatures 1, 0.7 and 0.5) is the policy's draw; 1 − TV
// is what the best coupling of the two distributions would get.
void print_held_out(const DraftHead& head, const HeadData& h, float temperature, ThreadPool& pool) {
  const int64_t d = head.feature_width();
  const int64_t pv = head.policy_config().vocab_size;
  const std::span<const int32_t> ids = head.vocab();
  const int64_t dv = static_cast<int64_t>(ids.size());
  const double tp = temperature > 0 ? temperature : 1.0;
  const double head_temps[] = {1.0, 0.7, 0.5};
  double rows = 0, agree = 0, accept = 0, tv = 0, mass = 0, coupled[3] = {0, 0, 0};
  for (size_t i = 0; i < h.tokens.size(); ++i) {
    const std::vector<int32_t>& seq = h.tokens[i];
    auto kv = head.make_kv_cache();
    for (int64_t j = 0; j + 2 < static_cast<int64_t>(seq.size()); ++j) {
      const SeqSpan s{0, j, 1};
      auto step =
          head.forward(std::span(h.hidden[i]).subspan(static_cast<size_t>(j * d), d),
                       std::span(seq).subspan(static_cast<size_t>(j + 1), 1), {&s, 1}, *kv, &pool);
      if (!step.ok() || j + 2 < h.prompt_len[i]) continue;  // rows drafting a response token
      const float* z = h.logits[i].data() + (j + 1) * pv;
      std::vector<double> p(static_cast<size_t>(pv));
      const double zmax = *std::max_element(z, z + pv);
      double sum = 0;
      for (int64_t v = 0; v < pv; ++v) sum += p[v] = std::exp((z[v] - zmax) / tp);
      for (double& x : p) x /= sum;
      const float* y = step->logits.data();
      const int64_t best = std::max_element(y, y + dv) - y;
      rows += 1;
      agree += ids[best] == std::max_element(p.begin(), p.end()) - p.begin() ? 1 : 0;
      accept += p[static_cast<size_t>(ids[best])];
      for (const int32_t id : ids) mass += p[static_cast<size_t>(id)];
      for (int t = 0; t < 3; ++t) {
        std::vector<double> q(static_cast<size_t>(pv), 0.0);
        double qs = 0;
        for (int64_t v = 0; v < dv; ++v)
          qs += q[ids[v]] = std::exp((y[v] - y[best]) / (tp * head_temps[t]));
        for (double& x : q) x /= qs;
        coupled[t] += coupled_agreement(p, q);
        if (t == 0)
          for (int64_t v = 0; v < pv; ++v) tv += std::min(q[v], p[v]);
      }
    }
  }
  std::printf(
      "  held-out epoch (%.0f response rows): argmax = policy's %.3f, p(argmax) %.3f; "
      "policy mass in the draft vocabulary %.3f",
      rows, agree / rows, accept / rows, mass / rows);
  if (temperature > 0)  // greedy sampling draws the argmax: no coupled draws
    std::printf(
        "; coupled draw = policy's %.3f / %.3f / %.3f (head temperature 1 / 0.7 / 0.5); "
        "1 - TV %.3f",
        coupled[0] / rows, coupled[1] / rows, coupled[2] / rows, tv / rows);
  std::printf("\n");
  print_ahead(head, h, pool);
  std::fflush(stdout);
}

struct Row {
  std::string task;
  int concurrency = 0;
  EpochResult plain, spec, head;
  uint64_t head_scored = 0;  // HeadDrafterStats over the measured epoch
  std::array<uint64_t, 3> head_hits{};
  double plain_tps() const { return plain.output_tokens / plain.wall_s; }
  double spec_tps() const { return spec.output_tokens / spec.wall_s; }
  double head_tps() const { return head.wall_s > 0 ? head.output_tokens / head.wall_s : 0.0; }
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
  uint64_t dh(uint64_t EngineStats::*f) const { return head.after.*f - head.before.*f; }
};

// --spec-head: the draft head fitted to the policy on o.head_epochs plain epochs of the task's
// prompts, and its agreement with the policy on one more (held out) printed.
Result<std::shared_ptr<const DraftHead>> fit_head(const SpecBenchOptions& o, const Model& model,
                                                  ThreadPool& pool, const Task& task) {
  MILES_ASSIGN_OR_RETURN(auto data, head_data(o, model, pool, task, 0, o.head_epochs));
  std::printf("%s: the draft head fitted to the policy on %lld plain epochs of its prompts\n",
              task.name.c_str(), static_cast<long long>(o.head_epochs));
  MILES_ASSIGN_OR_RETURN(std::shared_ptr<const DraftHead> head, train_head(o, model, pool, data));
  MILES_ASSIGN_OR_RETURN(auto held_out, head_data(o, model, pool, task, o.head_epochs, 1));
  print_held_out(*head, held_out, o.temperature, pool);
  return head;
}

// One row: a fresh engine per kind (off, the suffix drafter, the draft head when there is one),
// each running the task's prompts twice at concurrency c; the second epoch is measured.
void measure_row(const SpecBenchOptions& o, std::shared_ptr<const Model> model,
                 std::shared_ptr<const Tokenizer> tok, ThreadPool& pool, const Task& task,
                 std::shared_ptr<const DraftHead> head, Row& row) {
  const int c = row.concurrency;
  for (int kind : {0, 1, 2}) {  // off, suffix drafter, draft head
    if (kind == 2 && !head) continue;
    EngineOptions eo;
    eo.max_batch_tokens = 2048;
    eo.max_running = std::max<int64_t>(256, c);
    eo.num_blocks = (c + 8) * ((1024 + eo.block_tokens - 1) / eo.block_tokens) + 64;
    eo.speculative.enabled = kind > 0;
    eo.speculative.max_draft_tokens = o.max_draft_tokens;
    eo.speculative.adaptive = o.adaptive;
    Engine e(make_model_runner(model, &pool), eo, tok);
    HeadDrafter* head_drafter = nullptr;
    if (kind == 2) {
      auto d = make_head_drafter(head, &pool);
      head_drafter = d.get();
      e.set_drafter(std::move(d));
    }
    run_epoch(e, task, c, 1, o.temperature);  // warm-up, and the drafter's history
    const HeadDrafterStats first = head_drafter ? head_drafter->stats() : HeadDrafterStats{};
    (kind == 0   ? row.plain
     : kind == 1 ? row.spec
                 : row.head) = run_epoch(e, task, c, 2, o.temperature);
    if (head_drafter) {
      const HeadDrafterStats last = head_drafter->stats();
      row.head_scored = last.scored - first.scored;
      for (size_t w = 0; w < last.hits.size(); ++w) row.head_hits[w] = last.hits[w] - first.hits[w];
    }
  }
}

void print_row_header() {
  std::printf("%-10s %4s %9s %12s %6s %10s %8s %8s %7s %10s %6s %10s %8s %s\n", "task", "c",
              "off tok/s", "suffix tok/s", "x off", "tok/verify", "accepted", "drafted", "mean p",
              "head tok/s", "x off", "tok/verify", "accepted", "same samples");
}

void print_row(const Row& row, bool same) {
  const uint64_t verifies = row.d(&EngineStats::spec_verifies);
  const uint64_t head_verifies = row.dh(&EngineStats::spec_verifies);
  std::printf(
      "%-10s %4d %9.1f %12.1f %6.2f %10.2f %8llu %8llu %7.3f %10.1f %6.2f %10.2f %8s %s\n",
      row.task.c_str(), row.concurrency, row.plain_tps(), row.spec_tps(),
      row.spec_tps() / row.plain_tps(),
      verifies ? double(row.d(&EngineStats::spec_emitted_tokens)) / verifies : 0.0,
      static_cast<unsigned long long>(row.d(&EngineStats::spec_accepted_tokens)),
      static_cast<unsigned long long>(row.d(&EngineStats::spec_draft_tokens)), row.mean_p(),
      row.head_tps(), row.head_tps() / row.plain_tps(),
      head_verifies ? double(row.dh(&EngineStats::spec_emitted_tokens)) / head_verifies : 0.0,
      (std::to_string(row.dh(&EngineStats::spec_accepted_tokens)) + "/" +
       std::to_string(row.dh(&EngineStats::spec_draft_tokens)))
          .c_str(),
      same ? "yes" : "NO");
  if (row.head_scored > 0)
    std::printf(
        "  head's first drafts whose token landed: %llu; = its argmax %.3f, = its coupled "
        "draw %.3f, at half the temperature %.3f\n",
        static_cast<unsigned long long>(row.head_scored),
        double(row.head_hits[0]) / double(row.head_scored),
        double(row.head_hits[1]) / double(row.head_scored),
        double(row.head_hits[2]) / double(row.head_scored));
  std::fflush(stdout);
}

void write_rows_json(const SpecBenchOptions& o, int threads, const std::vector<Row>& rows) {
  nlohmann::json j = {{"model", o.model},
                      {"threads", threads},
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
                         {"head_tokens_per_s", r.head_tps()},
                         {"head_verifies", r.dh(&EngineStats::spec_verifies)},
                         {"head_emitted_tokens", r.dh(&EngineStats::spec_emitted_tokens)},
                         {"head_draft_tokens", r.dh(&EngineStats::spec_draft_tokens)},
                         {"head_accepted_tokens", r.dh(&EngineStats::spec_accepted_tokens)},
                         {"head_first_drafts_scored", r.head_scored},
                         {"head_first_drafts_hits_argmax_coupled_sharpened", r.head_hits},
                         {"output_tokens", r.spec.output_tokens}});
  std::ofstream(o.json) << j.dump(1) << "\n";
}

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
  std::vector<Row> rows;
  for (const Task& task : *tasks) {
    std::shared_ptr<const DraftHead> head;
    if (o.head) {
      auto fitted = fit_head(o, *model, pool, task);
      if (!fitted.ok()) return fail("bench rollout --spec", fitted.message());
      head = std::move(fitted).value();
    }
    print_row_header();
    for (int c : o.concurrency) {
      Row row{task.name, c, {}, {}, {}};
      measure_row(o, model, tok, pool, task, head, row);
      const bool same =
          same_samples(row.plain, row.spec) && (!head || same_samples(row.plain, row.head));
      print_row(row, same);
      if (!same) return fail("bench rollout --spec", "speculative samples differ from plain ones");
      rows.push_back(std::move(row));
    }
  }
  if (!o.json.empty()) write_rows_json(o, pool.num_threads(), rows);
  return 0;
}

}  // namespace miles::cli
