// The scheduler as timelines with a fake model (no weights, no HTTP): which request runs which tokens
// at each iteration under the token budget, chunked prefill, decode priority, max_running, the prefix
// cache, eviction and retraction when blocks run out.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "miles/rollout/engine.h"

namespace miles {
namespace {

// Logits that make token (last input + 1) % vocab the clear favourite; counts forwards.
class FakeRunner final : public ModelRunner {
 public:
  FakeRunner() {
    config_.arch_name = "fake";
    config_.vocab_size = 16;
    config_.hidden_size = 4;
    config_.num_layers = 1;
    config_.num_heads = 1;
    config_.num_kv_heads = 1;
    config_.head_dim = 2;
    config_.max_position_embeddings = 1000;
  }
  const ModelConfig& config() const override { return config_; }
  Result<ForwardOutput> forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                KvStore& kv, const ForwardOptions& options) override {
    ForwardOutput out;
    out.vocab = config_.vocab_size;
    out.rows = static_cast<int64_t>(seqs.size());
    out.logits.assign(out.rows * out.vocab, 0.0f);
    int64_t offset = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<float*> k, v;
      kv.blocks(seqs[s].kv_slot, 0, k, v);  // the engine reserved the positions
      EXPECT_GE(static_cast<int64_t>(k.size()) * kv.block_tokens(), seqs[s].start_pos + seqs[s].n_tokens);
      offset += seqs[s].n_tokens;
      const int32_t last = tokens[offset - 1];
      out.logits[s * out.vocab + (last + 1) % out.vocab] = 30.0f;
    }
    ++forwards;
    return out;
  }
  int forwards = 0;

 private:
  ModelConfig config_;
};

GenerateRequest greedy(std::vector<int32_t> ids, int64_t max_new) {
  GenerateRequest r;
  r.input_ids = std::move(ids);
  r.sampling.temperature = 0;
  r.max_new_tokens = max_new;
  return r;
}

// "A0+8p" = request A, sample 0, 8 tokens of prefill from position 0; "B0@12d" = a decode at 12.
std::string describe(const IterationRecord& rec, const std::map<uint64_t, char>& names) {
  std::ostringstream o;
  for (const auto& it : rec.items) {
    if (o.tellp() > 0) o << " ";
    o << names.at(it.request_id) << it.sample_index
      << (it.prefill ? "+" + std::to_string(it.n_tokens) + "p@" : "d@") << it.start_pos;
  }
  return o.str();
}

std::vector<std::string> run_timeline(Engine& e, const std::map<uint64_t, char>& names) {
  std::vector<std::string> lines;
  while (!e.idle() && lines.size() < 100) {
    if (!e.step()) break;
    lines.push_back(describe(e.last_iteration(), names));
  }
  return lines;
}

TEST(SchedulerTimeline, ChunkedPrefillUnderTheBudgetThenDecodesFirst) {
  Engine e(std::make_unique<FakeRunner>(),
           EngineOptions{.num_blocks = 64, .block_tokens = 4, .max_batch_tokens = 8});
  auto a = e.submit(greedy(std::vector<int32_t>(10, 1), 3), nullptr);
  auto b = e.submit(greedy({2, 3, 4}, 2), nullptr);
  std::map<uint64_t, char> names = {{*a, 'A'}, {*b, 'B'}};
  const std::vector<std::string> want = {
      "A0+8p@0",                // A's first chunk fills the budget
      "A0+2p@8 B0+3p@0",        // A finishes its prefill, B fits in the rest
      "A0d@10 B0d@3",           // decodes
      "A0d@11",                 // B hit max_new_tokens (2) after this step's token
  };
  EXPECT_EQ(run_timeline(e, names), want);
}

TEST(SchedulerTimeline, MaxRunningHoldsNewPrefillsBack) {
  Engine e(std::make_unique<FakeRunner>(),
           EngineOptions{.num_blocks = 64, .block_tokens = 4, .max_batch_tokens = 64,
                         .max_running = 1});
  auto a = e.submit(greedy({1, 2}, 2), nullptr);
  auto b = e.submit(greedy({3, 4}, 1), nullptr);
  std::map<uint64_t, char> names = {{*a, 'A'}, {*b, 'B'}};
  const std::vector<std::string> want = {"A0+2p@0", "A0d@2", "B0+2p@0"};
  EXPECT_EQ(run_timeline(e, names), want);
}

