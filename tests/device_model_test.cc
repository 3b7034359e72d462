// The device forward (miles/device_model.h) against the CPU Model, bit for bit.
//
// The CPU suite runs the device kernels through the host emulation backend: the same functors a
// CUDA grid runs, as host loops. It proves the device math (exp, the chunked dot) equals the CPU
// kernels', the device forward (KV paging, RoPE, Qwen3 norms, tied heads, yarn scaling) gives the
// CPU model's logits, and an engine over the device runner gives the CPU engine's tokens and
// logprobs through GRPO forks, prefix hits, chunked prefill and a weight update. The Cuda.* tests
// run the same comparisons on a GPU and skip, saying why, where there is none.
#include "miles/device_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "device/device_math.h"
#include "engine_workload.h"
#include "kernels/exp.h"
#include "miles/flat_params.h"
#include "miles/kernels.h"
#include "miles/rollout/engine.h"
#include "miles/tensor_parallel.h"
#include "miles/thread_pool.h"
#include "test_paths.h"

namespace miles {
namespace {

// Equal float vectors, byte for byte (memcmp on empty vectors would pass it null).
template <typename A, typename B>
bool same_floats(const A& a, const B& b) {
  return a.size() == b.size() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

using test::expect_same_bits;
using test::Finals;
using test::kEngine;
using test::one_process_runner;
using test::run_workload;

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

TEST(DeviceMath, ExpIsTheCpuExpBitForBit) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f,    -0.0f,   1.0f,     -1.0f,     88.7f, 89.0f,  100.0f, -103.9f,
                           -104.0f, -200.0f, INFINITY, -INFINITY, NAN,   1e-30f, -87.5f, 0.5f};
  std::uniform_real_distribution<float> wide(-110.0f, 95.0f), narrow(-2.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) xs.push_back(i % 2 ? wide(rng) : narrow(rng));
  for (const float x : xs)
    ASSERT_EQ(bits(device::exp_f32(x)), bits(kernels::detail::exp_f32(x))) << "x = " << x;
}

TEST(DeviceMath, ChunkedDotIsTheGemmContract) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (const int64_t k :
       {1, 7, 64, 72, 128, 129, 172, 576, 1000, 1536, 2048, 4099, 18944, 49152, 151936}) {
    std::vector<float> a(k), b(k);
    for (auto& v : a) v = nd(rng);
    for (auto& v : b) v = nd(rng);
    const float dev = device::chunked_dot(
        k, kernels::gemm_chunk(k), [&](int64_t i) { return a[i]; },
        [&](int64_t i) { return b[i]; });
    EXPECT_EQ(bits(dev), bits(kernels::gemm_reference_dot(a.data(), b.data(), k))) << "k = " << k;
  }
}

TEST(DeviceModel, DeviceNamesParseAndAnUnknownOneIsNamed) {
  EXPECT_EQ(*parse_device("cuda"), Device::kCuda);
  EXPECT_EQ(*parse_device("emulated"), Device::kEmulated);
  EXPECT_EQ(*parse_device("cpu"), Device::kCpu);
  auto bad = parse_device("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'gpu'"), std::string::npos) << bad.message();
}

// Tensor parallelism of MLA needs q_lora_rank (q_proj would be fused with the replicated
// kv_a_proj_with_mqa): refused naming it.
TEST(DeviceModel, MlaTensorParallelWithoutQLoraIsRefusedNamingIt) {
  auto noq = load_model_files(test::data_dir() + "/models/deepseek_v3_noq");
  ASSERT_TRUE(noq.ok()) << noq.message();
  auto tp = tensor_parallel::local_config(noq->config, 2);
  ASSERT_FALSE(tp.ok());
  EXPECT_NE(tp.message().find("MLA"), std::string::npos) << tp.message();
  EXPECT_TRUE(tensor_parallel::local_config(noq->config, 1).ok());
}

