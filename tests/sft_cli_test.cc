// `miles sft` as a user runs it: one JSON line per step; data-parallel layouts over real processes
// (Gloo on loopback) give the single-process loss and grad norm bit for bit; YAML configs; bad
// data, layouts and configs exit 1 with a message naming the file and line.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_run.h"
#include "miles/checkpoint.h"
#include "miles/model.h"
#include "test_paths.h"

namespace miles {
namespace {

using test::CliRun;
using test::miles_binary;
using test::run_miles;

using test::steps_of;

std::string stories() { return test::shared_dir() + "/models/stories260K/stories260K.bin"; }
std::string data(const std::string& f) { return test::data_dir() + "/sft/" + f; }

TEST(SftCli, PrintsOneLinePerStepAndLearns) {
  MILES_REQUIRE_SHARED();
  CliRun r = run_miles("sft --model " + stories() + " --data " + data("stories.jsonl") +
                           " --steps 8 --lr 2e-3 --batch-size 4",
                       false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto s = steps_of(r.out);
  ASSERT_EQ(s.size(), 8u) << r.out;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(s[i]["step"], i + 1);
    for (const char* k : {"loss", "grad_norm", "lr", "tokens"}) EXPECT_TRUE(s[i].contains(k)) << k;
  }
  EXPECT_LT(s[7]["loss"].get<double>(), 0.5 * s[0]["loss"].get<double>());
}

// Data parallelism (power-of-two dp dividing the micro-batch count) and pipeline parallelism (1F1B,
// any stage split, tied embeddings shared by the first and last stage) reproduce the single process
// exactly: every reduction keeps the single-process order.
void expect_layouts_match(const std::string& model, int64_t micro_batch_size,
                          std::initializer_list<const char*> layouts) {
  const std::string job = "sft --model " + model + " --data " + data("ids.jsonl") +
                          " --steps 3 --lr 1e-3 --batch-size 8 --threads 1 --micro-batch-size " +
                          std::to_string(micro_batch_size) + " ";
  CliRun one = run_miles(job + "--layout dp=1", false);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto ref = steps_of(one.out);
  ASSERT_EQ(ref.size(), 3u);
  for (const char* layout : layouts) {
    CliRun r = run_miles(job + "--layout " + layout);  // stderr too: a failing rank says why
    ASSERT_EQ(r.exit_code, 0) << layout << ": " << r.out;
    const auto got = steps_of(r.out);
    ASSERT_EQ(got.size(), 3u) << layout << ": only rank 0 prints";
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(got[i]["loss"].get<double>(), ref[i]["loss"].get<double>())
          << layout << " step " << i;
      EXPECT_EQ(got[i]["grad_norm"].get<double>(), ref[i]["grad_norm"].get<double>()) << layout;
    }
  }
}

TEST(SftCli, ParallelLayoutsGiveTheSingleProcessLossAndGradNormBitForBit) {
  MILES_REQUIRE_SHARED();
  // stories260K: 5 layers, tied embedding.
  expect_layouts_match(stories(), 2, {"dp=2", "dp=4,pp=1,tp=1", "pp=2", "pp=5", "dp=2,pp=2"});
}

// A device trainer (--device emulated: the CUDA kernels' code run as host loops), alone and as two
// data-parallel ranks, prints the CPU single process's losses and grad norms bit for bit.
TEST(SftCli, DeviceTrainerGivesTheCpuLossAndGradNormBitForBit) {
  MILES_REQUIRE_SHARED();
  expect_layouts_match(stories(), 2, {"dp=1 --device emulated", "dp=2 --device emulated"});
  expect_layouts_match(test::data_dir() + "/models/qwen3", 2, {"dp=1 --device emulated"});
}

TEST(SftCli, PipelineLayoutsOfMoeAndQwen3ModelsMatchTheSingleProcess) {
  expect_layouts_match(test::data_dir() + "/models/qwen3_moe", 1,
                       {"pp=2", "dp=2,pp=2", "dp=4,pp=2"});
  expect_layouts_match(test::data_dir() + "/models/qwen3", 2, {"dp=2,pp=2"});
}

// Tensor parallelism: the row-parallel products (o_proj, down_proj, experts' down_proj) reduce
// their K slices in the full product's chunks and the vocabulary's softmax sums split on chunk
// boundaries, so the forward is the single process's bit for bit: on the same weights (step 1) the
// loss is equal. Column-parallel input gradients add the ranks' partials off the single-process
// tree, so the grad norm (and after one update the weights) agree within 1e-6 relative; every
// tensor-parallel layout (mixed with dp and pp) agrees with every other bit for bit.
TEST(SftCli, TensorParallelLayoutsGiveTheSingleProcessLossBitwiseAndGradNormWithin1e6) {
  MILES_REQUIRE_SHARED();
  for (const std::string model : {stories(), test::data_dir() + "/models/qwen3_moe"}) {
    const std::string job = "sft --model " + model + " --data " + data("ids.jsonl") +
                            " --steps 2 --lr 1e-3 --batch-size 8 --micro-batch-size 2 --threads 1 ";
    CliRun one = run_miles(job + "--layout dp=1", false);
    ASSERT_EQ(one.exit_code, 0) << one.out;
    const auto ref = steps_of(one.out);
    ASSERT_EQ(ref.size(), 2u);
    std::vector<nlohmann::json> first_tp;
    for (const char* layout : {"tp=2", "dp=2,tp=2", "pp=2,tp=2"}) {
      CliRun r = run_miles(job + "--layout " + layout);  // stderr too: a failing rank says why
      ASSERT_EQ(r.exit_code, 0) << layout << ": " << r.out;
      const auto got = steps_of(r.out);
      ASSERT_EQ(got.size(), 2u) << layout;
      EXPECT_EQ(got[0]["loss"].get<double>(), ref[0]["loss"].get<double>())
          << model << " " << layout;
      for (const char* k : {"loss", "grad_norm"}) {
        const double want = ref[1][k].get<double>(), have = got[1][k].get<double>();
        EXPECT_LE(std::fabs(have - want), 1e-6 * std::fabs(want))
            << model << " " << layout << " step 2 " << k;
      }
      {
        const double want = ref[0]["grad_norm"].get<double>();
        EXPECT_LE(std::fabs(got[0]["grad_norm"].get<double>() - want), 1e-6 * want) << layout;
      }
      if (first_tp.empty()) {
        first_tp = got;
      } else {
        for (int i = 0; i < 2; ++i)
          for (const char* k : {"loss", "grad_norm"})
            EXPECT_EQ(got[i][k].get<double>(), first_tp[i][k].get<double>()) << layout << " " << k;
      }
    }
  }
}

// Biases (tests/data/models/llama_bias: transformers' LlamaForCausalLM with attention_bias and
// mlp_bias; qwen2: Qwen2ForCausalLM, q/k/v biases, tied): `miles sft` trains every bias and saves
// them under a config that says so, and tensor-parallel ranks (q/k/v and gate/up biases split by
// rows, o_proj's and down_proj's added after the sum) give the single process's losses and grad
// norms within 1e-6.
// `job` with --layout tp=2: its first two steps' losses and grad norms within 1e-6 of `ref`'s.
void expect_tensor_parallel_within_1e6(const std::string& job,
                                       const std::vector<nlohmann::json>& ref,
                                       const std::string& what) {
  CliRun tp = run_miles(job + "--layout tp=2");
  ASSERT_EQ(tp.exit_code, 0) << tp.out;
  const auto got = steps_of(tp.out);
  ASSERT_EQ(got.size(), 2u);
  for (int i = 0; i < 2; ++i)
    for (const char* k : {"loss", "grad_norm"}) {
      const double want = ref[i][k].get<double>(), have = got[i][k].get<double>();
      EXPECT_LE(std::fabs(have - want), 1e-6 * std::fabs(want))
          << what << " step " << i + 1 << " " << k;
    }
}

// `job` resumed from DIR/a's step-2 checkpoint (copied to DIR/b) runs steps 3 and 4 with the
// straight run's losses and grad norms (`ref`, four steps), bit for bit.
void expect_resume_from_step_2(const std::string& job, const std::string& dir,
                               const std::vector<nlohmann::json>& ref) {
  std::filesystem::create_directories(dir + "/b");
  std::filesystem::copy(dir + "/a/step_00000002", dir + "/b/step_00000002",
                        std::filesystem::copy_options::recursive);
  CliRun resumed = run_miles(job + "--steps 4 --resume --save-dir " + dir + "/b", false);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  const auto res = steps_of(resumed.out);
  ASSERT_EQ(res.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(res[i]["loss"].get<double>(), ref[i + 2]["loss"].get<double>());
    EXPECT_EQ(res[i]["grad_norm"].get<double>(), ref[i + 2]["grad_norm"].get<double>());
  }
}

TEST(SftCli, BiasesTrainSaveAndSplitOverTensorParallelRanks) {
  for (const std::string name : {"llama_bias", "qwen2"}) {
    const std::string model = test::data_dir() + "/models/" + name;
    const std::string dir = test::binary_dir() + "/sft_cli_bias_" + name;
    std::filesystem::remove_all(dir);
    const std::string job = "sft --model " + model + " --data " + data("ids.jsonl") +
                            " --steps 2 --lr 1e-2 --batch-size 4 --micro-batch-size 2 --threads 1 ";
    CliRun one = run_miles(job + "--save-dir " + dir, false);
    ASSERT_EQ(one.exit_code, 0) << one.out;
    const auto ref = steps_of(one.out);
    ASSERT_EQ(ref.size(), 2u);
    expect_tensor_parallel_within_1e6(job, ref, name);
    auto saved = load_model_files(dir + "/step_00000002");
    ASSERT_TRUE(saved.ok()) << saved.message();
    auto before = load_model_files(model);
    ASSERT_TRUE(before.ok());
    EXPECT_EQ(saved->config.arch, before->config.arch) << name;
    EXPECT_EQ(saved->config.mlp_bias, before->config.mlp_bias) << name;
    EXPECT_TRUE(saved->config.attention_bias) << name;
    std::vector<std::string> biases = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                       "self_attn.v_proj.bias"};
    if (name == "llama_bias")
      biases.insert(biases.end(), {"self_attn.o_proj.bias", "mlp.gate_proj.bias",
                                   "mlp.up_proj.bias", "mlp.down_proj.bias"});
    for (const std::string& b : biases) {
      const std::string full = "model.layers.1." + b;
      ASSERT_TRUE(saved->weights.contains(full)) << full << " was not saved";
      std::vector<float> x, y;
      saved->weights.find(full)->to_f32(x);
      before->weights.find(full)->to_f32(y);
      EXPECT_NE(x, y) << name << ": " << full << " did not train";
    }
    EXPECT_EQ(saved->weights.contains("model.layers.1.self_attn.o_proj.bias"),
              name == "llama_bias");
  }
}

