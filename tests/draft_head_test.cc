// DraftHead (include/miles/draft_head.h) against transformers + torch autograd
// (scripts/make_draft_goldens.py): the soft cross-entropy's value, metric sums and every trained
// tensor's gradient, the inference rows' logits and layer outputs; drafting row by row equals one
// chunk bit for bit; bad vocabularies and MoE policies are errors.
#include "miles/draft_head.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "miles/thread_pool.h"
#include "miles/weight_sync/draft_files.h"
#include "random_vec.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace miles {
namespace {

struct Golden {
  std::vector<int64_t> layers;  // the head's feature layers (empty: the last)
  ModelConfig config;
  TensorMap policy;
  TensorMap g;
  std::vector<int32_t> ids, lens, vocab;
  std::vector<float> features, logits, weight;
  float scale = 0;
};

// A test policy (tests/data/models/<name>) as a Model.
struct TestPolicy {
  ModelConfig config;
  std::unique_ptr<Model> model;
};
TestPolicy load_policy(const std::string& name) {
  auto files = load_model_files(test::data_dir() + "/models/" + name);
  EXPECT_TRUE(files.ok()) << files.message();
  if (!files.ok()) return {};
  auto model = Model::from_weights(files->config, files->weights);
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return {};
  return {files->config, std::move(*model)};
}

// The next training-time-test pass over `input` (ForwardOptions::earlier_passes: the tapes so
// far), its tape appended to `tapes`.
Result<ForwardOutput> next_pass(const Model& m, std::span<const int32_t> ids,
                                std::span<const SeqSpan> seqs, std::span<const float> input,
                                std::vector<std::unique_ptr<ForwardTape>>& tapes,
                                bool return_hidden, ThreadPool* pool) {
  std::vector<const ForwardTape*> earlier;
  for (auto& e : tapes) earlier.push_back(e.get());
  tapes.push_back(std::make_unique<ForwardTape>());
  ForwardOptions o;
  o.tape = tapes.back().get();
  o.earlier_passes = earlier;
  o.input_hidden = input;
  o.return_hidden = return_hidden;
  auto kv = m.make_kv_cache();
  return m.forward(ids, seqs, *kv, o, pool);
}

std::vector<int32_t> ints(const TensorMap& m, const std::string& n) {
  const Tensor* t = m.find(n);
  EXPECT_NE(t, nullptr) << n;
  return std::vector<int32_t>(t->data<int32_t>(), t->data<int32_t>() + t->numel());
}
std::vector<float> floats(const TensorMap& m, const std::string& n) {
  const Tensor* t = m.find(n);
  EXPECT_NE(t, nullptr) << n;
  return t ? t->to_f32() : std::vector<float>{};
}

// "<policy>" or "<policy>.layers0-1" (features of layers 0 and 1).
Golden load(const std::string& file) {
  Golden g;
  const std::string name = file.substr(0, file.find('.'));
  auto files = load_model_files(test::data_dir() + "/models/" + name);
  EXPECT_TRUE(files.ok()) << files.message();
  g.config = files->config;
  g.policy = std::move(files->weights);
  auto gm = read_safetensors(test::data_dir() + "/draft_goldens/" + file + ".safetensors");
  EXPECT_TRUE(gm.ok()) << gm.message();
  g.g = std::move(*gm);
  g.ids = ints(g.g, "ids");
  g.lens = ints(g.g, "lens");
  g.vocab = ints(g.g, "vocab");
  g.features = floats(g.g, "features");
  g.logits = floats(g.g, "policy_logits");
  g.weight = floats(g.g, "weight");
  g.scale = floats(g.g, "scale")[0];
  if (g.g.find("feature_layers"))
    for (int32_t l : ints(g.g, "feature_layers")) g.layers.push_back(l);
  return g;
}

// The golden's head: create()'s, with the golden's fc (and P).
std::unique_ptr<DraftHead> head_of(const Golden& g) {
  auto h = DraftHead::create(g.config, g.policy, g.vocab, g.layers);
  EXPECT_TRUE(h.ok()) << h.message();
  FlatTensors p = (*h)->params();
  const std::vector<float> fc = floats(g.g, "fc");
  std::copy(fc.begin(), fc.end(), p.get("draft.fc.weight").begin());
  if (!g.layers.empty()) {
    const std::vector<float> pf = floats(g.g, "feature_fc");
    std::copy(pf.begin(), pf.end(), p.get("draft.feature_fc.weight").begin());
  }
  EXPECT_TRUE((*h)->set_params(p).ok());
  return std::move(*h);
}

void expect_close(std::span<const float> got, const std::vector<float>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-6;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * scale) << what << " [" << i << "]";
}

class DraftHeadGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(DraftHeadGolden, LossSumsAndGradientsMatchTorch) {
  const Golden g = load(GetParam());
  auto head = head_of(g);
  std::vector<SeqSpan> seqs;
  for (size_t s = 0; s < g.lens.size(); ++s)
    seqs.push_back({static_cast<int32_t>(s), 0, g.lens[s]});
  DraftTrainRows rows{g.ids, seqs, g.features, g.logits, g.weight};
  FlatTensors grads(head->params().layout_ptr());
  ThreadPool pool(2);
  auto sums = head->accumulate_grad(rows, g.scale, grads, &pool);
  ASSERT_TRUE(sums.ok()) << sums.message();
  const std::vector<float> want = floats(g.g, "sums");
  EXPECT_NEAR(sums->rows, want[0], 1e-6);
  EXPECT_NEAR(sums->agree, want[1], 1e-6);
  EXPECT_NEAR(sums->accept, want[2], 1e-5);
  EXPECT_NEAR(sums->in_vocab, want[3], 1e-5);
  EXPECT_NEAR(sums->loss * g.scale, floats(g.g, "loss")[0], 1e-5);
  int checked = 0;
  for (const ParamSpec& s : grads.layout().specs()) {
    expect_close(std::as_const(grads).get(s.name), floats(g.g, "grad." + s.name), 2e-5, s.name);
    ++checked;
  }
  EXPECT_GE(checked, g.layers.empty() ? 9 : 10);
  // Adding a second time doubles (the buffer accumulates), and the same rows give the same bits.
  FlatTensors again(head->params().layout_ptr());
  ASSERT_TRUE(head->accumulate_grad(rows, g.scale, again, nullptr).ok());
  for (size_t i = 0; i < grads.all().size(); ++i) ASSERT_EQ(grads.all()[i], again.all()[i]) << i;
  // Only the weighted rows' logits (in reverse order) found through logit_row: the same bits. A
  // weighted row without logits, or a map past the logits, is refused.
  const int64_t t = static_cast<int64_t>(g.ids.size());
  const int64_t pv = static_cast<int64_t>(g.logits.size()) / t;
  std::vector<int64_t> weighted, map(static_cast<size_t>(t), -1);
  for (int64_t i = 0; i < t; ++i)
    if (g.weight[i] != 0) weighted.push_back(i);
  ASSERT_GE(weighted.size(), 2u);
  std::vector<float> compact;
  for (size_t k = weighted.size(); k-- > 0;) {
    map[weighted[k]] = static_cast<int64_t>(compact.size()) / pv;
    compact.insert(compact.end(), g.logits.begin() + weighted[k] * pv,
                   g.logits.begin() + (weighted[k] + 1) * pv);
  }
  FlatTensors mapped(head->params().layout_ptr());
  const auto with_map = [&](FlatTensors& into) {
    return head->accumulate_grad({g.ids, seqs, g.features, compact, g.weight, map}, g.scale, into,
                                 &pool);
  };
  ASSERT_TRUE(with_map(mapped).ok());
  for (size_t i = 0; i < grads.all().size(); ++i) ASSERT_EQ(grads.all()[i], mapped.all()[i]) << i;
  map[weighted[0]] = -1;
  EXPECT_NE(with_map(mapped).message().find("has a weight and no logits"), std::string::npos);
  map[weighted[0]] = static_cast<int64_t>(weighted.size());
  EXPECT_NE(with_map(mapped).message().find("maps to logits row"), std::string::npos);
}