TEST(DeviceModel, BadForcedExpertsAreRefusedNamingThem) {
  auto files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(files.ok());
  auto m = make_device_model(Device::kEmulated, files->config, files->weights, {16, 8}, nullptr);
  ASSERT_TRUE(m.ok()) << m.message();
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<SeqSpan> seqs = {{0, 0, 3}};
  const int64_t per_token = files->config.num_moe_layers() * files->config.moe.top_k;
  std::vector<int32_t> forced(3 * per_token, 0);
  auto f = (*m)->forward_train(tokens, seqs, true, forced);  // id 0 repeated for one token
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("repeated"), std::string::npos) << f.message();
  forced.pop_back();
  f = (*m)->forward_train(tokens, seqs, true, forced);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("forced expert ids: expected"), std::string::npos) << f.message();
}

TEST(DeviceModel, AMissingTensorIsRefusedNamingIt) {
  auto files = load_model_files(test::data_dir() + "/models/llama");
  ASSERT_TRUE(files.ok());
  TensorMap w;
  for (const std::string& name : files->weights.names())
    if (name != "model.layers.1.mlp.down_proj.weight")
      w.insert(name, *files->weights.find(name), files->weights.source(name));
  auto m = make_device_model(Device::kEmulated, files->config, w, {16, 8}, nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("model.layers.1.mlp.down_proj.weight"), std::string::npos)
      << m.message();
}

// Two sequences prefilled together (all logits), then both decoded one token (last logits), on
// the CPU Model with its simple cache and on the device with hand-made block tables.
void expect_forward_bits(Device device, const std::string& model_dir) {
  auto files = load_model_files(model_dir);
  ASSERT_TRUE(files.ok()) << files.message();
  const ModelConfig& c = files->config;
  auto cpu = Model::from_weights(c, files->weights);
  ASSERT_TRUE(cpu.ok());
  ThreadPool pool(2);
  const int64_t bt = 8;
  auto dev = make_device_model(device, c, files->weights, {16, bt}, &pool);
  ASSERT_TRUE(dev.ok()) << dev.message();
  std::mt19937 rng(3);
  std::vector<int32_t> prefill(29 + 17);
  for (auto& t : prefill) t = static_cast<int32_t>(rng() % c.vocab_size);
  const std::vector<SeqSpan> seqs1 = {{0, 0, 29}, {1, 0, 17}};
  const std::vector<int32_t> table0 = {5, 9, 2, 11, 0}, table1 = {7, 3, 14};  // 40 and 24 positions
  auto cache = (*cpu)->make_kv_cache(bt);
  const bool moe = c.num_moe_layers() > 0;
  ForwardOptions o;
  o.return_experts = moe;
  // The draft head's features: the first and last layers' outputs (ForwardOutput::taps).
  const std::vector<int64_t> taps =
      c.num_layers > 1 ? std::vector<int64_t>{0, c.num_layers - 1} : std::vector<int64_t>{0};
  o.tap_layers = taps;
  o.return_hidden = true;
  auto a = (*cpu)->forward(prefill, seqs1, *cache, o, &pool);
  ASSERT_TRUE(a.ok()) << a.message();
  DeviceBatch b1{prefill, seqs1, {table0, table1}, true, moe};
  b1.tap_layers = taps;
  auto b = (*dev)->forward(b1);
  ASSERT_TRUE(b.ok()) << b.message();
  {  // every token's row of each tapped layer: the stage forward's output and return_hidden's
    const int64_t t = prefill.size(), d = c.hidden_size, n = taps.size();
    ASSERT_EQ(static_cast<int64_t>(a->taps.size()), t * n * d);
    EXPECT_TRUE(same_floats(a->taps, b->taps)) << "tapped layers differ";
    ForwardOptions first;
    first.layer_end = 1;
    auto scratch = (*cpu)->make_kv_cache(bt);
    auto l0 = (*cpu)->forward(prefill, seqs1, *scratch, first, &pool);
    ASSERT_TRUE(l0.ok()) << l0.message();
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(a->taps[(i * n) * d + j], l0->hidden[i * d + j]) << "layer 0, row " << i;
        ASSERT_EQ(a->taps[(i * n + n - 1) * d + j], a->hidden[i * d + j]) << "last, row " << i;
      }
    ForwardOptions bad;
    const std::vector<int64_t> backwards{c.num_layers - 1, 0};
    bad.tap_layers = backwards;
    if (c.num_layers > 1) {
      auto e = (*cpu)->forward(prefill, seqs1, *scratch, bad, &pool);
      ASSERT_FALSE(e.ok());
      EXPECT_NE(e.message().find("tap layers"), std::string::npos) << e.message();
      DeviceBatch wrong = b1;
      wrong.tap_layers = backwards;
      auto de = (*dev)->forward(wrong);
      ASSERT_FALSE(de.ok());
      EXPECT_NE(de.message().find("tap layers"), std::string::npos) << de.message();
    }
  }
  ASSERT_EQ(a->logits.size(), b->logits.size());
  EXPECT_TRUE(same_floats(a->logits, b->logits)) << "prefill logits differ";
  EXPECT_EQ(a->experts, b->experts);  // R3 capture: the same routed experts
  ASSERT_EQ(a->expert_weights.size(), b->expert_weights.size());
  EXPECT_TRUE(same_floats(a->expert_weights, b->expert_weights));
  if (moe) {
    EXPECT_EQ(static_cast<int64_t>(b->experts.size()),
              (29 + 17) * c.num_moe_layers() * c.moe.top_k);
  }

  const std::vector<int32_t> next = {static_cast<int32_t>(rng() % c.vocab_size),
                                     static_cast<int32_t>(rng() % c.vocab_size)};
  const std::vector<SeqSpan> seqs2 = {{1, 17, 1}, {0, 29, 1}};
  o.all_logits = false;
  a = (*cpu)->forward(next, seqs2, *cache, o, &pool);
  ASSERT_TRUE(a.ok());
  DeviceBatch b2{next, seqs2, {table1, table0}, false, moe};
  b = (*dev)->forward(b2);
  ASSERT_TRUE(b.ok()) << b.message();
  ASSERT_EQ(b->rows, 2);
  EXPECT_TRUE(same_floats(a->logits, b->logits)) << "decode logits differ";
  EXPECT_EQ(a->experts, b->experts);
}

