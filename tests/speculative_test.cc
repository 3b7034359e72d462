// Speculative decoding (docs/speculative.md): with drafts verified in the engine, every sample's
// tokens, logprobs (sampled, raw, tempered, top and requested ids), weight versions, routed
// experts, finish reasons and input logprobs are the plain engine's bits — greedy and sampled with
// top-p / top-k, logit adjustments, stop ids inside an accepted chunk, max_new_tokens and the
// context edge, GRPO groups, batches of 1 to 64, dense, sliding-window, MoE and MLA models —
// whether the drafts are right, partly wrong or the model-free drafter's; rejected positions free
// their blocks and never reach the prefix cache (a second wave reusing the first's blocks gets the
// same bits), and pauses and weight updates mid-sequence give what plain decoding gives at the same
// token. Then the suffix drafter and the adaptive policy on their own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "engine_workload.h"
#include "miles/draft_head.h"
#include "miles/flat_params.h"
#include "miles/rollout/drafter.h"
#include "miles/rollout/engine.h"
#include "miles/thread_pool.h"
#include "miles/trainer/optimizer.h"
#include "rollout/spec_policy.h"
#include "test_paths.h"

namespace miles {
namespace {

std::shared_ptr<const Model> load(const std::string& name) {
  auto m = Model::load(test::data_dir() + "/models/" + name);
  EXPECT_TRUE(m.ok()) << m.message();
  return std::shared_ptr<const Model>(std::move(m).value());
}

struct Sampling {
  const char* name;
  float temperature, top_p;
  int32_t top_k;
};
constexpr Sampling kGreedy{"greedy", 0.0f, 1.0f, 0};
constexpr Sampling kTopP{"t=1 top_p=0.9", 1.0f, 0.9f, 0};
constexpr Sampling kTopK{"t=1 top_k=20", 1.0f, 1.0f, 20};

// `batch` requests of random prompts submitted together: every fourth a GRPO group of 3, one with
// the prompt's input logprobs (its rows make the forward return every row's logits), some with
// logit adjustments, stop ids, top logprobs, and lengths up to the context's edge.
std::vector<GenerateRequest> make_requests(int batch, const Sampling& sp, uint32_t seed,
                                           int64_t context) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < batch; ++i) {
    GenerateRequest r;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) r.input_ids.push_back(static_cast<int32_t>(rng() % 1024));
    // Repetitive prompts too, so the suffix drafter finds matches.
    if (i % 3 == 1)
      for (int k = 0; k < len; ++k) r.input_ids.push_back(r.input_ids[k]);
    r.sampling.temperature = sp.temperature;
    r.sampling.top_p = sp.top_p;
    r.sampling.top_k = sp.top_k;
    r.sampling.seed = rng();
    r.max_new_tokens = 1 + static_cast<int64_t>(rng() % 30);
    if (i % 4 == 0) r.n = 3;
    if (i % 5 == 2) r.adjust.repetition_penalty = 1.3f;
    if (i % 5 == 3) r.adjust.frequency_penalty = 0.5f;
    if (i % 7 == 4) r.adjust.min_new_tokens = std::min<int64_t>(3, r.max_new_tokens);
    if (i % 6 == 5) r.stop_token_ids = {static_cast<int32_t>(rng() % 8)};
    if (i % 8 == 6) r.top_logprobs = 2;
    if (i % 9 == 7) r.token_ids_logprob = {3, 5};
    if (i == 1) r.logprob_start_len = 0;
    if (i == 2) {  // ends at the model's context
      r.input_ids.resize(static_cast<size_t>(context - 5), 7);
      r.max_new_tokens = 40;
    }
    out.push_back(std::move(r));
  }
  return out;
}

struct Outputs {
  std::vector<SampleEvent> finals;              // in submission order, sample index within
  std::vector<std::vector<int32_t>> sequences;  // prompt + output of each
};

Outputs generate_all(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::map<std::pair<uint64_t, int>, SampleEvent> got;
  std::vector<uint64_t> ids;
  for (const auto& r : reqs) {
    auto id = e.submit(r, [&](const SampleEvent& ev) {
      if (ev.finished) got[{ev.request_id, ev.sample_index}] = ev;
    });
    EXPECT_TRUE(id.ok()) << id.message();
    ids.push_back(id.ok() ? *id : 0);
  }
  for (int i = 0; i < 100000 && !e.idle(); ++i) e.step();
  EXPECT_TRUE(e.idle());
  Outputs out;
  for (size_t k = 0; k < reqs.size(); ++k)
    for (int s = 0; s < reqs[k].n; ++s) {
      const SampleEvent& ev = got[{ids[k], s}];
      out.finals.push_back(ev);
      std::vector<int32_t> seq = reqs[k].input_ids;
      for (const auto& t : ev.output) seq.push_back(t.id);
      out.sequences.push_back(std::move(seq));
    }
  return out;
}

