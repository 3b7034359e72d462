// The micro-batch gradient sum fused into the backward (include/miles/grad_sink.h, BackwardIo::fold):
// folding each micro-batch's gradients into the pending partial sums as the backward stores them
// gives the bits of computing every micro-batch's gradients apart and adding them by the halving
// tree afterwards — for every tensor (GEMM-stored weights, norms, the embedding's scatter, MoE
// experts no token chose) and the tied head's share, for 1 to 7 micro-batches.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "random_vec.h"
#include "test_paths.h"

namespace miles {
namespace {

struct Grads {
  FlatTensors g;
  std::vector<float> tied;  // the tied head's share (tied models only)
};

struct MicroBatch {
  std::vector<int32_t> tokens;
  std::vector<SeqSpan> seqs;
  std::vector<float> dlogits;
};

class Fixture {
 public:
  explicit Fixture(const std::string& name) {
    const std::string dir = test::data_dir() + "/models/" + name;
    auto cfg = load_model_config(dir + "/config.json");
    EXPECT_TRUE(cfg.ok()) << cfg.message();
    config_ = *cfg;
    auto w = read_hf_weights(dir);
    EXPECT_TRUE(w.ok()) << w.message();
    weights_ = std::move(*w);
    auto m = Model::from_weights(config_, weights_);
    EXPECT_TRUE(m.ok()) << m.message();
    model_ = std::move(*m);
    layout_ = ParamLayout::for_model(config_, &weights_);
  }

  // Micro-batch i: two sequences of 3–17 tokens and random d logits.
  MicroBatch micro_batch(int i) const {
    MicroBatch b;
    const std::vector<float> r = test::random_vec(64, 1000 + i);
    for (int s = 0; s < 2; ++s) {
      const int64_t n = 3 + static_cast<int64_t>((r[s] + 1.0f) * 7.0f);
      b.seqs.push_back({s, 0, n});
      for (int64_t j = 0; j < n; ++j)
        b.tokens.push_back(static_cast<int32_t>((r[2 + (j + 5 * s) % 60] + 1.0f) * 0.5f *
                                                (config_.vocab_size - 1)));
    }
    b.dlogits = test::random_vec(b.tokens.size() * config_.vocab_size, 2000 + i);
    return b;
  }

  Grads empty() const {
    Grads g{FlatTensors(layout_), {}};
    if (config_.tie_word_embeddings)
      g.tied.assign(static_cast<size_t>(config_.vocab_size * config_.hidden_size), 0.0f);
    return g;
  }