// Phi-3 (tests/data/models/phi3: transformers' Phi3ForCausalLM, fused qkv_proj and gate_up_proj,
// partial rotary, sliding window 7): trained with its projections split as the model names them,
// split again over tensor-parallel ranks (within 1e-6), saved fused as transformers loads it, and
// resumed from that checkpoint bit for bit.
TEST(SftCli, Phi3SavesFusedProjectionsSplitsOverRanksAndResumes) {
  const std::string model = test::data_dir() + "/models/phi3";
  const std::string dir = test::binary_dir() + "/sft_cli_phi3";
  std::filesystem::remove_all(dir);
  const std::string job = "sft --model " + model + " --data " + data("ids.jsonl") +
                          " --lr 1e-2 --batch-size 4 --micro-batch-size 2 --threads 1 ";
  CliRun straight = run_miles(job + "--steps 4 --save-every 2 --save-dir " + dir + "/a", false);
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  const auto ref = steps_of(straight.out);
  ASSERT_EQ(ref.size(), 4u);
  expect_tensor_parallel_within_1e6(job + "--steps 2 ", ref, "phi3");
  auto stored = read_safetensors(dir + "/a/step_00000002/model.safetensors");
  ASSERT_TRUE(stored.ok()) << stored.message();
  EXPECT_TRUE(stored->contains("model.layers.1.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(stored->contains("model.layers.1.mlp.gate_up_proj.weight"));
  EXPECT_FALSE(stored->contains("model.layers.1.self_attn.q_proj.weight"));
  auto saved = load_model_files(dir + "/a/step_00000002");
  ASSERT_TRUE(saved.ok()) << saved.message();
  EXPECT_EQ(saved->config.arch, Arch::kPhi3);
  EXPECT_EQ(saved->config.sliding_window, 7);
  EXPECT_EQ(saved->config.rotary_dim(), 8);
  EXPECT_TRUE(saved->weights.contains("model.layers.1.self_attn.v_proj.weight"));
  // Resumed from the fused checkpoint: steps 3 and 4 as the straight run's.
  expect_resume_from_step_2(job, dir, ref);
}

// Gemma 3 (tests/data/models/gemma3: transformers' Gemma3ForCausalLM, (1 + w) norms before and
// after each block, GeGLU, scaled tied embeddings, sliding and full layers with their own RoPEs):
// trained over tensor-parallel ranks within 1e-6 and over pipeline stages bit for bit, saved under
// Gemma's names with the config transformers reads, and resumed from that checkpoint bit for bit.
TEST(SftCli, Gemma3TrainsSplitsSavesAndResumes) {
  const std::string model = test::data_dir() + "/models/gemma3";
  const std::string dir = test::binary_dir() + "/sft_cli_gemma3";
  std::filesystem::remove_all(dir);
  const std::string job = "sft --model " + model + " --data " + data("ids.jsonl") +
                          " --lr 1e-2 --batch-size 4 --micro-batch-size 2 --threads 1 ";
  CliRun straight = run_miles(job + "--steps 4 --save-every 2 --save-dir " + dir + "/a", false);
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  const auto ref = steps_of(straight.out);
  ASSERT_EQ(ref.size(), 4u);
  expect_tensor_parallel_within_1e6(job + "--steps 2 ", ref, "gemma3");
  CliRun pp = run_miles(job + "--steps 2 --layout pp=3");
  ASSERT_EQ(pp.exit_code, 0) << pp.out;
  const auto staged = steps_of(pp.out);
  ASSERT_EQ(staged.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(staged[i]["loss"].get<double>(), ref[i]["loss"].get<double>());
    EXPECT_EQ(staged[i]["grad_norm"].get<double>(), ref[i]["grad_norm"].get<double>());
  }
  auto saved = load_model_files(dir + "/a/step_00000002");
  ASSERT_TRUE(saved.ok()) << saved.message();
  EXPECT_EQ(saved->config.arch, Arch::kGemma3);
  EXPECT_EQ(saved->config.sliding_layers, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(saved->config.rope.type, RopeConfig::Type::kLinear);
  EXPECT_EQ(saved->config.query_pre_attn_scalar, 32.0);
  for (const char* n : {"post_attention_layernorm", "pre_feedforward_layernorm",
                        "post_feedforward_layernorm", "self_attn.q_norm"})
    EXPECT_TRUE(saved->weights.contains("model.layers.2." + std::string(n) + ".weight")) << n;
  EXPECT_FALSE(saved->weights.contains("lm_head.weight"));  // tied
  expect_resume_from_step_2(job, dir, ref);
}

TEST(SftCli, YamlConfigAndFlagsThatOverrideIt) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::binary_dir() + "/sft_cli_tmp";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/job.yaml");
    f << "model: " << stories() << "\ndata: " << data("ids.jsonl") << "\nsteps: 2\nlr: 1e-3\n"
      << "batch_size: 4\nlayout: dp=1\n";
  }
  CliRun r = run_miles("sft --config " + dir + "/job.yaml --steps 3", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(steps_of(r.out).size(), 3u);
  {
    std::ofstream f(dir + "/bad.yaml");
    f << "model: " << stories() << "\ndata: " << data("ids.jsonl") << "\nlearning_rate: 1\n";
  }
  CliRun b = run_miles("sft --config " + dir + "/bad.yaml");
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_NE(b.out.find("bad.yaml:3"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("learning_rate"), std::string::npos) << b.out;
}

TEST(SftCli, BadInputExitsOneWithAReason) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::binary_dir() + "/sft_cli_tmp";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/bad.jsonl");
    f << "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 99999]}\n";
  }
  const std::string base = "sft --model " + stories() + " ";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--data " + dir + "/bad.jsonl", "bad.jsonl:2"},
      {"--data " + dir + "/missing.jsonl", "cannot open"},
      {"--data " + data("ids.jsonl") + " --layout tp=3", "num_attention_heads = 8 does not split"},
      {"--data " + data("ids.jsonl") + " --layout pp=6", "exceeds the model's 5 layers"},
      {"--data " + data("ids.jsonl") + " --layout dp=0", "dp"},
      {"--data " + data("ids.jsonl") + " --batch-size 6 --layout dp=4", "split evenly"},
      {"--data " + data("ids.jsonl") + " --decay linear", "--decay"},
      {"", "--data"},
  };
  for (const Case& c : cases) {
    CliRun r = run_miles(base + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << ": " << r.out;
  }
}

TEST(SftCli, AWorkerWhosePeerNeverComesFailsWithinItsTimeout) {
  MILES_REQUIRE_SHARED();
  // A store nobody serves: rank 1 of 2 waits for the group (parallel.timeout_s), then reports
  // itself by number.
  const std::string dir = test::binary_dir() + "/sft_cli_tmp";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/worker.yaml");
    f << "model: {path: " << stories() << "}\nsft: {data: " << data("ids.jsonl")
      << "}\ntrainer: {global_batch_size: 4}\nparallel: {dp: 2, comm: gloo, timeout_s: 2}\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  CliRun r = run_miles("train-worker --rank 1 --world-size 2 --store 127.0.0.1:1 --config " + dir +
                       "/worker.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
}

std::vector<nlohmann::json> metrics_of(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::stringstream text;
  text << in.rdbuf();
  return steps_of(text.str());
}

void expect_same_steps(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]) << what;
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << what << " step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>())
        << what << " step " << i + 1;
  }
}