bool same_f(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same(const Outputs& a, const Outputs& b, const std::string& what) {
  ASSERT_EQ(a.finals.size(), b.finals.size()) << what;
  for (size_t i = 0; i < a.finals.size(); ++i) {
    const SampleEvent& x = a.finals[i];
    const SampleEvent& y = b.finals[i];
    ASSERT_EQ(x.output.size(), y.output.size()) << what << " sample " << i;
    for (size_t k = 0; k < x.output.size(); ++k) {
      const TokenOutput& p = x.output[k];
      const TokenOutput& q = y.output[k];
      ASSERT_EQ(p.id, q.id) << what << " sample " << i << " token " << k;
      EXPECT_TRUE(same_f(p.logprob, q.logprob) && same_f(p.raw_logprob, q.raw_logprob) &&
                  same_f(p.tempered_logprob, q.tempered_logprob))
          << what << " sample " << i << " token " << k;
      EXPECT_EQ(p.weight_version, q.weight_version);
      ASSERT_EQ(p.top.size(), q.top.size());
      for (size_t j = 0; j < p.top.size(); ++j)
        EXPECT_TRUE(p.top[j].id == q.top[j].id && same_f(p.top[j].logprob, q.top[j].logprob));
      ASSERT_EQ(p.ids.size(), q.ids.size());
      for (size_t j = 0; j < p.ids.size(); ++j)
        EXPECT_TRUE(p.ids[j].id == q.ids[j].id && same_f(p.ids[j].logprob, q.ids[j].logprob));
    }
    EXPECT_EQ(x.finish_reason, y.finish_reason) << what << " sample " << i;
    EXPECT_EQ(x.matched_stop, y.matched_stop) << what << " sample " << i;
    EXPECT_EQ(x.cached_tokens, y.cached_tokens) << what << " sample " << i;
    EXPECT_EQ(x.routed_experts, y.routed_experts) << what << " sample " << i;
    ASSERT_EQ(x.input_logprobs.size(), y.input_logprobs.size());
    for (size_t k = 0; k < x.input_logprobs.size(); ++k)
      EXPECT_TRUE(
          same_f(x.input_logprobs[k].logprob, y.input_logprobs[k].logprob) ||
          (std::isnan(x.input_logprobs[k].logprob) && std::isnan(y.input_logprobs[k].logprob)));
  }
}

// The reference's outputs as test::Finals, for test::OracleDrafter.
test::Finals as_finals(const Outputs& r) {
  test::Finals f;
  for (size_t i = 0; i < r.finals.size(); ++i) f.by_sample[{i, 0}] = r.finals[i];
  return f;
}

// Two waves: the batch, then requests continuing the first wave's sequences (their whole blocks
// come from the prefix cache the first wave filled).
std::vector<GenerateRequest> second_wave(const Outputs& first, const Sampling& sp) {
  std::vector<GenerateRequest> out;
  for (size_t i = 0; i < first.sequences.size(); i += 5) {
    GenerateRequest r;
    r.input_ids = first.sequences[i];
    if (r.input_ids.size() + 12 > 256) continue;
    r.sampling.temperature = sp.temperature;
    r.sampling.top_p = sp.top_p;
    r.sampling.top_k = sp.top_k;
    r.sampling.seed = 77 + i;
    r.max_new_tokens = 12;
    out.push_back(std::move(r));
  }
  return out;
}

const EngineOptions kOptions{.num_blocks = 2048, .block_tokens = 8, .max_batch_tokens = 256};

enum class DraftKind { kOracleRight, kOracleWrongEvery3, kSuffix };
const char* kind_name(DraftKind k) {
  return k == DraftKind::kOracleRight         ? "oracle"
         : k == DraftKind::kOracleWrongEvery3 ? "oracle, every 3rd wrong"
                                              : "suffix";
}

class SpeculativeEngine : public ::testing::TestWithParam<const char*> {};

TEST_P(SpeculativeEngine, SameBitsAsPlainDecodingAtBatch1To64) {
  auto model = load(GetParam());
  const int64_t context = model->config().max_position_embeddings;
  ThreadPool pool(2);
  for (const Sampling& sp : {kGreedy, kTopP, kTopK})
    for (int batch : {1, 8, 64}) {
      const auto reqs = make_requests(batch, sp, 11 + batch, context);
      Engine plain_engine(make_model_runner(model, &pool), kOptions);
      const Outputs plain = generate_all(plain_engine, reqs);
      const Outputs plain2 = generate_all(plain_engine, second_wave(plain, sp));
      for (DraftKind kind :
           {DraftKind::kOracleRight, DraftKind::kOracleWrongEvery3, DraftKind::kSuffix}) {
        const std::string what = std::string(GetParam()) + ", " + sp.name + ", batch " +
                                 std::to_string(batch) + ", " + kind_name(kind);
        Engine spec(make_model_runner(model, &pool), test::speculative(kOptions));
        if (kind != DraftKind::kSuffix) {
          test::Finals all = as_finals(plain);
          spec.set_drafter(std::make_unique<test::OracleDrafter>(
              all, kind == DraftKind::kOracleRight ? 0 : 3, 1024));
        }
        expect_same(plain, generate_all(spec, reqs), what);
        expect_same(plain2, generate_all(spec, second_wave(plain, sp)), what + ", second wave");
        const EngineStats s = spec.stats(), p = plain_engine.stats();
        EXPECT_EQ(s.free_blocks, p.free_blocks) << what;
        EXPECT_EQ(s.cached_blocks, p.cached_blocks) << what;
        EXPECT_EQ(s.generated_tokens, p.generated_tokens) << what;
        if (kind != DraftKind::kSuffix) {
          // Drafts ran: accepted ones save iterations; wrong ones were rejected.
          EXPECT_GT(s.spec_accepted_tokens, 0u) << what;
          EXPECT_LT(s.iterations, p.iterations) << what;
          if (kind == DraftKind::kOracleWrongEvery3)
            EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << what;
        }
        // Each verify emits its accepted drafts and at most one token of its own.
        EXPECT_GE(s.spec_emitted_tokens, s.spec_accepted_tokens) << what;
        EXPECT_LE(s.spec_emitted_tokens, s.spec_accepted_tokens + s.spec_verifies) << what;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeEngine,
                         ::testing::Values("llama", "mistral", "qwen3_moe", "deepseek_v3"));

// The co-trained draft head as the engine's drafter (make_head_drafter): fitted here to the
// model's own distribution on the plain run's sequences (as the trainer would, through
// DraftHead::accumulate_grad and AdamW), it drafts from the engine's hidden states — prefills,
// GRPO siblings forked from their leader, the prefix cache's second wave — and the samples are
// the plain engine's bits whatever it proposes; once trained, greedy decoding accepts its drafts.
TEST(SpeculativeEngine, DraftHeadDrafterGivesThePlainBitsAndIsAcceptedOnceTrained) {
  auto files = load_model_files(test::data_dir() + "/models/llama");
  ASSERT_TRUE(files.ok()) << files.message();
  auto model = load("llama");
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  const auto reqs = make_requests(16, kGreedy, 41, c.max_position_embeddings);
  Engine plain_engine(make_model_runner(model, &pool), kOptions);
  const Outputs plain = generate_all(plain_engine, reqs);
  const Outputs plain2 = generate_all(plain_engine, second_wave(plain, kGreedy));

  // Fit the head: its vocabulary the ids of the plain sequences, 300 AdamW steps on them.
  std::vector<uint64_t> counts(static_cast<size_t>(c.vocab_size), 0);
  std::vector<int32_t> tokens;
  std::vector<SeqSpan> seqs;
  for (const auto& q : plain.sequences) {
    if (q.size() < 2 || q.size() > 128) continue;
    for (int32_t id : q) ++counts[static_cast<size_t>(id)];
    seqs.push_back({static_cast<int32_t>(seqs.size()), 0, static_cast<int64_t>(q.size())});
    tokens.insert(tokens.end(), q.begin(), q.end());
  }
  auto created = DraftHead::create(c, files->weights, top_ids(counts, 256));
  ASSERT_TRUE(created.ok()) << created.message();
  std::shared_ptr<DraftHead> head = std::move(created).value();
  auto kv = model->make_kv_cache();
  ForwardOptions fo;
  fo.return_hidden = true;
  auto f = model->forward(tokens, seqs, *kv, fo, &pool);
  ASSERT_TRUE(f.ok()) << f.message();
  const std::vector<float> weight(tokens.size(), 1.0f);
  const DraftTrainRows rows{tokens, seqs, f->hidden, f->logits, weight};
  FlatTensors params = head->params();
  AdamW opt(params.layout_ptr(), AdamWConfig{.clip_grad_norm = 0});
  double first = 0, last = 0;
  for (int it = 0; it < 300; ++it) {
    FlatTensors grads(params.layout_ptr());
    auto sums = head->accumulate_grad(rows, 1.0 / static_cast<double>(tokens.size()), grads, &pool);
    ASSERT_TRUE(sums.ok()) << sums.message();
    (it == 0 ? first : last) = sums->agree / sums->rows;
    opt.step(params, grads, 3e-3);
    ASSERT_TRUE(head->set_params(params).ok());
  }
  EXPECT_GT(last, first + 0.2) << "the head learned the model's greedy choices";

  Engine spec(make_model_runner(model, &pool), test::speculative(kOptions));
  spec.set_drafter(make_head_drafter(head, &pool));
  expect_same(plain, generate_all(spec, reqs), "draft head");
  expect_same(plain2, generate_all(spec, second_wave(plain, kGreedy)), "draft head, second wave");
  const EngineStats s = spec.stats(), p = plain_engine.stats();
  EXPECT_EQ(s.free_blocks, p.free_blocks);
  EXPECT_EQ(s.cached_blocks, p.cached_blocks);
  EXPECT_GT(s.spec_accepted_tokens, s.spec_draft_tokens / 4) << s.spec_draft_tokens;
  EXPECT_LT(s.iterations, p.iterations);
  // Sampled decoding too (t = 1, top-p): the bits hold whatever is accepted.
  const auto sampled = make_requests(16, kTopP, 43, c.max_position_embeddings);
  Engine plain_t(make_model_runner(model, &pool), kOptions);
  Engine spec_t(make_model_runner(model, &pool), test::speculative(kOptions));
  auto head_t = make_head_drafter(head, &pool);
  HeadDrafter* scores = head_t.get();
  spec_t.set_drafter(std::move(head_t));
  expect_same(generate_all(plain_t, sampled), generate_all(spec_t, sampled), "draft head, t=1");
  EXPECT_GT(spec_t.stats().spec_draft_tokens, 0u);
  // Each way of drafting a sampled position (argmax, coupled draws) was scored against the tokens
  // that landed; the proposed one is among them.
  const HeadDrafterStats hs = scores->stats();
  EXPECT_GT(hs.scored, 20u);
  for (const uint64_t h : hs.hits) EXPECT_LE(h, hs.scored);
  EXPECT_GT(hs.hits[0] + hs.hits[1] + hs.hits[2], 0u);
}

// A drafter with the target's own distribution: the model itself run over the sample's tokens,
// each draft drawn as the sampler will draw it (sample_token with the query's params and uniform
// number step + j), or, with `shift`, with the uniform number of another position.
class SelfDrafter final : public Drafter {
 public:
  SelfDrafter(std::shared_ptr<const Model> model, ThreadPool* pool, int64_t shift)
      : model_(std::move(model)), pool_(pool), shift_(shift) {}
  Draft propose(const DraftQuery& q) override {
    Draft d;
    std::vector<int32_t> seq(q.tokens.begin(), q.tokens.end());
    const int64_t vocab = model_->config().vocab_size;
    for (int64_t j = 0; j < q.max_tokens; ++j) {
      auto kv = model_->make_kv_cache();
      const SeqSpan s{0, 0, static_cast<int64_t>(seq.size())};
      ForwardOptions fo;
      fo.all_logits = false;
      auto f = model_->forward(seq, {&s, 1}, *kv, fo, pool_);
      EXPECT_TRUE(f.ok()) << f.message();
      if (!f.ok()) break;
      const SampleResult r = sample_token(std::span<const float>(f->logits).first(vocab),
                                          q.sampling, static_cast<uint64_t>(q.step + j + shift_));
      d.tokens.push_back(r.token);
      d.confidence.push_back(0.9f);
      seq.push_back(r.token);
    }
    return d;
  }

 private:
  std::shared_ptr<const Model> model_;
  ThreadPool* pool_;
  int64_t shift_;
};

// Coupled drafting (DraftQuery::sampling and step): a drafter that knows the target's distribution
// and draws with the target's uniform numbers proposes exactly the tokens sampling at temperature 1
// (with top-p, top-k) will draw, so every draft is accepted — where proposing a fixed token, as
// any drafter without the uniform number must, is accepted with the target's probability of it.
// Drawing with the uniform number of the wrong position gets far fewer accepted.
TEST(SpeculativeEngine, CoupledDraftsOfTheTargetsOwnDistributionAreAllAccepted) {
  auto model = load("llama");
  ThreadPool pool(2);
  for (const Sampling& sp : {kTopP, kTopK, Sampling{"t=0.8", 0.8f, 1.0f, 0}}) {
    std::vector<GenerateRequest> reqs;
    std::mt19937 rng(5);
    for (int i = 0; i < 8; ++i) {
      GenerateRequest r;
      for (int k = 0; k < 5 + i; ++k) r.input_ids.push_back(static_cast<int32_t>(rng() % 1024));
      r.sampling.temperature = sp.temperature;
      r.sampling.top_p = sp.top_p;
      r.sampling.top_k = sp.top_k;
      r.sampling.seed = rng();
      r.max_new_tokens = 12 + i;
      if (i % 3 == 0) r.n = 3;
      reqs.push_back(std::move(r));
    }
    Engine plain(make_model_runner(model, &pool), kOptions);
    const Outputs want = generate_all(plain, reqs);
    for (const int64_t shift : {0, 1}) {
      const std::string what = std::string(sp.name) + ", shift " + std::to_string(shift);
      Engine spec(make_model_runner(model, &pool), test::speculative(kOptions));
      spec.set_drafter(std::make_unique<SelfDrafter>(model, &pool, shift));
      expect_same(want, generate_all(spec, reqs), what);
      const EngineStats s = spec.stats();
      ASSERT_GT(s.spec_draft_tokens, 100u) << what;
      if (shift == 0) {
        EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens) << what;
        EXPECT_LT(s.iterations, plain.stats().iterations / 3) << what;
      } else {
        EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens / 2) << what;
      }
    }
  }
}

// The prefix cache shortens a later sample's prefill of a prompt: the head drafter gives it the
// target's states of the cached positions from an earlier sample of the same prompt, so it drafts
// exactly what a sample with the whole prefill drafts (without them it reads less context, and its
// confidences differ).
TEST(HeadDrafter, ASampleWhosePrefillTheCacheShortenedReadsTheWholePrompt) {
  auto files = load_model_files(test::data_dir() + "/models/llama");
  ASSERT_TRUE(files.ok()) << files.message();
  auto model = load("llama");
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % 500));
  auto kv = model->make_kv_cache();
  ForwardOptions fo;
  fo.return_hidden = true;
  const SeqSpan seq{0, 0, static_cast<int64_t>(prompt.size())};
  auto f = model->forward(prompt, {&seq, 1}, *kv, fo, &pool);
  ASSERT_TRUE(f.ok()) << f.message();
  std::vector<uint64_t> counts(static_cast<size_t>(c.vocab_size), 1);
  auto head = DraftHead::create(c, files->weights, top_ids(counts, 128));
  ASSERT_TRUE(head.ok()) << head.message();
  const std::shared_ptr<const DraftHead> shared = std::move(head).value();
  const int64_t d = c.hidden_size, cached = 32;
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(7);  // the first sampled token
  const auto draft = [&](Drafter& dr, uint64_t sample, int64_t first) {
    dr.hidden(sample, first, std::span<const float>(f->hidden).subspan(first * d));
    DraftQuery q;
    q.tokens = tokens;
    q.prompt_len = static_cast<int64_t>(prompt.size());
    q.max_tokens = 4;
    q.sample = sample;
    return dr.propose_all({&q, 1})[0];
  };
  HeadDrafterOptions o;
  o.min_confidence = 0;
  auto drafter = make_head_drafter(shared, &pool, o);
  const Draft whole = draft(*drafter, 1, 0);
  const Draft shortened = draft(*drafter, 2, cached);
  ASSERT_EQ(whole.tokens.size(), 4u);
  EXPECT_EQ(shortened.tokens, whole.tokens);
  EXPECT_EQ(shortened.confidence, whole.confidence);
  auto alone = make_head_drafter(shared, &pool, o);  // no earlier sample of the prompt
  EXPECT_NE(draft(*alone, 2, cached).confidence, whole.confidence);
}