class DeviceForward : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceForward, EmulatedEqualsTheCpuModel) {
  expect_forward_bits(Device::kEmulated, test::data_dir() + "/models/" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceForward,
                         ::testing::Values("llama", "llama_tied", "llama_bias", "llama_rope_yarn",
                                           "mistral", "phi3", "qwen2", "qwen3", "qwen3_bf16",
                                           "qwen3_moe", "qwen3_moe_nonorm", "gemma3", "glm4_moe",
                                           "glm4_moe_nonorm", "deepseek_v3", "deepseek_v3_noq"));

TEST(DeviceForwardStories, EmulatedEqualsTheCpuModel) {
  MILES_REQUIRE_SHARED();
  expect_forward_bits(Device::kEmulated,
                      test::shared_dir() + "/models/stories260K/stories260K.bin");
}

// A packed training batch (two sequences, one past a 64-query block) through forward_train and
// backward on the device, and through Model::forward (tape) and Model::backward on the CPU, with
// the same random d logits: the same logits, every gradient and the tied head's share, bit for bit.
void expect_training_bits(Device device, const std::string& model_dir, bool tied_share,
                          bool replay = false, bool some_rows = false) {
  auto files = load_model_files(model_dir);
  ASSERT_TRUE(files.ok()) << files.message();
  const ModelConfig& c = files->config;
  auto cpu = Model::from_weights(c, files->weights);
  ASSERT_TRUE(cpu.ok());
  ThreadPool pool(2);
  auto dev = make_device_model(device, c, files->weights, {4, 16}, &pool);
  ASSERT_TRUE(dev.ok()) << dev.message();
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(70 + 23);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  const std::vector<SeqSpan> seqs = {{0, 0, 70}, {1, 0, 23}};
  // Routing replay: distinct random experts per token and MoE layer.
  std::vector<int32_t> forced;
  const int64_t k = c.moe.top_k;
  if (replay)
    for (size_t i = 0; i < tokens.size() * c.num_moe_layers(); ++i) {
      std::vector<int32_t> all(c.moe.num_experts);
      for (size_t x = 0; x < all.size(); ++x) all[x] = static_cast<int32_t>(x);
      std::shuffle(all.begin(), all.end(), rng);
      forced.insert(forced.end(), all.begin(), all.begin() + k);
    }
  auto cache = (*cpu)->make_kv_cache();
  ForwardTape tape;
  ForwardOptions o;
  o.tape = &tape;
  o.forced_experts = forced;
  o.return_experts = c.num_moe_layers() > 0;
  // some_rows: the LM head over a policy loss's rows only (ForwardOptions::logit_rows).
  std::vector<int64_t> rows;
  if (some_rows)
    for (int64_t r = 30; r < 93; r += r < 69 ? 1 : 3) rows.push_back(r);
  o.logit_rows = rows;
  auto a = (*cpu)->forward(tokens, seqs, *cache, o, &pool);
  ASSERT_TRUE(a.ok()) << a.message();
  auto b = (*dev)->forward_train(tokens, seqs, true, forced, rows);
  ASSERT_TRUE(b.ok()) << b.message();
  ASSERT_EQ(a->logits.size(), b->logits.size());
  if (some_rows) ASSERT_EQ(a->logits.size(), rows.size() * c.vocab_size);
  EXPECT_TRUE(same_floats(a->logits, b->logits));
  EXPECT_EQ(a->experts, b->experts);
  if (replay) {
    for (size_t i = 0; i < forced.size(); ++i) ASSERT_EQ(b->experts[i], forced[i]) << i;
  }
  std::vector<float> dlogits(a->logits.size());
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  for (float& x : dlogits) x = nd(rng);
  auto layout = ParamLayout::for_model(c, &files->weights);
  FlatTensors ga(layout), gb(layout);
  const bool share = tied_share && c.tie_word_embeddings;
  std::vector<float> ta(share ? c.vocab_size * c.hidden_size : 0), tb(ta.size());
  BackwardIo io;
  io.tied_head_grad = ta;
  ASSERT_TRUE((*cpu)->backward(tape, dlogits, ga, &pool, io).ok());
  ASSERT_TRUE((*dev)->backward(dlogits, gb, tb).ok());
  for (const ParamSpec& spec : layout->specs()) {
    const auto x = ga.get(spec.name), y = gb.get(spec.name);
    EXPECT_TRUE(same_floats(x, y)) << spec.name;
  }
  EXPECT_TRUE(same_floats(ta, tb)) << "tied head share";
  bool nonzero = false;
  for (float v : gb.all()) nonzero = nonzero || v != 0.0f;
  EXPECT_TRUE(nonzero);
}

class DeviceTraining : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceTraining, EmulatedGradientsAreTheCpuModelsBits) {
  expect_training_bits(Device::kEmulated, test::data_dir() + "/models/" + GetParam(), false);
}