// A group of 64 samples against max_running 8: at most 8 of its samples run at once (the rest
// wait, then prefill from the cache), and a small request submitted while the group runs starts
// at the next iteration, in the reserve of max_running / 8, and finishes in max_new_tokens
// iterations: its latency does not depend on the group's size.
TEST(SchedulerTimeline, ASmallRequestIsNotStarvedByALargeGroup) {
  Engine e(std::make_unique<FakeRunner>(),
           EngineOptions{.num_blocks = 512, .block_tokens = 4, .max_batch_tokens = 64,
                         .max_running = 8});
  GenerateRequest big = greedy({1, 2, 3, 4, 5}, 12);
  big.n = 64;
  std::map<uint64_t, SampleEvent> finals;
  std::vector<SampleEvent> big_finals;
  auto a = e.submit(big, [&](const SampleEvent& ev) {
    if (ev.finished) big_finals.push_back(ev);
  });
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e.step());
  auto b = e.submit(greedy({7, 8}, 3), [&](const SampleEvent& ev) {
    if (ev.finished) finals[ev.request_id] = ev;
  });
  int iterations = 0, most_decoding = 0, b_started = -1;
  while (!e.idle() && iterations < 1000) {
    ASSERT_TRUE(e.step());
    ++iterations;
    int decoding = 0;
    for (const auto& it : e.last_iteration().items) {
      if (!it.prefill) ++decoding;
      if (it.request_id == *b && b_started < 0) b_started = iterations;
    }
    most_decoding = std::max(most_decoding, decoding);
    if (finals.count(*b) && b_started > 0) break;
  }
  EXPECT_EQ(b_started, 1);  // the next iteration
  ASSERT_TRUE(finals.count(*b));
  EXPECT_EQ(iterations, 3);  // prefill (first token), then two decodes
  EXPECT_LE(most_decoding, 8 + 1);  // max_running and its reserve
  while (!e.idle()) e.step();
  ASSERT_EQ(big_finals.size(), 64u);
  for (const SampleEvent& ev : big_finals) {
    ASSERT_EQ(ev.output.size(), 12u);
    for (size_t k = 0; k < ev.output.size(); ++k)  // greedy fake model: 5 + 1 + k, every sample
      EXPECT_EQ(ev.output[k].id, static_cast<int32_t>((6 + k) % 16)) << ev.sample_index;
  }
}

TEST(SchedulerTimeline, PrefixCacheSkipsWholeBlocksAndGroupsPrefillOnce) {
  Engine e(std::make_unique<FakeRunner>(),
           EngineOptions{.num_blocks = 64, .block_tokens = 4, .max_batch_tokens = 64});
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto a = e.submit(greedy(prompt, 1), nullptr);
  std::map<uint64_t, char> names = {{*a, 'A'}};
  EXPECT_EQ(run_timeline(e, names), std::vector<std::string>({"A0+10p@0"}));
  auto b = e.submit(greedy(prompt, 1), nullptr);  // 2 whole blocks cached: prefill from 8
  names[*b] = 'B';
  EXPECT_EQ(run_timeline(e, names), std::vector<std::string>({"B0+2p@8"}));
  GenerateRequest g = greedy({9, 9, 9, 9, 9}, 2);
  g.n = 3;
  auto c = e.submit(g, nullptr);
  names[*c] = 'C';
  EXPECT_EQ(run_timeline(e, names),
            std::vector<std::string>({"C0+5p@0", "C0d@5 C1d@5 C2d@5"}));
}

TEST(SchedulerTimeline, OutOfBlocksEvictsCacheThenRetractsAndStillFinishes) {
  // 6 blocks of 4 positions. A fills the cache tree, then B and C compete for blocks.
  Engine e(std::make_unique<FakeRunner>(),
           EngineOptions{.num_blocks = 6, .block_tokens = 4, .max_batch_tokens = 64});
  std::map<uint64_t, SampleEvent> finals;
  auto listen = [&](const SampleEvent& ev) { if (ev.finished) finals[ev.request_id] = ev; };
  auto a = e.submit(greedy(std::vector<int32_t>(8, 1), 1), listen);
  while (!e.idle()) e.step();
  EXPECT_EQ(e.stats().cached_blocks, 2);
  auto b = e.submit(greedy(std::vector<int32_t>(7, 5), 8), listen);
  auto c = e.submit(greedy(std::vector<int32_t>(7, 6), 8), listen);
  int steps = 0;
  while (!e.idle() && steps++ < 200) e.step();
  ASSERT_TRUE(e.idle());
  ASSERT_EQ(finals.at(*b).output.size(), 8u);
  ASSERT_EQ(finals.at(*c).output.size(), 8u);
  // Greedy fake model: token t is followed by t + 1, retraction or not.
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(finals.at(*b).output[i].id, (6 + static_cast<int>(i)) % 16);
    EXPECT_EQ(finals.at(*c).output[i].id, (7 + static_cast<int>(i)) % 16);
  }
  EXPECT_EQ(finals.at(*a).output.size(), 1u);
  EXPECT_LT(e.stats().cached_blocks, 6);
  EXPECT_GT(e.stats().retractions, 0u);
}

}  // namespace
}  // namespace miles