// RL recycles prompts: the second epoch of the same greedy requests gets the first epoch's
// responses proposed by the suffix drafter, and accepted (greedy siblings are identical and in
// lockstep, so within an epoch they have nothing ahead to propose).
TEST(SpeculativeEngine, SuffixDrafterReusesAnEarlierEpochsResponses) {
  auto model = load("llama");
  ThreadPool pool(2);
  std::vector<GenerateRequest> reqs =
      make_requests(8, kGreedy, 5, model->config().max_position_embeddings);
  reqs.erase(reqs.begin() + 2);  // not the one at the context's edge
  for (auto& r : reqs) r.max_new_tokens = 40;
  Engine plain_engine(make_model_runner(model, &pool), kOptions);
  Engine spec(make_model_runner(model, &pool), test::speculative(kOptions));
  const Outputs first = generate_all(plain_engine, reqs);
  expect_same(first, generate_all(spec, reqs), "suffix, epoch 1");
  const EngineStats s1 = spec.stats(), p1 = plain_engine.stats();
  expect_same(generate_all(plain_engine, reqs), generate_all(spec, reqs), "suffix, epoch 2");
  const EngineStats s2 = spec.stats(), p2 = plain_engine.stats();
  const uint64_t generated = s2.generated_tokens - s1.generated_tokens;
  EXPECT_GT(s2.spec_accepted_tokens - s1.spec_accepted_tokens, generated / 2);
  EXPECT_LT(s2.iterations - s1.iterations, (p2.iterations - p1.iterations) / 2);
}