TEST_P(DeviceTraining, EmulatedTiedHeadShareIsTheCpuModelsBits) {
  expect_training_bits(Device::kEmulated, test::data_dir() + "/models/" + GetParam(), true);
}

// The LM head over some rows (a policy loss's response rows): the same logits of those rows and
// gradients (the head's summed over those rows only) as the CPU's, bit for bit.
TEST_P(DeviceTraining, EmulatedHeadOverSomeRowsIsTheCpuModelsBits) {
  expect_training_bits(Device::kEmulated, test::data_dir() + "/models/" + GetParam(), true, false,
                       true);
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceTraining,
                         ::testing::Values("llama", "llama_tied", "llama_bias", "llama_rope_yarn",
                                           "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe",
                                           "qwen3_moe_nonorm", "gemma3", "glm4_moe",
                                           "glm4_moe_nonorm", "deepseek_v3", "deepseek_v3_noq"));

TEST(DeviceTrainingMoe, EmulatedGradientsWithRoutingReplayAreTheCpuModelsBits) {
  expect_training_bits(Device::kEmulated, test::data_dir() + "/models/qwen3_moe", false, true);
  expect_training_bits(Device::kEmulated, test::data_dir() + "/models/qwen3_moe_nonorm", false,
                       true);
  expect_training_bits(Device::kEmulated, test::data_dir() + "/models/glm4_moe", false, true);
}

