// `miles check`: the train–rollout gate on real engine processes — dense (stories260K) and MoE
// (R3 replay) pass with every difference exactly zero, including gradient norms on dp / pp
// layouts; a gate that cannot hold (tensor parallelism at tolerance 0) fails the command.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Checked {
  int exit_code;
  std::string out;
  json report;
};

Checked check(const std::string& config, const std::string& name, const std::string& extra = "") {
  const std::string dir = test::scratch_dir("miles_check_", name);  // removed when the test exits
  const test::CliRun r =
      test::run_miles_in_source("check " + config + " --run-dir " + dir + " " + extra);
  Checked c{r.exit_code, r.out, json()};
  std::ifstream in(dir + "/check.json");
  if (in) c.report = json::parse(in, nullptr, false);
  return c;
}

const json* gate(const json& report, const std::string& name) {
  for (const json& g : report["gates"])
    if (g["gate"] == name) return &g;
  return nullptr;
}

TEST(Check, DenseModelAgreesBitForBitOnEveryGate) {
  MILES_REQUIRE_SHARED();
  Checked c = check("configs/ci_check.yaml", "dense");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  ASSERT_TRUE(c.report.is_object()) << c.out;
  EXPECT_TRUE(c.report["passed"].get<bool>());
  for (const char* g : {"tito_token_mismatches",
                        "logp_abs_diff_max",
                        "rollout_kl",
                        "ess",
                        "step0_ppo_kl_abs",
                        "step0_clipfrac",
                        "weight_checksum_mismatches",
                        "grad_norm_dp=2_rel_diff",
                        "grad_norm_pp=2_rel_diff",
                        "grad_norm_dp=2,pp=2_rel_diff",
                        "grad_norm_tp=2_rel_diff",
                        "grad_norm_pp=2,tp=2_rel_diff",
                        "logp_over_limit_dp=2",
                        "logp_over_limit_pp=2",
                        "logp_over_limit_dp=2,pp=2",
                        "logp_over_limit_tp=2",
                        "logp_over_limit_pp=2,tp=2",
                        "spec_on_vs_off_mismatched_samples",
                        "spec_verify_steps",
                        "engine_vs_in_process_mismatched_samples"}) {
    const json* x = gate(c.report, g);
    ASSERT_NE(x, nullptr) << g;
    EXPECT_TRUE((*x)["passed"].get<bool>()) << x->dump();
  }
  EXPECT_EQ((*gate(c.report, "logp_abs_diff_max"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "grad_norm_dp=2_rel_diff"))["value"], 0.0);
  // Speculative decoding verified drafts and changed no sample.
  EXPECT_EQ((*gate(c.report, "spec_on_vs_off_mismatched_samples"))["value"], 0.0);
  EXPECT_GT(c.report["speculative"]["accepted_tokens"].get<int64_t>(), 0);
  // Tensor parallel: every rank's logprobs equal the engine's (limit 0), gradients within 1e-6.
  EXPECT_EQ((*gate(c.report, "logp_over_limit_tp=2"))["value"], 0.0);
  EXPECT_LE((*gate(c.report, "grad_norm_tp=2_rel_diff"))["value"].get<double>(), 1e-6);
  EXPECT_GT(c.report["grad_norm"].get<double>(), 0.0);  // the gradients compared are not zero
  // Every token in the exact-zero bin of the histogram.
  EXPECT_EQ(c.report["logp_abs_diff_histogram"]["tokens"][0], c.report["tokens"]);
  EXPECT_NE(c.out.find("miles check: passed"), std::string::npos) << c.out;
}

// Another rollout batch size (other engine batches, other micro-batch splits): still exactly 0.
TEST(Check, AnotherRolloutBatchSizeStillAgreesBitForBit) {
  MILES_REQUIRE_SHARED();
  Checked c = check("configs/ci_check.yaml", "batch2",
                    "rollout.rollout_batch_size=2 trainer.global_batch_size=16 "
                    "trainer.micro_batch_size=2 'check.layouts=[dp=2]'");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_EQ((*gate(c.report, "logp_abs_diff_max"))["value"], 0.0);
  EXPECT_EQ(c.report["samples"], 16);
}