// An in-place pause with a weight update, and a retracting pause, in the middle of a sample:
// the tokens after it are what plain decoding draws with the new weights from the same token on.
TEST(SpeculativeEngine, WeightUpdateMidSequenceMatchesPlainAtTheSameToken) {
  auto files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(files.ok()) << files.message();
  ThreadPool pool(2);
  const FlatTensors next = test::nudged_weights(*files);
  for (PauseMode mode : {PauseMode::kInPlace, PauseMode::kRetract}) {
    GenerateRequest r;
    for (int k = 0; k < 13; ++k) r.input_ids.push_back(k * 37 % 1024);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 9;
    r.max_new_tokens = 30;
    // The plain rollout without an update, as the oracle's answers.
    Engine ref(test::one_process_runner(*files, &pool), kOptions);
    const Outputs whole = generate_all(ref, {r});
    // Steps until `*at` tokens (the speculative run: at least 8, and records where it stopped),
    // updates the weights there, and finishes.
    auto drive = [&](Engine& e, int64_t* at, Outputs* got) {
      std::vector<TokenOutput> out;
      SampleEvent fin;
      ASSERT_TRUE(e.submit(r, [&](const SampleEvent& ev) {
                     out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
                     if (ev.finished) fin = ev;
                   }).ok());
      while (static_cast<int64_t>(out.size()) < (*at < 0 ? 8 : *at)) ASSERT_TRUE(e.step());
      if (*at < 0) *at = static_cast<int64_t>(out.size());
      ASSERT_EQ(static_cast<int64_t>(out.size()), *at);
      e.pause(mode);
      ASSERT_TRUE(e.begin_weight_update().ok());
      ASSERT_TRUE(e.update_weights(next.as_tensor_map()).ok());
      ASSERT_TRUE(e.end_weight_update().ok());
      e.update_weight_version(1);
      e.resume();
      for (int i = 0; i < 1000 && !e.idle(); ++i) e.step();
      ASSERT_TRUE(e.idle());
      got->finals.push_back(fin);
    };
    int64_t at = -1;
    Engine spec(test::one_process_runner(*files, &pool), test::speculative(kOptions));
    spec.set_drafter(std::make_unique<test::OracleDrafter>(as_finals(whole), 0, 1024));
    Outputs a, b;
    drive(spec, &at, &a);
    Engine plain_engine(test::one_process_runner(*files, &pool), kOptions);
    drive(plain_engine, &at, &b);
    ASSERT_EQ(a.finals.size(), 1u);
    ASSERT_EQ(b.finals.size(), 1u);
    ASSERT_GE(at, 8);
    ASSERT_GT(static_cast<int64_t>(a.finals[0].output.size()), at);
    expect_same(b, a, mode == PauseMode::kInPlace ? "in place" : "retract");
    EXPECT_EQ(a.finals[0].output[at].weight_version, 1);
    EXPECT_EQ(a.finals[0].output[at - 1].weight_version, 0);
    EXPECT_GT(spec.stats().spec_accepted_tokens, 0u);
  }
}