TEST_P(DraftHeadGolden, InferenceRowsMatchTorchAndDoNotDependOnChunking) {
  const Golden g = load(GetParam());
  auto head = head_of(g);
  const int64_t d = head->feature_width(), dv = g.vocab.size(), hd = g.config.hidden_size;
  // Both sequences' rows in one forward (slots 0, 1).
  std::vector<float> feat;
  std::vector<int32_t> next;
  std::vector<SeqSpan> seqs;
  int64_t at = 0;
  for (size_t s = 0; s < g.lens.size(); ++s) {
    for (int64_t j = 0; j + 1 < g.lens[s]; ++j) {
      feat.insert(feat.end(), g.features.begin() + (at + j) * d,
                  g.features.begin() + (at + j + 1) * d);
      next.push_back(g.ids[at + j + 1]);
    }
    seqs.push_back({static_cast<int32_t>(s), 0, g.lens[s] - 1});
    at += g.lens[s];
  }
  auto kv = head->make_kv_cache();
  auto step = head->forward(feat, next, seqs, *kv, nullptr);
  ASSERT_TRUE(step.ok()) << step.message();
  expect_close(step->logits, floats(g.g, "last_logits"), 1e-5, "last_logits");
  expect_close(step->hidden, floats(g.g, "last_hidden"), 1e-5, "last_hidden");
  // Sequence 1 again, one row at a time into a fresh slot: the last row's bits are the same.
  auto kv2 = head->make_kv_cache();
  const int64_t n1 = g.lens[1] - 1, off = g.lens[0] - 1;
  DraftStep last;
  for (int64_t j = 0; j < n1; ++j) {
    const SeqSpan one{0, j, 1};
    auto r =
        head->forward(std::span<const float>(feat).subspan((off + j) * d, d),
                      std::span<const int32_t>(next).subspan(off + j, 1), {&one, 1}, *kv2, nullptr);
    ASSERT_TRUE(r.ok()) << r.message();
    last = std::move(*r);
  }
  for (int64_t i = 0; i < dv; ++i) ASSERT_EQ(last.logits[i], step->logits[dv + i]) << i;
  for (int64_t i = 0; i < hd; ++i) ASSERT_EQ(last.hidden[i], step->hidden[hd + i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Policies, DraftHeadGolden,
                         ::testing::Values("llama_tied", "qwen3", "llama_tied.layers0-1",
                                           "qwen3.layers0-1"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// EAGLE-3's training-time test (accumulate_grad with passes = 3) against transformers with the
// earlier passes' keys as a cache and a custom 4D mask (make_draft_goldens.py, make_ttt), nothing
// detached: each pass's sums, the total loss and every gradient (with several feature layers, P's
// too: later passes reach it through pass 1's g and keys).
class DraftHeadTtt : public ::testing::TestWithParam<const char*> {};

TEST_P(DraftHeadTtt, EveryPassesSumsAndTheGradientsMatchTorch) {
  const Golden g = load(GetParam());
  const int64_t passes = ints(g.g, "passes")[0];
  ASSERT_EQ(passes, 3);
  auto head = head_of(g);
  std::vector<SeqSpan> seqs;
  for (size_t s = 0; s < g.lens.size(); ++s)
    seqs.push_back({static_cast<int32_t>(s), 0, g.lens[s]});
  const DraftTrainRows rows{g.ids, seqs, g.features, g.logits, g.weight};
  FlatTensors grads(head->params().layout_ptr());
  ThreadPool pool(2);
  auto sums = head->accumulate_grad(rows, g.scale, grads, &pool, passes);
  ASSERT_TRUE(sums.ok()) << sums.message();
  ASSERT_EQ(sums->ahead.size(), 2u);
  const std::vector<float> want = floats(g.g, "sums");  // [passes, 4]
  double loss = sums->loss;
  for (int64_t p = 0; p < passes; ++p) {
    const DraftTrainSums& s = p == 0 ? *sums : sums->ahead[p - 1];
    if (p > 0) loss += s.loss;
    EXPECT_NEAR(s.rows, want[p * 4 + 0], 1e-6) << "pass " << p + 1;
    EXPECT_NEAR(s.agree, want[p * 4 + 1], 1e-6) << "pass " << p + 1;
    EXPECT_NEAR(s.accept, want[p * 4 + 2], 1e-5) << "pass " << p + 1;
    EXPECT_NEAR(s.in_vocab, want[p * 4 + 3], 1e-5) << "pass " << p + 1;
  }
  EXPECT_LT(sums->ahead[1].rows, sums->ahead[0].rows);  // a sequence's first p − 1 rows sit out
  EXPECT_NEAR(loss * g.scale, floats(g.g, "loss")[0], 1e-5);
  for (const ParamSpec& s : grads.layout().specs())
    expect_close(std::as_const(grads).get(s.name), floats(g.g, "grad." + s.name), 2e-5, s.name);
  // One thread or two, the same bits; one pass is the passes = 1 head's first pass exactly.
  FlatTensors again(head->params().layout_ptr()), first(head->params().layout_ptr()),
      one(head->params().layout_ptr());
  ASSERT_TRUE(head->accumulate_grad(rows, g.scale, again, nullptr, passes).ok());
  for (size_t i = 0; i < grads.all().size(); ++i) ASSERT_EQ(grads.all()[i], again.all()[i]) << i;
  auto s1 = head->accumulate_grad(rows, g.scale, one, &pool, 1);
  ASSERT_TRUE(s1.ok()) << s1.message();
  EXPECT_EQ(s1->loss, sums->loss);
  EXPECT_TRUE(s1->ahead.empty());
  for (int64_t bad : {int64_t{0}, DraftHead::kMaxPasses + 1}) {
    auto r = head->accumulate_grad(rows, g.scale, first, &pool, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("training passes"), std::string::npos) << r.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, DraftHeadTtt,
                         ::testing::Values("llama_tied.ttt3", "qwen3.ttt3", "qwen3.layers0-1.ttt3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ForwardOptions::earlier_passes sees what the engine's KV holds for a draft p tokens ahead: pass
// p's logits of row i equal a cached forward of pass 1's rows 0 .. i − p + 1, then pass q's row
// i − p + q for q = 2 .. p one at a time (the engine's drafting), for every row of two sequences;
// refused without a tape, or over another batch.
TEST(DraftHead, TrainingPassesSeeWhatTheEnginesDraftKvHolds) {
  for (const char* name : {"llama_tied", "qwen3"}) {
    const TestPolicy policy = load_policy(name);
    ASSERT_TRUE(policy.model);
    const Model& m = *policy.model;
    const int64_t d = policy.config.hidden_size, v = policy.config.vocab_size;
    const std::vector<int64_t> lens{5, 9};
    const int64_t t = 14;
    const std::vector<int32_t> ids(t, 0);
    const std::vector<SeqSpan> seqs{{0, 0, lens[0]}, {1, 0, lens[1]}};
    constexpr int kPasses = 3;
    std::vector<std::vector<float>> in;
    for (int p = 0; p < kPasses; ++p) in.push_back(test::random_vec(t * d, 7 + p));
    std::vector<std::unique_ptr<ForwardTape>> tapes;
    std::vector<std::vector<float>> logits;
    ThreadPool pool(2);
    for (int p = 0; p < kPasses; ++p) {
      auto out = next_pass(m, ids, seqs, in[p], tapes, false, &pool);
      ASSERT_TRUE(out.ok()) << out.message();
      logits.push_back(std::move(out->logits));
    }
    for (int p = 1; p <= kPasses; ++p) {
      int64_t off = 0;
      for (size_t s = 0; s < seqs.size(); ++s) {
        for (int64_t i = p - 1; i < lens[s]; ++i) {
          auto kv = m.make_kv_cache();
          ForwardOptions o;
          o.all_logits = false;
          std::vector<float> got;
          const int64_t prefix = i - p + 2;  // pass 1's rows 0 .. i − p + 1
          if (prefix > 0) {
            o.input_hidden = std::span<const float>(in[0]).subspan(off * d, prefix * d);
            const SeqSpan a{0, 0, prefix};
            auto r =
                m.forward(std::span<const int32_t>(ids).first(prefix), {&a, 1}, *kv, o, nullptr);
            ASSERT_TRUE(r.ok()) << r.message();
            got = r->logits;
          }
          for (int q = 2; q <= p; ++q) {
            const int64_t row = i - p + q;
            o.input_hidden = std::span<const float>(in[q - 1]).subspan((off + row) * d, d);
            const SeqSpan one{0, row, 1};
            auto r = m.forward(std::span<const int32_t>(ids).first(1), {&one, 1}, *kv, o, nullptr);
            ASSERT_TRUE(r.ok()) << r.message();
            got = r->logits;
          }
          const std::span<const float> want(logits[p - 1].data() + (off + i) * v, v);
          expect_close(got, std::vector<float>(want.begin(), want.end()), 1e-5,
                       std::string(name) + " pass " + std::to_string(p) + " seq " +
                           std::to_string(s) + " row " + std::to_string(i));
        }
        off += lens[s];
      }
    }
    ForwardOptions bad;
    bad.input_hidden = in[1];
    const std::vector<const ForwardTape*> earlier{tapes[0].get()};
    bad.earlier_passes = earlier;
    auto kv = m.make_kv_cache();
    auto r = m.forward(ids, seqs, *kv, bad, nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("need a tape"), std::string::npos) << r.message();
    ForwardTape other;
    bad.tape = &other;
    const std::vector<SeqSpan> split{{0, 0, 6}, {1, 0, 8}};
    r = m.forward(ids, split, *kv, bad, nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("another batch"), std::string::npos) << r.message();
    // A backward sends the earlier keys' gradients only to the tapes its forward read, in order.
    FlatTensors grads(ParamLayout::for_model(policy.config));
    const std::vector<float> dlogits(logits[2].size(), 0.0f);
    std::vector<ForwardTape*> swapped{tapes[1].get(), tapes[0].get()};
    BackwardIo io;
    io.earlier_passes = swapped;
    Status st = m.backward(*tapes[2], dlogits, grads, nullptr, io);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("not the tapes"), std::string::npos) << st.message();
    const std::vector<float> short_dh(d, 0.0f);
    BackwardIo io2;
    io2.d_hidden = short_dh;
    st = m.backward(*tapes[2], dlogits, grads, nullptr, io2);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("d_hidden"), std::string::npos) << st.message();
  }
}

// Gradients into the earlier passes through every layer (BackwardIo::earlier_passes and d_hidden)
// against central differences, on the whole test policies: three passes, pass p's input
// in_p + ½ · pass p − 1's hidden states, L = Σ_p ⟨logits_p, R_p⟩; d L / d in_1 comes back through
// pass 1's keys (from passes 2 and 3 in every layer) and its hidden states (from pass 2). The same
// bits on one thread or two.
TEST(DraftHead, EarlierPassesGetTheLaterPassesGradientsInEveryLayer) {
  for (const char* name : {"llama_tied", "qwen3"}) {
    const TestPolicy policy = load_policy(name);
    ASSERT_TRUE(policy.model);
    const Model& m = *policy.model;
    ASSERT_GE(policy.config.num_layers, 2);
    const int64_t d = policy.config.hidden_size, v = policy.config.vocab_size;
    const std::vector<SeqSpan> seqs{{0, 0, 4}, {1, 0, 6}};
    const int64_t t = 10;
    const std::vector<int32_t> ids(t, 0);
    constexpr int kPasses = 3;
    std::vector<std::vector<float>> in, proj;
    for (int p = 0; p < kPasses; ++p) {
      in.push_back(test::random_vec(t * d, 11 + p));
      proj.push_back(test::random_vec(t * v, 21 + p));
    }
    // Runs the passes from `first`; returns L, keeping the tapes.
    std::vector<std::unique_ptr<ForwardTape>> tapes;
    auto run = [&](const std::vector<float>& first) -> double {
      tapes.clear();
      std::vector<float> hidden;
      double loss = 0;
      for (int p = 0; p < kPasses; ++p) {
        std::vector<float> u = p == 0 ? first : in[p];
        for (size_t i = 0; p > 0 && i < u.size(); ++i) u[i] += 0.5f * hidden[i];
        auto out = next_pass(m, ids, seqs, u, tapes, true, nullptr);
        EXPECT_TRUE(out.ok()) << out.message();
        if (!out.ok()) return 0;
        for (size_t i = 0; i < out->logits.size(); ++i)
          loss += static_cast<double>(out->logits[i]) * proj[p][i];
        hidden = std::move(out->hidden);
      }
      return loss;
    };
    auto gradient = [&](ThreadPool* pool) {
      run(in[0]);
      std::vector<float> dh, du;
      for (int p = kPasses - 1; p >= 0; --p) {
        std::vector<ForwardTape*> earlier;
        for (int q = 0; q < p; ++q) earlier.push_back(tapes[q].get());
        FlatTensors grads(ParamLayout::for_model(policy.config));
        BackwardIo io;
        io.d_input = &du;
        io.d_hidden = dh;
        io.earlier_passes = earlier;
        const Status st = m.backward(*tapes[p], proj[p], grads, pool, io);
        EXPECT_TRUE(st.ok()) << st.message();
        dh.resize(du.size());
        for (size_t i = 0; i < du.size(); ++i) dh[i] = 0.5f * du[i];
      }
      return du;
    };
    const std::vector<float> an = gradient(nullptr);
    ThreadPool pool(2);
    const std::vector<float> an2 = gradient(&pool);
    ASSERT_EQ(an.size(), static_cast<size_t>(t * d));
    for (size_t i = 0; i < an.size(); ++i) ASSERT_EQ(an[i], an2[i]) << name << " " << i;
    // Rows 0 and 3 of sequence 0 and row 1 of sequence 1: pass 1's keys reach the later passes'
    // rows after them only.
    for (const int64_t row : {int64_t{0}, int64_t{3}, int64_t{5}}) {
      for (const int64_t e : {int64_t{0}, d / 2 + 1, d - 1}) {
        const int64_t i = row * d + e;
        const float h = 1e-2f;
        std::vector<float> plus = in[0], minus = in[0];
        plus[i] += h;
        minus[i] -= h;
        const double fd = (run(plus) - run(minus)) / (2.0 * h);
        EXPECT_NEAR(an[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << name << " row " << row << " e " << e;
      }
    }
  }
}

TEST(DraftHead, RejectsBadVocabulariesAndMoePolicies) {
  const Golden g = load("llama_tied");
  auto dup = DraftHead::create(g.config, g.policy, {3, 5, 3});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.message().find("repeated"), std::string::npos) << dup.message();
  auto out = DraftHead::create(g.config, g.policy, {3, 5000});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("outside"), std::string::npos) << out.message();
  auto moe = load_model_files(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(moe.ok()) << moe.message();
  auto h = DraftHead::create(moe->config, moe->weights, {1, 2, 3});
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.message().find("dense families only"), std::string::npos) << h.message();
}

// Feature layers (EAGLE-3): a fresh head over layers {0, 1} starts as the last layer's head
// (P = [0 | I]), bit for bit, in its training sums and gradients of the shared tensors and in its
// inference rows; bad layer lists are errors that name the layer.
TEST(DraftHead, AFreshMultiLayerHeadStartsAsTheLastLayersHead) {
  const Golden g = load("llama_tied.layers0-1");
  const int64_t d = g.config.hidden_size;
  auto one = DraftHead::create(g.config, g.policy, g.vocab);
  auto two = DraftHead::create(g.config, g.policy, g.vocab, g.layers);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ((*one)->feature_layers(), std::vector<int64_t>{1});
  EXPECT_EQ((*two)->feature_layers(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ((*two)->feature_width(), 2 * d);
  std::vector<float> last;  // layer 1's rows of the golden's features
  for (size_t i = 0; i < g.ids.size(); ++i)
    last.insert(last.end(), g.features.begin() + (2 * i + 1) * d,
                g.features.begin() + (2 * i + 2) * d);
  std::vector<SeqSpan> seqs;
  for (size_t s = 0; s < g.lens.size(); ++s)
    seqs.push_back({static_cast<int32_t>(s), 0, g.lens[s]});
  FlatTensors g1((*one)->params().layout_ptr()), g2((*two)->params().layout_ptr());
  auto s1 = (*one)->accumulate_grad({g.ids, seqs, last, g.logits, g.weight}, g.scale, g1, nullptr);
  auto s2 =
      (*two)->accumulate_grad({g.ids, seqs, g.features, g.logits, g.weight}, g.scale, g2, nullptr);
  ASSERT_TRUE(s1.ok() && s2.ok()) << s1.message() << s2.message();
  EXPECT_EQ(s1->loss, s2->loss);
  EXPECT_EQ(s1->agree, s2->agree);
  for (const ParamSpec& s : g1.layout().specs()) {
    const auto a = std::as_const(g1).get(s.name), b = std::as_const(g2).get(s.name);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << s.name << " " << i;
  }
  const std::vector<int32_t> next(g.ids.begin() + 1, g.ids.begin() + 4);
  const SeqSpan three{0, 0, 3};
  auto kv1 = (*one)->make_kv_cache();
  auto kv2 = (*two)->make_kv_cache();
  auto r1 =
      (*one)->forward(std::span<const float>(last).first(3 * d), next, {&three, 1}, *kv1, nullptr);
  auto r2 = (*two)->forward(std::span<const float>(g.features).first(6 * d), next, {&three, 1},
                            *kv2, nullptr);
  ASSERT_TRUE(r1.ok() && r2.ok()) << r1.message() << r2.message();
  EXPECT_EQ(r1->logits, r2->logits);
  EXPECT_EQ(r1->hidden, r2->hidden);
  // Drafting further reads g (hidden wide) either way.
  const SeqSpan more{0, 3, 1};
  auto o1 = (*one)->forward(r1->hidden, {next.data(), 1}, {&more, 1}, *kv1, nullptr, true);
  auto o2 = (*two)->forward(r2->hidden, {next.data(), 1}, {&more, 1}, *kv2, nullptr, true);
  ASSERT_TRUE(o1.ok() && o2.ok()) << o1.message() << o2.message();
  EXPECT_EQ(o1->logits, o2->logits);
  auto wrong = (*two)->forward(r2->hidden, {next.data(), 1}, {&more, 1}, *kv2, nullptr);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("rows of 128"), std::string::npos) << wrong.message();

  const std::vector<std::pair<std::vector<int64_t>, std::string>> bad{
      {{1, 0}, "ascending"},
      {{0, 0}, "ascending"},
      {{0, 2}, "outside"},
      {{-1}, "outside"},
      {{0, 1, 0, 1, 0, 1, 0, 1, 0}, "at most 8"}};
  for (const auto& [layers, what] : bad) {
    auto h = DraftHead::create(g.config, g.policy, g.vocab, layers);
    ASSERT_FALSE(h.ok()) << what;
    EXPECT_NE(h.message().find(what), std::string::npos) << h.message();
  }
}

// Each weight version's head beside it (weight_sync/draft_files.h): what is read back is the
// head written (tensors and vocabulary), a version without one reads as none, the newest three
// stay, and a file without its vocabulary is an error that names it.
TEST(DraftHead, VersionsOnDiskReadBackAndOnlyTheNewestStay) {
  const Golden g = load("qwen3");
  auto head = head_of(g);
  const std::string dir = test::scratch_dir("miles_draft_", "files");
  for (int64_t v : {1, 2, 3, 4, 5}) ASSERT_TRUE(write_draft_head(dir, v, *head).ok());
  for (int64_t v : {1, 2}) EXPECT_FALSE(std::filesystem::exists(draft_head_path(dir, v))) << v;
  auto back = read_draft_head(dir, 5, g.config, g.policy);
  ASSERT_TRUE(back.ok()) << back.message();
  ASSERT_NE(*back, nullptr);
  EXPECT_EQ((*back)->vocab(), head->vocab());
  for (size_t i = 0; i < head->params().all().size(); ++i)
    ASSERT_EQ((*back)->params().all()[i], head->params().all()[i]) << i;
  // A head over several layers reads back with them (draft.feature_layers) and its P.
  const Golden g2 = load("qwen3.layers0-1");
  auto multi = head_of(g2);
  ASSERT_TRUE(write_draft_head(dir, 6, *multi).ok());
  auto mback = read_draft_head(dir, 6, g2.config, g2.policy);
  ASSERT_TRUE(mback.ok()) << mback.message();
  ASSERT_NE(*mback, nullptr);
  EXPECT_EQ((*mback)->feature_layers(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ((*mback)->params().all().size(), multi->params().all().size());
  for (size_t i = 0; i < multi->params().all().size(); ++i)
    ASSERT_EQ((*mback)->params().all()[i], multi->params().all()[i]) << i;
  // P without the list of layers it projects is refused by name, not read as a last-layer head.
  const TensorMap mm = multi->as_tensor_map();
  std::vector<std::pair<std::string, Tensor>> nolist;
  for (const std::string& n : mm.names())
    if (n != "draft.feature_layers") nolist.emplace_back(n, *mm.find(n));
  ASSERT_TRUE(write_safetensors(draft_head_path(dir, 8), nolist).ok());
  auto unlisted = read_draft_head(dir, 8, g2.config, g2.policy);
  ASSERT_FALSE(unlisted.ok());
  EXPECT_NE(unlisted.message().find("draft.feature_fc.weight without"), std::string::npos)
      << unlisted.message();
  auto none = read_draft_head(dir, 2, g.config, g.policy);
  ASSERT_TRUE(none.ok()) << none.message();
  EXPECT_EQ(*none, nullptr);
  const TensorMap m = head->params().as_tensor_map();  // no draft.vocab
  std::vector<std::pair<std::string, Tensor>> t;
  for (const std::string& n : m.names()) t.emplace_back(n, *m.find(n));
  ASSERT_TRUE(write_safetensors(draft_head_path(dir, 9), t).ok());
  auto bad = read_draft_head(dir, 9, g.config, g.policy);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("draft.vocab"), std::string::npos) << bad.message();
}

TEST(DraftHead, TopIdsTakesTheMostFrequentSmallerIdFirst) {
  const std::vector<uint64_t> counts{5, 0, 7, 5, 1, 7};
  EXPECT_EQ(top_ids(counts, 3), (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(top_ids(counts, 4), (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(top_ids(counts, 10).size(), 6u);
}

}  // namespace
}  // namespace miles
