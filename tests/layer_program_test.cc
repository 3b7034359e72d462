// The model described once (src/model/layer_program.h). Each architecture's layer program keeps
// the data-flow rules the backends rely on, and each op of each layer gives the CPU kernels' bits
// on the device functors (run by the emulated backend): after one training forward every kept
// activation is compared in program order, so a difference names the op that wrote it; after the
// backward every parameter's gradient is compared in reverse program order, naming its op.
#include "model/layer_program.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "device/device_backward_impl.h"
#include "device/host_backend.h"
#include "miles/device_model.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/thread_pool.h"
#include "model/forward_tape.h"
#include "model/model_weights.h"
#include "test_paths.h"

namespace miles {
namespace {

using Emulated = device::BackendModel<device::HostBackend>;

// The first index where two float vectors differ bitwise, or -1.
int64_t first_difference(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<int64_t>(i);
  return -1;
}

std::string describe(const Op& op) {
  return std::string(op_name(op.kind)) + " " + act_name(op.in) + " → " + act_name(op.out);
}

ModelFiles model_files(const std::string& name) {
  auto files = load_model_files(test::data_dir() + "/models/" + name);
  EXPECT_TRUE(files.ok()) << files.message();
  return std::move(*files);
}

class LayerOps : public ::testing::TestWithParam<const char*> {};

TEST_P(LayerOps, EveryProgramKeepsTheDataFlowRules) {
  const ModelFiles f = model_files(GetParam());
  auto w = load_model_weights(f.config, f.weights);
  ASSERT_TRUE(w.ok()) << w.message();
  ASSERT_EQ(static_cast<int64_t>(w->programs.size()), f.config.num_layers);
  int64_t moe_layers = 0;
  for (size_t l = 0; l < w->programs.size(); ++l) {
    const LayerProgram& p = w->programs[l];
    EXPECT_EQ(check_program(p), "") << "layer " << l;
    const LayerWeights& lw = w->layers[l];
    // A MoE layer's slice of the routing record: its place among the MoE layers.
    EXPECT_EQ(p.moe_index, lw.moe ? moe_layers++ : -1) << "layer " << l;
    // What the layer has shows in its program, and what a training forward keeps.
    int biases = 0, norms = 0;
    for (const Op& op : p.ops) {
      biases += op.kind == OpKind::kBias;
      norms += op.kind == OpKind::kRope && op.param == Param::kQkNorm;
    }
    EXPECT_EQ(biases, !lw.qkv_bias.empty() + !lw.o_bias.empty() + !lw.gate_up_bias.empty() +
                          !lw.down_bias.empty())
        << "layer " << l;
    EXPECT_EQ(norms, lw.q_norm.empty() ? 0 : 1) << "layer " << l;
    for (Act a : {Act::kHIn, Act::kXn1, Act::kQkvRaw, Act::kQkv, Act::kAttn, Act::kHMid, Act::kXn2})
      EXPECT_TRUE(p.keeps(a)) << act_name(a);
    EXPECT_EQ(p.keeps(Act::kGateUp), !lw.moe);
    EXPECT_FALSE(p.keeps(Act::kH));
    EXPECT_FALSE(p.keeps(Act::kProj));
    // Gemma 3: each block's output normed before the residual add (its input kept for the
    // backward), GeGLU, and the sliding layers' own window and RoPE table.
    const bool gemma = f.config.arch == Arch::kGemma3;
    int out_norms = 0, geglus = 0;
    for (const Op& op : p.ops) {
      out_norms += op.kind == OpKind::kRmsNorm && op.in != Act::kH;
      geglus += op.kind == OpKind::kGeGlu;
    }
    EXPECT_EQ(out_norms, gemma ? 2 : 0) << "layer " << l;
    EXPECT_EQ(geglus, gemma ? 1 : 0) << "layer " << l;
    EXPECT_EQ(p.keeps(Act::kAttnOut), gemma);
    EXPECT_EQ(p.keeps(Act::kMlpOut), gemma);
    EXPECT_EQ(p.window, f.config.attention_window(static_cast<int64_t>(l)));
    EXPECT_EQ(p.local_rope, gemma && l != 1)
        << "layer " << l;  // the test model: sliding, full, sliding
  }
}

TEST(LayerProgram, BrokenDataFlowIsNamed) {
  const ModelFiles f = model_files("llama");
  auto w = load_model_weights(f.config, f.weights);
  ASSERT_TRUE(w.ok());
  LayerProgram p = w->programs[0];
  p.ops.push_back({OpKind::kLinear, Act::kXn1, Act::kQkvRaw, Param::kQkv});  // xn1 read twice
  EXPECT_NE(check_program(p).find("xn1 has a second reader"), std::string::npos)
      << check_program(p);
  p = w->programs[0];
  p.ops.push_back({OpKind::kSwiGlu, Act::kH, Act::kAct});  // the stream read by a non-norm
  EXPECT_NE(check_program(p).find("the stream is read by its norms"), std::string::npos)
      << check_program(p);
  p = w->programs[0];
  p.ops[0].keep = Act::kCount;
  EXPECT_NE(check_program(p).find("names where its input is kept"), std::string::npos);
  p = w->programs[0];  // a norm of something else naming a kept copy
  p.ops.push_back({OpKind::kRmsNorm, Act::kAct, Act::kProj, Param::kMlpOutNorm, Act::kHMid});
  EXPECT_NE(check_program(p).find("names where its input is kept"), std::string::npos);
}

TEST(LayerProgram, TheDeviceRefusesATensorParallelShard) {
  ModelFiles f = model_files("llama");
  f.config.tensor_parallel = 2;
  auto m = make_device_model(Device::kEmulated, f.config, f.weights, {4, 16}, nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("tensor_parallel 2"), std::string::npos) << m.message();
}

// A packed batch of two sequences through a training forward and backward on both backends.
TEST_P(LayerOps, EachOpGivesTheCpuBitsOnTheDevice) {
  const ModelFiles f = model_files(GetParam());
  const ModelConfig& c = f.config;
  auto cpu = Model::from_weights(c, f.weights);
  ASSERT_TRUE(cpu.ok()) << cpu.message();
  auto w = load_model_weights(c, f.weights);
  ASSERT_TRUE(w.ok());
  ThreadPool pool(2);
  auto made = make_device_model(Device::kEmulated, c, f.weights, {4, 16}, &pool);
  ASSERT_TRUE(made.ok()) << made.message();
  auto* dev = dynamic_cast<Emulated*>(made->get());
  ASSERT_NE(dev, nullptr);
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(37 + 21);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  const std::vector<SeqSpan> seqs = {{0, 0, 37}, {1, 0, 21}};
  auto cache = (*cpu)->make_kv_cache();
  ForwardTape tape;
  ForwardOptions o;
  o.tape = &tape;
  o.return_experts = c.num_moe_layers() > 0;
  auto a = (*cpu)->forward(tokens, seqs, *cache, o, &pool);
  ASSERT_TRUE(a.ok()) << a.message();
  auto b = dev->forward_train(tokens, seqs, true, {}, {}, {});
  ASSERT_TRUE(b.ok()) << b.message();

  // Forward: each kept activation, attributed to the last op that writes it.
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerProgram& p = w->programs[l];
    std::set<Act> seen;
    auto is_mark = [](const Op& op) {  // identity in the forward
      return op.kind == OpKind::kTpEnter || op.kind == OpKind::kTpExit;
    };
    for (const Op& op : p.ops) {
      if (is_mark(op)) continue;
      for (Act act : {op.keep, op.out}) {
        if (act == Act::kCount || !p.keeps(act)) continue;
        // in place ops rewrite their activation: compare after the last one
        bool rewritten = false;
        for (auto later = &op + 1; later != p.ops.data() + p.ops.size(); ++later)
          rewritten = rewritten || (later->out == act && !is_mark(*later));
        if (rewritten || !seen.insert(act).second) continue;
        auto got = dev->kept_activation(l, act);
        ASSERT_TRUE(got.ok()) << got.message();
        const std::vector<float>& want = tape.impl().layers[l][act];
        const int64_t at = first_difference(want, *got);
        EXPECT_EQ(at, -1) << "layer " << l << ", " << describe(op) << ": " << act_name(act)
                          << " differs at " << at;
      }
    }
  }
  ASSERT_EQ(first_difference(a->logits, b->logits), -1) << "logits";