// Blocks that hold only rejected positions go back to the pool in the same iteration: after every
// step a sample holds exactly the blocks of its prompt and output so far (16 drafts of 4-position
// blocks span several blocks; no prefix cache holding any).
TEST(SpeculativeEngine, RejectedPositionsFreeTheirBlocksAtOnce) {
  auto model = load("qwen3_moe");
  ThreadPool pool(2);
  GenerateRequest r;
  for (int k = 0; k < 9; ++k) r.input_ids.push_back(k * 101 % 1024);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 3;
  r.max_new_tokens = 60;
  EngineOptions eo{.num_blocks = 64, .block_tokens = 4, .max_batch_tokens = 256};
  eo.enable_prefix_cache = false;
  Engine plain_engine(make_model_runner(model, &pool), eo);
  const Outputs plain = generate_all(plain_engine, {r});
  Engine spec(make_model_runner(model, &pool), test::speculative(eo, 16));
  spec.set_drafter(std::make_unique<test::OracleDrafter>(as_finals(plain), 5, 1024));
  int64_t out = 0;
  ASSERT_TRUE(
      spec.submit(r,
                  [&](const SampleEvent& e) { out += static_cast<int64_t>(e.new_tokens.size()); })
          .ok());
  int64_t checked = 0;
  while (spec.step()) {
    if (out == r.max_new_tokens) break;
    const int64_t positions = static_cast<int64_t>(r.input_ids.size()) + out;  // + the next
    EXPECT_EQ(spec.stats().free_blocks, 64 - (positions + 3) / 4) << "after " << out << " tokens";
    ++checked;
  }
  EXPECT_GT(checked, 3);
  EXPECT_GT(spec.stats().spec_draft_tokens, spec.stats().spec_accepted_tokens);
  for (int i = 0; i < 100 && !spec.idle(); ++i) spec.step();
  EXPECT_EQ(spec.stats().free_blocks, 64);
}