// An SFT job file (`sft:` section) through `miles run`: the job layer of RL jobs — its run
// directory, its trainer group of `miles train-worker` ranks (started here, or one joining from
// "another host" through the controller service), its TensorBoard — gives `miles sft`'s numbers
// bit for bit.
TEST(SftJob, AJobFileRunsOnTheTrainerGroupWithSftsNumbers) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::binary_dir() + "/sft_job";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/job.yaml");
    f << "model: {path: " << stories() << "}\nsft: {data: " << data("ids.jsonl")
      << ", steps: 3}\ntrainer: {global_batch_size: 4, micro_batch_size: 1, lr: 1.0e-3}\n"
      << "logging: {progress: lines}\n";
  }
  CliRun sft = run_miles("sft --model " + stories() + " --data " + data("ids.jsonl") +
                             " --steps 3 --lr 1e-3 --batch-size 4 --micro-batch-size 1",
                         false);
  ASSERT_EQ(sft.exit_code, 0) << sft.out;
  const auto want = steps_of(sft.out);
  ASSERT_EQ(want.size(), 3u) << sft.out;

  CliRun one = run_miles("run " + dir + "/job.yaml --run-dir " + dir + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  expect_same_steps(metrics_of(dir + "/one"), want, "miles run, one rank");
  EXPECT_NE(one.out.find("miles run: 3 SFT steps"), std::string::npos) << one.out;
  EXPECT_FALSE(std::filesystem::is_empty(dir + "/one/tensorboard"));
  std::ifstream cfg_in(dir + "/one/config.yaml");
  const std::string cfg((std::istreambuf_iterator<char>(cfg_in)), {});
  EXPECT_NE(cfg.find("\nsft:\n"), std::string::npos) << cfg;
  EXPECT_EQ(cfg.find("rollout:"), std::string::npos) << "an SFT job writes only its keys\n" << cfg;

  CliRun dp = run_miles("run " + dir + "/job.yaml --run-dir " + dir + "/dp parallel.dp=2");
  ASSERT_EQ(dp.exit_code, 0) << dp.out;
  EXPECT_NE(dp.out.find("trainer group: 2 ranks"), std::string::npos) << dp.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/dp/trainer_rank_1.log"));
  expect_same_steps(metrics_of(dir + "/dp"), want, "dp=2");

  // Pipeline stage 1 joins as a remote rank, as `miles train-worker --controller` from Slurm would.
  const std::string remote = dir + "/remote";
  const std::string bin = "'" + miles_binary() + "'";
  const std::string worker =
      "(while [ ! -s " + remote + "/controller.json ]; do sleep 0.1; done; exec " + bin +
      " train-worker --controller \"$(sed -n 's/.*\"address\":\"\\([^\"]*\\)\".*/\\1/p' " + remote +
      "/controller.json)\" > " + dir + "/worker.log 2>&1) & ";
  CliRun r = test::run_shell("export MILES_RUN_TOKEN=sft-remote-token; " + worker + bin + " run " +
                             dir + "/job.yaml --run-dir " + remote +
                             " parallel.pp=2 parallel.comm=gloo parallel.remote_ranks=1 2>&1;"
                             " rc=$?; wait; exit $rc");
  std::ifstream log_in(dir + "/worker.log");
  const std::string worker_log((std::istreambuf_iterator<char>(log_in)), {});
  ASSERT_EQ(r.exit_code, 0) << r.out << "\n--- worker:\n" << worker_log;
  EXPECT_NE(r.out.find("trainer rank 1 joined from 127.0.0.1"), std::string::npos) << r.out;
  EXPECT_NE(worker_log.find("rank 1 of 2"), std::string::npos) << worker_log;
  expect_same_steps(metrics_of(remote), want, "pp=2 with a remote rank");
}