  // Backward: each op's parameter gradients, in the order the backward runs them.
  std::vector<float> dlogits(a->logits.size());
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  for (float& x : dlogits) x = nd(rng);
  auto layout = ParamLayout::for_model(c, &f.weights);
  FlatTensors ga(layout), gb(layout);
  const Status cb = (*cpu)->backward(tape, dlogits, ga, &pool);
  ASSERT_TRUE(cb.ok()) << cb.message();
  ASSERT_TRUE(dev->backward(dlogits, gb, {}).ok());
  int64_t compared = 0;
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    const std::vector<Op>& ops = w->programs[l].ops;
    for (auto op = ops.rbegin(); op != ops.rend(); ++op) {
      std::vector<std::string> names;
      for (const auto& part : param_parts(c, l, op->param)) names.push_back(part.first);
      if (op->kind == OpKind::kMoe)  // the router and every expert
        for (const ParamSpec& s : layout->specs())
          if (s.name.starts_with("model.layers." + std::to_string(l) + ".mlp."))
            names.push_back(s.name);
      if (op->kind == OpKind::kMlaQkv)  // the latent path's (kv_b_proj's value rows: MLA's out op)
        for (const char* t : {"q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj"})
          if (const std::string n =
                  "model.layers." + std::to_string(l) + ".self_attn." + t + ".weight";
              layout->find(n))
            names.push_back(n);
      for (const std::string& name : names) {
        const int64_t at = first_difference(ga.get(name), gb.get(name));
        EXPECT_EQ(at, -1) << "layer " << l << ", backward of " << describe(*op) << ": d " << name
                          << " differs at " << at;
        ++compared;
      }
    }
  }
  // Every parameter of every layer belongs to an op.
  int64_t layer_params = 0;
  for (const ParamSpec& s : layout->specs()) layer_params += s.name.starts_with("model.layers.");
  EXPECT_EQ(compared, layer_params);
}

INSTANTIATE_TEST_SUITE_P(Models, LayerOps,
                         ::testing::Values("gemma3", "llama", "llama_bias", "llama_tied", "mistral",
                                           "phi3", "qwen2", "qwen3", "qwen3_moe",
                                           "qwen3_moe_nonorm", "glm4_moe", "glm4_moe_nonorm",
                                           "deepseek_v3", "deepseek_v3_noq"));

}  // namespace
}  // namespace miles