// --- the suffix drafter -------------------------------------------------------------------------

TEST(SuffixDrafter, ProposesASiblingsContinuationAndAnEarlierResponse) {
  auto d = make_suffix_drafter({});
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  const std::vector<int32_t> sibling = {1, 2, 3, 4, 10, 11, 12, 13, 14};
  std::vector<int32_t> mine = {1, 2, 3, 4, 10, 11};
  DraftQuery q{mine, 4, prompt_key(prompt), {sibling}, 3};
  Draft got = d->propose(q);
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{12, 13, 14}));
  ASSERT_EQ(got.confidence.size(), 3u);
  for (float c : got.confidence) EXPECT_TRUE(c > 0 && c <= 1);
  // No sibling: nothing to match beyond the prompt, until a response to this prompt is kept.
  q.siblings.clear();
  EXPECT_TRUE(d->propose(q).tokens.empty());
  d->observe(prompt, std::vector<int32_t>{10, 11, 20, 21});
  EXPECT_EQ(d->propose(q).tokens, (std::vector<int32_t>{20, 21}));
  // At the start of the output the prompt's end matches the kept response's start.
  std::vector<int32_t> fresh = prompt;
  q.tokens = fresh;
  EXPECT_EQ(d->propose(q).tokens, (std::vector<int32_t>{10, 11, 20}));
  // Another prompt with the same tail sees nothing of it.
  const std::vector<int32_t> other = {9, 3, 4};
  EXPECT_TRUE(d->propose({other, 3, prompt_key(other), {}, 3}).tokens.empty());
}