// The other families (tests/data/models/<name>_v512: transformers' random-weight checkpoints cut
// to stories260K's 512 tokens): Qwen2 (q/k/v biases, a tied head), Mistral (a sliding window of 5
// on every layer: the engine's windowed decode over the paged cache against the trainer's windowed
// packed forward), Phi-3 (fused projections split at load, partial rotary, a window of 7) and Gemma
// 3 (GeGLU, (1 + w) norms around each block, scaled embeddings, sliding and full layers with their
// own RoPEs):
// engine and trainer agree bit for bit, on data- and pipeline-parallel layouts too.
class FamilyCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyCheck, EngineAndTrainerAgreeBitForBit) {
  MILES_REQUIRE_SHARED();
  const std::string name = GetParam();
  Checked c =
      check("configs/ci_check.yaml", name,
            "model.path=tests/data/models/" + name + "_v512 model.tokenizer=" + test::shared_dir() +
                "/models/stories260K/tok512.bin 'check.layouts=[dp=2,pp=2]'");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  ASSERT_TRUE(c.report.is_object()) << c.out;
  EXPECT_TRUE(c.report["passed"].get<bool>());
  EXPECT_EQ((*gate(c.report, "tito_token_mismatches"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "logp_abs_diff_max"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "grad_norm_dp=2_rel_diff"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "grad_norm_pp=2_rel_diff"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "logp_over_limit_pp=2"))["value"], 0.0);
  EXPECT_GT(c.report["grad_norm"].get<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyCheck,
                         ::testing::Values("qwen2", "mistral", "phi3", "gemma3"));

TEST(Check, MoeModelReplaysEveryRoutedExpert) {
  MILES_REQUIRE_SHARED();
  Checked c = check("configs/ci_check_moe.yaml", "moe");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  const json* r3 = gate(c.report, "r3_agreement_replay_on");
  ASSERT_NE(r3, nullptr) << c.report.dump();
  EXPECT_EQ((*r3)["value"], 1.0);
  EXPECT_TRUE(c.report.contains("r3_agreement_replay_off"));
  EXPECT_EQ((*gate(c.report, "routed_experts_shape_mismatches"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "logp_abs_diff_max"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "logp_over_limit_tp=2"))["value"], 0.0);  // experts split over ranks
  EXPECT_GT(c.report["grad_norm"].get<double>(), 0.0);
}

// A MoE family's check on the given layouts: every routed expert replayed, logprobs bit for bit on
// each layout (logp_over_limit_<layout> 0), gradient norms of the dp / pp layouts equal to the
// single process's, of tp layouts within 1e-6 (MLA's one latent head sums its gradient over the
// query heads of every rank: 1.3e-8 measured).
void expect_moe_family_exact(const std::string& model, const std::string& name,
                             const std::vector<std::string>& layouts) {
  std::string list;
  for (const std::string& l : layouts) list += (list.empty() ? "" : ",") + l;
  Checked c = check("configs/ci_check_moe.yaml", name,
                    "model.path=tests/data/models/" + model + " 'check.layouts=[" + list + "]'");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_EQ((*gate(c.report, "r3_agreement_replay_on"))["value"], 1.0);
  EXPECT_EQ((*gate(c.report, "routed_experts_shape_mismatches"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "logp_abs_diff_max"))["value"], 0.0);
  for (const std::string& l : layouts) {
    EXPECT_EQ((*gate(c.report, "logp_over_limit_" + l))["value"], 0.0) << l;
    const double grad = (*gate(c.report, "grad_norm_" + l + "_rel_diff"))["value"].get<double>();
    if (l.starts_with("tp")) {
      EXPECT_LE(grad, 1e-6) << l;  // the trainer's stated tensor-parallel tolerance
    } else {
      EXPECT_EQ(grad, 0.0) << l;
    }
  }
  EXPECT_GT(c.report["grad_norm"].get<double>(), 0.0);
}

// DeepSeek-V3 (tests/data/models/deepseek_v3_v512): multi-head latent attention (the engine's
// paged cache holds the latent) and GLM-4 MoE's routing, on data- and pipeline-parallel layouts
// and its heads split over tp=2 ranks (the latent replicated).
TEST(Check, DeepseekV3MlaAndMoeAgreeBitForBit) {
  MILES_REQUIRE_SHARED();
  expect_moe_family_exact("deepseek_v3_v512", "deepseek", {"dp=2", "tp=2", "pp=3"});
}

// GLM-4 MoE (tests/data/models/glm4_moe_v512): grouped sigmoid routing with its score-correction
// bias, a shared expert and a dense first layer; the shared and routed experts split over tp=2
// ranks, its three layers over pp=3 stages.
TEST(Check, GlmMoeModelReplaysEveryRoutedExpert) {
  MILES_REQUIRE_SHARED();
  expect_moe_family_exact("glm4_moe_v512", "glm_moe", {"dp=2", "tp=2", "pp=3"});
}

// The MoE gates with the engine and the trainer on the (emulated) device: the experts the engine
// records are the ones the trainer replays, for 100 % of tokens, the logprobs agree bit for bit,
// and the model-parallel layouts (run on the CPU: a device trainer is data-parallel only) give the
// device trainer's gradient norm.
TEST(Check, MoeModelOnADeviceEngineReplaysEveryRoutedExpert) {
  MILES_REQUIRE_SHARED();
  Checked c = check("configs/ci_check_moe.yaml", "moe_device",
                    "rollout.engine_device=emulated trainer.device=emulated");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_EQ((*gate(c.report, "r3_agreement_replay_on"))["value"], 1.0);
  EXPECT_EQ((*gate(c.report, "routed_experts_shape_mismatches"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "logp_abs_diff_max"))["value"], 0.0);
  EXPECT_EQ((*gate(c.report, "grad_norm_pp=2_rel_diff"))["value"], 0.0);
  EXPECT_TRUE(c.report["passed"].get<bool>()) << c.report.dump();
}

TEST(Check, AGateThatDoesNotHoldFailsTheCommand) {
  MILES_REQUIRE_SHARED();
  // Tensor-parallel gradients are within 1e-6, not bitwise: at tolerance 0 the grad-norm gate fails
  // (its logprobs still pass: the forward is bitwise).
  Checked strict = check("configs/ci_check.yaml", "tp_strict",
                         "'check.layouts=[tp=2]' check.grad_norm_rel_tol_tp=0");
  EXPECT_EQ(strict.exit_code, 1) << strict.out;
  const json* tp = gate(strict.report, "grad_norm_tp=2_rel_diff");
  ASSERT_NE(tp, nullptr) << strict.out;
  EXPECT_FALSE((*tp)["passed"].get<bool>());
  EXPECT_GT((*tp)["value"].get<double>(), 0.0);
  EXPECT_LT((*tp)["value"].get<double>(), 1e-5);
  EXPECT_NE(strict.out.find("FAIL"), std::string::npos);
  const json* logp = gate(strict.report, "logp_over_limit_tp=2");
  ASSERT_NE(logp, nullptr) << strict.out;
  EXPECT_TRUE((*logp)["passed"].get<bool>()) << logp->dump();
  Checked loose = check("configs/ci_check.yaml", "tp_loose",
                        "'check.layouts=[tp=2]' check.grad_norm_rel_tol_tp=1e-5");
  EXPECT_EQ(loose.exit_code, 0) << loose.out;
}

}  // namespace
}  // namespace miles