  // Micro-batch i's backward into `out`, folded into `fold` (innermost first) when non-empty.
  void backward(int i, Grads& out, const std::vector<Grads*>& fold, ThreadPool* pool) const {
    const MicroBatch b = micro_batch(i);
    auto kv = model_->make_kv_cache();
    ForwardTape tape;
    ForwardOptions opt;
    opt.tape = &tape;
    auto f = model_->forward(b.tokens, b.seqs, *kv, opt, pool);
    ASSERT_TRUE(f.ok()) << f.message();
    BackwardIo io;
    io.tied_head_grad = out.tied;
    for (Grads* l : fold) {
      io.fold.push_back(&l->g);
      if (!l->tied.empty()) io.tied_fold.push_back(l->tied);
    }
    const Status s = model_->backward(tape, b.dlogits, out.g, pool, io);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  const ModelConfig& config() const { return config_; }
  const Model& model() const { return *model_; }

 private:
  ModelConfig config_;
  TensorMap weights_;
  std::unique_ptr<Model> model_;
  std::shared_ptr<const ParamLayout> layout_;
};

// The reference: each micro-batch apart, then a + b by the halving tree (split [lo, hi) at
// lo + ceil((hi - lo) / 2)), written out here.
Grads tree_of_separate(const Fixture& fx, int lo, int hi, ThreadPool* pool) {
  if (hi - lo == 1) {
    Grads g = fx.empty();
    fx.backward(lo, g, {}, pool);
    return g;
  }
  const int mid = lo + (hi - lo + 1) / 2;
  Grads a = tree_of_separate(fx, lo, mid, pool);
  const Grads b = tree_of_separate(fx, mid, hi, pool);
  std::span<float> ga = a.g.all();
  std::span<const float> gb = b.g.all();
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = ga[i] + gb[i];
  for (size_t i = 0; i < a.tied.size(); ++i) a.tied[i] = a.tied[i] + b.tied[i];
  return a;
}

// The same tree walked as the trainer walks it: leaves in order, each folded into the pending sums
// of the merges that follow it.
void merges_of(int lo, int hi, std::vector<int>& merges) {
  if (hi - lo == 1) {
    merges.push_back(0);
    return;
  }
  const int mid = lo + (hi - lo + 1) / 2;
  merges_of(lo, mid, merges);
  merges_of(mid, hi, merges);
  ++merges.back();
}

Grads folded(const Fixture& fx, int n, ThreadPool* pool) {
  std::vector<int> merges;
  merges_of(0, n, merges);
  std::vector<std::unique_ptr<Grads>> stack;
  for (int i = 0; i < n; ++i) {
    const int m = merges[i];
    std::vector<Grads*> fold;
    for (int j = 0; j < m; ++j) fold.push_back(stack[stack.size() - 1 - j].get());
    auto leaf = std::make_unique<Grads>(fx.empty());
    // Scratch that is not zero: a sink that leaned on zero-filled buffers would show.
    for (float& x : leaf->g.all()) x = 7.0f;
    for (float& x : leaf->tied) x = 7.0f;
    fx.backward(i, *leaf, fold, pool);
    if (m == 0) {
      stack.push_back(std::move(leaf));
    } else {
      stack.resize(stack.size() - (m - 1));
    }
  }
  EXPECT_EQ(stack.size(), 1u);
  return std::move(*stack.back());
}

void expect_same_bits(const Grads& want, const Grads& got, const std::string& what) {
  for (const ParamSpec& s : want.g.layout().specs()) {
    std::span<const float> a = want.g.get(s.name), b = got.g.get(s.name);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
        << what << " " << s.name;
  }
  ASSERT_EQ(want.tied.size(), got.tied.size());
  EXPECT_EQ(0, std::memcmp(want.tied.data(), got.tied.data(), want.tied.size() * sizeof(float)))
      << what << " tied head share";
}

class GradFold : public ::testing::TestWithParam<std::string> {};

TEST_P(GradFold, FoldedMicroBatchesAreTheTreeOfSeparateGradients) {
  const Fixture fx(GetParam());
  ThreadPool pool(2);
  for (int n = 1; n <= 7; ++n) {
    const Grads want = tree_of_separate(fx, 0, n, &pool);
    const Grads got = folded(fx, n, &pool);
    expect_same_bits(want, got, GetParam() + ", " + std::to_string(n) + " micro-batches:");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GradFold,
                         ::testing::Values("llama", "llama_tied", "qwen3_moe", "qwen3"));

TEST(GradFold, MismatchedFoldBuffersAreRejected) {
  const Fixture fx("llama_tied");
  const MicroBatch b = fx.micro_batch(0);
  const Model* m = &fx.model();
  auto kv = m->make_kv_cache();
  ForwardTape tape;
  ForwardOptions opt;
  opt.tape = &tape;
  ASSERT_TRUE(m->forward(b.tokens, b.seqs, *kv, opt, nullptr).ok());
  Grads g = fx.empty();
  std::vector<float> short_tied(g.tied.size() - 1);
  BackwardIo io;
  io.tied_head_grad = g.tied;
  io.tied_fold.push_back(short_tied);
  const Status s = m->backward(tape, b.dlogits, g.g, nullptr, io);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tied share"), std::string::npos) << s.message();
  BackwardIo no_share;
  no_share.tied_fold.push_back(g.tied);
  EXPECT_FALSE(m->backward(tape, b.dlogits, g.g, nullptr, no_share).ok());
}

}  // namespace
}  // namespace miles