TEST(DeviceTrainingStories, EmulatedGradientsAreTheCpuModelsBits) {
  MILES_REQUIRE_SHARED();
  expect_training_bits(Device::kEmulated,
                       test::shared_dir() + "/models/stories260K/stories260K.bin", false);
}

TEST(DeviceTraining, BackwardWithoutATapeIsRefused) {
  auto files = load_model_files(test::data_dir() + "/models/llama");
  ASSERT_TRUE(files.ok());
  auto dev = make_device_model(Device::kEmulated, files->config, files->weights, {4, 16}, nullptr);
  ASSERT_TRUE(dev.ok());
  FlatTensors g(ParamLayout::for_model(files->config));
  std::vector<float> dl(files->config.vocab_size);
  auto s = (*dev)->backward(dl, g, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tape"), std::string::npos) << s.message();
}

// The device engine and the CPU engine over the same workload, then both after the same weight
// update: the same tokens, logprobs and cached-token counts.
void expect_engine_bits(Device device, const std::string& model_dir) {
  auto files = load_model_files(model_dir);
  ASSERT_TRUE(files.ok()) << files.message();
  const uint32_t vocab = static_cast<uint32_t>(files->config.vocab_size);
  ThreadPool pool(2);
  Engine cpu(one_process_runner(*files, &pool), kEngine);
  auto runner = make_device_model_runner(device, files->config, files->weights, kEngine, &pool);
  ASSERT_TRUE(runner.ok()) << runner.message();
  EXPECT_EQ((*runner)->kv_dim(), 0);  // the KV lives on the device
  Engine dev(std::move(runner).value(), kEngine);
  expect_same_bits(run_workload(cpu, 5, vocab), run_workload(dev, 5, vocab));
  EXPECT_EQ(dev.stats().free_blocks, cpu.stats().free_blocks);

  const FlatTensors flat = test::nudged_weights(*files);
  test::update_all({&cpu, &dev}, flat.as_tensor_map());
  expect_same_bits(run_workload(cpu, 9, vocab), run_workload(dev, 9, vocab));
}

class DeviceEngine : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceEngine, EmulatedGivesTheCpuEngineBits) {
  expect_engine_bits(Device::kEmulated, test::data_dir() + "/models/" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceEngine,
                         ::testing::Values("llama_tied", "qwen3", "qwen3_moe", "glm4_moe",
                                           "deepseek_v3"));

// Speculative decoding on the emulated device: each sequence's verify rows (ForwardOptions::
// last_rows) come back from the device, and the drafts verified give the plain CPU engine's bits.
TEST(DeviceEngineSpeculative, VerifiedDraftsGiveThePlainCpuBits) {
  for (const char* name : {"qwen3_moe", "deepseek_v3"}) {
    auto files = load_model_files(test::data_dir() + "/models/" + name);
    ASSERT_TRUE(files.ok()) << files.message();
    ThreadPool pool(2);
    Engine cpu(one_process_runner(*files, &pool), kEngine);
    const test::Finals plain = run_workload(cpu, 5);
    const EngineOptions eo = test::speculative(kEngine);
    auto runner =
        make_device_model_runner(Device::kEmulated, files->config, files->weights, eo, &pool);
    ASSERT_TRUE(runner.ok()) << runner.message();
    Engine dev(std::move(runner).value(), eo);
    dev.set_drafter(std::make_unique<test::OracleDrafter>(
        plain, 3, static_cast<int32_t>(files->config.vocab_size)));
    expect_same_bits(plain, run_workload(dev, 5));
    EXPECT_GT(dev.stats().spec_accepted_tokens, 0u) << name;
    EXPECT_LT(dev.stats().iterations, cpu.stats().iterations) << name;
    EXPECT_EQ(dev.stats().free_blocks, cpu.stats().free_blocks) << name;
  }
}

// The co-trained draft head on the emulated device: the device returns the last layer's hidden
// states (DeviceBatch::return_hidden), so its head drafts what a CPU engine's head drafts — the
// same drafts, the same ones accepted, the same scores — and the samples are the plain CPU bits.
TEST(DeviceEngineSpeculative, TheDraftHeadDraftsAsOnTheCpu) {
  auto files = load_model_files(test::data_dir() + "/models/llama_tied");
  ASSERT_TRUE(files.ok()) << files.message();
  ThreadPool pool(2);
  const EngineOptions eo = test::speculative(kEngine);
  for (const std::vector<int64_t> layers : {std::vector<int64_t>{}, std::vector<int64_t>{0, 1}}) {
    auto runner =
        make_device_model_runner(Device::kEmulated, files->config, files->weights, eo, &pool);
    ASSERT_TRUE(runner.ok()) << runner.message();
    Engine dev(std::move(runner).value(), eo);
    SCOPED_TRACE(layers.size() == 2 ? "feature layers 0, 1 (DeviceBatch::tap_layers)"
                                    : "the last layer");
    test::expect_head_drafts_as_one_process(*files, dev, &pool, layers);
  }
}

TEST(DeviceEngineStories, EmulatedGivesTheCpuEngineBits) {
  MILES_REQUIRE_SHARED();
  expect_engine_bits(Device::kEmulated, test::shared_dir() + "/models/stories260K/stories260K.bin");
}

// ---- on a GPU ---------------------------------------------------------------------------------

#define MILES_REQUIRE_CUDA()                                               \
  do {                                                                     \
    if (Status s = cuda_available(); !s.ok()) GTEST_SKIP() << s.message(); \
  } while (0)

TEST(Cuda, UnavailableIsAnErrorNotACrash) {
  if (cuda_available().ok()) GTEST_SKIP() << "a GPU is here";
  auto files = load_model_files(test::data_dir() + "/models/llama");
  ASSERT_TRUE(files.ok());
  auto m = make_device_model(Device::kCuda, files->config, files->weights, {16, 8}, nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_FALSE(m.message().empty());
}

TEST_P(DeviceForward, CudaEqualsTheCpuModel) {
  MILES_REQUIRE_CUDA();
  expect_forward_bits(Device::kCuda, test::data_dir() + "/models/" + GetParam());
}

TEST_P(DeviceEngine, CudaGivesTheCpuEngineBits) {
  MILES_REQUIRE_CUDA();
  expect_engine_bits(Device::kCuda, test::data_dir() + "/models/" + GetParam());
}

TEST_P(DeviceTraining, CudaGradientsAreTheCpuModelsBits) {
  MILES_REQUIRE_CUDA();
  expect_training_bits(Device::kCuda, test::data_dir() + "/models/" + GetParam(), true);
}

TEST(DeviceEngineStories, CudaGivesTheCpuEngineBits) {
  MILES_REQUIRE_CUDA();
  MILES_REQUIRE_SHARED();
  expect_engine_bits(Device::kCuda, test::shared_dir() + "/models/stories260K/stories260K.bin");
}

}  // namespace
}  // namespace miles