// An SFT job is refused what only RL jobs use, and RL's commands refuse an SFT job.
TEST(SftJob, RlKeysAndRlCommandsAreRefused) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::binary_dir() + "/sft_job_refused";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/job.yaml");
    f << "model: {path: " << stories() << "}\nsft: {data: " << data("ids.jsonl")
      << "}\nrollout: {num_rollouts: 3}\n";
  }
  CliRun r = run_miles("run " + dir + "/job.yaml --run-dir " + dir + "/run");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("job.yaml:3: rollout.num_rollouts: not used by an SFT job"),
            std::string::npos)
      << r.out;
  {
    std::ofstream f(dir + "/job.yaml");
    f << "model: {path: " << stories() << "}\nsft: {data: " << data("ids.jsonl") << "}\n";
  }
  CliRun c = run_miles("check " + dir + "/job.yaml --run-dir " + dir + "/run");
  EXPECT_EQ(c.exit_code, 1) << c.out;
  EXPECT_NE(c.out.find("an SFT job"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Four straight steps (checkpoints at 2 and 4) against two steps, then a resume from step 2 with
// `resume_flags` for two more: the resumed steps and the final checkpoint's bytes are the straight
// run's.
void expect_resume_bit_identical(const std::string& name, const std::string& resume_flags) {
  const std::string dir = test::binary_dir() + "/" + name;
  std::filesystem::remove_all(dir);
  const std::string job = "sft --model " + stories() + " --data " + data("ids.jsonl") +
                          " --lr 1e-3 --warmup-steps 2 --batch-size 4 --micro-batch-size 2 ";
  CliRun straight = run_miles(job + "--steps 4 --save-every 2 --save-dir " + dir + "/a", false);
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  CliRun first = run_miles(job + "--steps 2 --save-dir " + dir + "/b", false);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  CliRun resumed =
      run_miles(job + "--steps 4 --resume " + resume_flags + " --save-dir " + dir + "/b", false);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  const auto a = steps_of(straight.out), b = steps_of(resumed.out);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 2u) << "the resumed run starts at step 3";
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i]["step"], a[i + 2]["step"]);
    EXPECT_EQ(b[i]["loss"].get<double>(), a[i + 2]["loss"].get<double>());
    EXPECT_EQ(b[i]["grad_norm"].get<double>(), a[i + 2]["grad_norm"].get<double>());
  }
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string x = file_bytes(dir + "/a/step_00000004/" + f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == file_bytes(dir + "/b/step_00000004/" + f)) << f << " differs after resume";
  }
}