TEST(SuffixDrafter, MajorityOfTheLongestMatchesAndItsOwnRepeats) {
  auto d = make_suffix_drafter({});
  // Own tokens repeat "5 6 7 8": after "5 6" comes "7 8 5 6".
  const std::vector<int32_t> loop = {5, 6, 7, 8, 5, 6, 7, 8, 5, 6};
  Draft got = d->propose({loop, 1, prompt_key(std::span(loop).first(1)), {}, 4});
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{7, 8, 5, 6}));
  // Three siblings continue "x 1 2" with 3, one with 4: 3 wins, with more confidence than a lone
  // vote would give.
  const std::vector<int32_t> p = {100};
  std::vector<std::vector<int32_t>> sibs = {
      {100, 1, 2, 3}, {100, 1, 2, 3}, {100, 1, 2, 4}, {100, 1, 2, 3}};
  std::vector<std::span<const int32_t>> spans(sibs.begin(), sibs.end());
  const std::vector<int32_t> mine = {100, 1, 2};
  got = d->propose({mine, 1, prompt_key(p), spans, 1});
  ASSERT_EQ(got.tokens, (std::vector<int32_t>{3}));
  const float majority = got.confidence[0];
  got = d->propose({mine, 1, prompt_key(p), {spans[2]}, 1});
  ASSERT_EQ(got.tokens, (std::vector<int32_t>{4}));
  EXPECT_GT(majority, got.confidence[0]);
}

TEST(SuffixDrafter, HistoryIsBoundedPerPromptAndInPrompts) {
  SuffixDrafterOptions o;
  o.history_prompts = 2;
  o.history_per_prompt = 1;
  auto d = make_suffix_drafter(o);
  auto prompt = [](int32_t x) { return std::vector<int32_t>{x, x + 1}; };
  d->observe(prompt(10), std::vector<int32_t>{50, 51});
  d->observe(prompt(10), std::vector<int32_t>{60, 61});  // replaces 50 51
  auto ask = [&](int32_t x) {
    const auto p = prompt(x);
    return d->propose({p, 2, prompt_key(p), {}, 2}).tokens;
  };
  EXPECT_EQ(ask(10), (std::vector<int32_t>{60, 61}));
  d->observe(prompt(20), std::vector<int32_t>{70});
  d->observe(prompt(30), std::vector<int32_t>{80});  // the least recent prompt (10) goes
  EXPECT_TRUE(ask(10).empty());
  EXPECT_EQ(ask(20), (std::vector<int32_t>{70}));
  EXPECT_EQ(ask(30), (std::vector<int32_t>{80}));
}