TEST(SftCli, ResumedRunContinuesBitIdentically) {
  MILES_REQUIRE_SHARED();
  expect_resume_bit_identical("sft_cli_resume", "--layout dp=2,pp=2");
}

// Checkpoints cross devices: two steps on the CPU, then resumed on a device trainer (emulated).
TEST(SftCli, ACpuCheckpointResumesOnADeviceBitIdentically) {
  MILES_REQUIRE_SHARED();
  expect_resume_bit_identical("sft_cli_resume_device", "--device emulated");
}

TEST(SftCli, TensorParallelRunResumesBitIdentically) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::binary_dir() + "/sft_cli_resume_tp";
  std::filesystem::remove_all(dir);
  const std::string job = "sft --model " + stories() + " --data " + data("ids.jsonl") +
                          " --lr 1e-3 --batch-size 4 --micro-batch-size 2 --layout tp=2 ";
  CliRun straight = run_miles(job + "--steps 4 --save-every 2 --save-dir " + dir + "/a", false);
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  ASSERT_EQ(run_miles(job + "--steps 2 --save-dir " + dir + "/b", false).exit_code, 0);
  CliRun resumed = run_miles(job + "--steps 4 --resume --save-dir " + dir + "/b", false);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string x = file_bytes(dir + "/a/step_00000004/" + f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == file_bytes(dir + "/b/step_00000004/" + f)) << f << " differs after resume";
  }
}

}  // namespace
}  // namespace miles