// --- the adaptive policy ------------------------------------------------------------------------

TEST(SpecPolicy, CostModelInterpolatesAndHoldsFlatPastWhatItMeasured) {
  rollout::ForwardCostModel m;
  EXPECT_FALSE(m.estimate(4).has_value());
  m.observe(1, 1.0);
  m.observe(16, 2.5);
  EXPECT_DOUBLE_EQ(*m.estimate(1), 1.0);
  EXPECT_NEAR(*m.estimate(6), 1.5, 1e-9);
  EXPECT_DOUBLE_EQ(*m.estimate(64), 2.5);  // optimistic past the largest measured
  m.observe(16, 4.5);                      // moving average
  EXPECT_NEAR(*m.estimate(16), 3.0, 1e-9);
}

// Asking the drafter pays when the plan's gain covers the drafter's time; a costly drafter whose
// drafts are not taken, or gain too little, does not (the engine then stops asking for a while).
TEST(SpecPolicy, DraftingPaysOnlyWhenItsGainCoversTheDraftersTime) {
  rollout::ForwardCostModel flat;
  flat.observe(2, 1.0);
  flat.observe(64, 1.0);
  const std::vector<std::vector<float>> chances = {{0.9f, 0.8f}, {0.6f}};
  const std::vector<int64_t> all{2, 1}, none{0, 0};
  // 2 decodes → 2 + 2.3 expected tokens per second of forward: pays unless drafting costs ≥ 1.15 s.
  EXPECT_TRUE(rollout::drafting_pays(flat, 2, 2, chances, all, 0.001));
  EXPECT_TRUE(rollout::drafting_pays(flat, 2, 2, chances, all, 1.0));
  EXPECT_FALSE(rollout::drafting_pays(flat, 2, 2, chances, all, 1.2));
  // Nothing taken: pays only if drafting was (almost) free.
  EXPECT_TRUE(rollout::drafting_pays(flat, 2, 2, chances, none, 0.01));
  EXPECT_FALSE(rollout::drafting_pays(flat, 2, 2, chances, none, 0.05));
  // Nothing measured yet: no verdict against the drafter.
  EXPECT_TRUE(rollout::drafting_pays(rollout::ForwardCostModel{}, 2, 2, chances, none, 5.0));
}

TEST(SpecPolicy, DraftsWhereForwardsAreFlatAndNotWhereTheyAreLinear) {
  const std::vector<std::vector<float>> chances = {{0.9f, 0.8f, 0.5f, 0.1f}, {0.6f, 0.2f}};
  // Memory-bound: a forward of 1..64 tokens costs the same: every draft pays.
  rollout::ForwardCostModel flat;
  flat.observe(2, 1.0);
  flat.observe(64, 1.0);
  EXPECT_EQ(rollout::plan_drafts(flat, 2, 2, chances, 100, true), (std::vector<int64_t>{4, 2}));
  // The budget caps the count, best chances first.
  EXPECT_EQ(rollout::plan_drafts(flat, 2, 2, chances, 3, true), (std::vector<int64_t>{2, 1}));
  // Compute-bound: cost proportional to tokens: a draft pays only if accepted for sure.
  rollout::ForwardCostModel linear;
  for (int n : {1, 2, 4, 8, 16, 32}) linear.observe(n, 0.01 * n);
  EXPECT_EQ(rollout::plan_drafts(linear, 2, 2, chances, 100, true), (std::vector<int64_t>{0, 0}));
  // Not adaptive: everything within the budget.
  EXPECT_EQ(rollout::plan_drafts(linear, 2, 2, chances, 100, false), (std::vector<int64_t>{4, 2}));
  // A cost that grows by half a decode per token: only the likeliest drafts pay.
  rollout::ForwardCostModel mixed;
  for (int n : {1, 2, 4, 8, 16}) mixed.observe(n, 1.0 + 0.5 * n);
  const auto some = rollout::plan_drafts(mixed, 2, 2, chances, 100, true);
  EXPECT_GE(some[0], 1);
  EXPECT_LT(some[0] + some[1], 6);
}

}  // namespace
}  // namespace miles
