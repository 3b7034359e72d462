// The job config (miles/controller/run_config.h): a file setting every key reads into every field,
// defaults and derived directories, run_config_to_yaml round trips, and configs/reference.yaml
// loads and documents exactly the defaults and every key. Errors: run_config_errors_test.cc and
// run_config_validate_test.cc.
#include "miles/controller/run_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "controller/run_config_internal.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace rci = run_config_internal;

// Every key, none at its default, all valid together (line 1 is a comment).
std::string full_path() { return test::data_dir() + "/run_config/full.yaml"; }

// Field by field, through the schema (so a key missing from it shows up in FullConfig instead).
void expect_equal(RunConfig a, RunConfig b) {
  EXPECT_EQ(a.source, b.source);
  auto sa = rci::sections_of(a), sb = rci::sections_of(b);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t s = 0; s < sa.size(); ++s) {
    for (size_t f = 0; f < sa[s].fields.size(); ++f) {
      std::visit([&](auto* x) { EXPECT_EQ(*x, *std::get<decltype(x)>(sb[s].fields[f].ptr)); },
                 sa[s].fields[f].ptr);
    }
  }
  ASSERT_EQ(a.rewards.size(), b.rewards.size());
  for (size_t r = 0; r < a.rewards.size(); ++r) {
    auto fa = rci::reward_fields(a.rewards[r]), fb = rci::reward_fields(b.rewards[r]);
    for (size_t f = 0; f < fa.size(); ++f) {
      std::visit([&](auto* x) { EXPECT_EQ(*x, *std::get<decltype(x)>(fb[f].ptr)); }, fa[f].ptr);
    }
  }
}

TEST(RunConfig, FullConfigSetsEveryField) {
  auto c = load_run_config(full_path(), {});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->source, full_path());
  EXPECT_EQ(c->model.path, "/models/policy");
  EXPECT_EQ(c->model.tokenizer, "/models/tok.json");
  EXPECT_EQ(c->model.reference, "/models/ref");
  const RolloutSection& r = c->rollout;
  EXPECT_EQ(r.num_rollouts, 5);
  EXPECT_EQ(r.rollout_batch_size, 4);
  EXPECT_EQ(r.n_samples_per_prompt, 6);
  EXPECT_EQ(r.over_sampling_batch_size, 6);
  EXPECT_TRUE(r.filter_zero_variance);
  EXPECT_EQ(r.max_new_tokens, 128);
  EXPECT_EQ(r.temperature, 0.7);
  EXPECT_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "</answer>"}));
  EXPECT_EQ(r.seed, 18446744073709551615u);
  EXPECT_EQ(r.num_engines, 2);
  EXPECT_EQ(r.engines, std::vector<std::string>{"10.0.0.2:30000/30001"});
  EXPECT_EQ(r.engine_threads, 3);
  EXPECT_EQ(r.engine_num_blocks, 512);
  EXPECT_EQ(r.engine_max_batch_tokens, 1024);
  EXPECT_EQ(r.engine_max_running, 32);
  EXPECT_EQ(r.health_check_interval_s, 0.5);
  EXPECT_EQ(r.engine_start_timeout_s, 120);
  EXPECT_EQ(r.max_engine_restarts, 0);
  const TrainerSection& t = c->trainer;
  EXPECT_EQ(t.global_batch_size, 12);
  EXPECT_EQ(t.num_steps_per_rollout, 2);
  EXPECT_EQ(t.micro_batch_size, 3);
  EXPECT_EQ(t.lr, 2e-6);
  EXPECT_EQ(t.min_lr, 1e-7);
  EXPECT_EQ(t.warmup_steps, 10);
  EXPECT_EQ(t.decay, LrDecay::kCosine);
  EXPECT_EQ(t.weight_decay, 0.01);
  EXPECT_EQ(t.beta1, 0.8);
  EXPECT_EQ(t.beta2, 0.99);
  EXPECT_EQ(t.eps, 1e-6);
  EXPECT_EQ(t.clip_grad_norm, 0.5);
  EXPECT_EQ(t.threads, 4);
  EXPECT_EQ(c->parallel.dp, 2);
  EXPECT_EQ(c->parallel.pp, 3);
  EXPECT_EQ(c->parallel.tp, 4);
  EXPECT_EQ(c->parallel.timeout_s, 120);
  const AlgorithmSection& a = c->algorithm;
  EXPECT_EQ(a.advantage, Advantage::kReinforcePpBaseline);
  EXPECT_FALSE(a.std_normalize);
  EXPECT_EQ(a.policy_loss, PolicyLoss::kGspo);
  EXPECT_EQ(a.eps_clip, 0.1);
  EXPECT_EQ(a.eps_clip_high, 0.28);
  EXPECT_EQ(a.dual_clip_c, 3);
  EXPECT_EQ(a.kl_estimator, KlEstimatorKind::kK3);
  EXPECT_EQ(a.kl_coef, 0.05);
  EXPECT_EQ(a.entropy_coef, -0.001);
  EXPECT_EQ(a.loss_reduction, Reduction::kConstant);
  EXPECT_EQ(a.constant_normaliser, 512);
  EXPECT_EQ(a.correction, Correction::kMisSequence);
  EXPECT_EQ(a.tis_c, 1.5);
  EXPECT_EQ(a.mis_low, 0.25);
  EXPECT_EQ(a.mis_high, 4);
  EXPECT_EQ(a.old_logp, OldLogp::kRecompute);
  EXPECT_EQ(c->data.path, "/data/train.jsonl");
  EXPECT_EQ(c->data.prompt_key, "messages");
  EXPECT_EQ(c->data.label_key, "answer");
  EXPECT_TRUE(c->data.apply_chat_template);
  EXPECT_FALSE(c->data.shuffle);
  EXPECT_EQ(c->data.seed, 7u);
  ASSERT_EQ(c->rewards.size(), 2u);
  const RewardSpec& w = c->rewards[0];
  EXPECT_EQ(w.kind, RewardKind::kNumeric);
  EXPECT_EQ(w.name, "correct");
  EXPECT_EQ(w.weight, 2);
  EXPECT_EQ(w.answer_prefix, "####");
  EXPECT_EQ(w.tolerance, 0.01);
  EXPECT_EQ(w.pattern, "\\d+");
  EXPECT_EQ(w.keywords, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(w.case_sensitive);
  EXPECT_EQ(w.max_tokens, 100);
  EXPECT_TRUE(w.require_finish);
  EXPECT_EQ(w.url, "http://localhost:8000/score");
  EXPECT_EQ(w.command, "./score.sh");
  EXPECT_EQ(w.timeout_s, 5);
  EXPECT_EQ(c->rewards[1].kind, RewardKind::kLength);
  EXPECT_EQ(c->rewards[1].weight, 1.0);
  EXPECT_EQ(c->weight_sync.transport, Transport::kDiskDelta);
  EXPECT_EQ(c->weight_sync.dir, "/fast/weights");
  EXPECT_EQ(c->weight_sync.full_every, 3);
  EXPECT_EQ(c->weight_sync.encoding, Encoding::kOverwrite);
  EXPECT_EQ(c->weight_sync.compression, Compression::kFast);
  EXPECT_FALSE(c->weight_sync.check_checksums);
  EXPECT_EQ(c->weight_sync.group_timeout_s, 15);
  EXPECT_EQ(c->async.mode, AsyncMode::kOneStepOff);
  EXPECT_EQ(c->async.max_weight_staleness, 2);
  EXPECT_EQ(c->async.stale_policy, StalePolicy::kRetry);
  EXPECT_EQ(c->async.update_weights_interval, 2);
  EXPECT_EQ(c->async.buffer_groups, 16);
  EXPECT_EQ(c->async.pause_mode, SyncPause::kInPlace);
  EXPECT_EQ(c->checkpoint.dir, "/ckpt");
  EXPECT_EQ(c->checkpoint.save_every, 2);
  EXPECT_TRUE(c->checkpoint.save_final);
  EXPECT_TRUE(c->checkpoint.resume);
  EXPECT_EQ(c->logging.run_dir, "runs/full");
  EXPECT_EQ(c->logging.progress, Progress::kLines);
  EXPECT_EQ(c->controller.host, "0.0.0.0");
  EXPECT_EQ(c->controller.port, 7070);
  EXPECT_EQ(c->check.max_logp_abs_diff, 0.03);
  EXPECT_EQ(c->check.max_rollout_kl, 0.001);
  EXPECT_EQ(c->check.min_ess, 0.9);
  EXPECT_EQ(c->check.min_r3_agreement, 0.99);
  EXPECT_EQ(c->check.max_ppo_kl, 1e-9);
  EXPECT_EQ(c->check.max_clipfrac, 1e-10);
  EXPECT_EQ(c->check.layouts, (std::vector<std::string>{"dp=2", "pp=2,tp=2"}));
  EXPECT_EQ(c->check.grad_norm_rel_tol, 0.03);
  EXPECT_EQ(c->check.grad_norm_rel_tol_tp, 0.05);
  EXPECT_EQ(c->check.report, "/reports/check.json");
}

constexpr char kMinimal[] =
    "model: {path: m}\ndata: {path: d.jsonl}\nrewards: [{kind: exact_match}]\n";

TEST(RunConfig, MinimalConfigKeepsDefaultsAndPutsDirsInTheRunDir) {
  auto c = parse_run_config(kMinimal, "min.yaml", {});
  ASSERT_TRUE(c.ok()) << c.message();
  RunConfig expected;
  expected.source = "min.yaml";
  expected.model.path = "m";
  expected.data.path = "d.jsonl";
  expected.rewards.emplace_back().kind = RewardKind::kExactMatch;
  expected.weight_sync.dir = "runs/default/weights";
  expected.checkpoint.dir = "runs/default/checkpoints";
  expected.check.report = "runs/default/check.json";
  expect_equal(*c, expected);

  // The derived directories follow an overridden run_dir; explicit ones stay.
  auto o = parse_run_config(kMinimal, "min.yaml", {"logging.run_dir=/tmp/r/", "checkpoint.dir=/c"});
  ASSERT_TRUE(o.ok()) << o.message();
  EXPECT_EQ(o->weight_sync.dir, "/tmp/r/weights");
  EXPECT_EQ(o->checkpoint.dir, "/c");
}

TEST(RunConfig, ToYamlRoundTripsToAnEqualConfig) {
  auto c = load_run_config(full_path(), {});
  ASSERT_TRUE(c.ok()) << c.message();
  // Strings YAML or ${} expansion could mangle.
  c->model.tokenizer = "a \"quoted\" \\ back\tslash\nnew line ${NOT_EXPANDED} $${x} é";
  c->data.label_key = "true";
  c->data.prompt_key = "123";
  c->rewards[0].pattern = "# not: a comment";
  c->rollout.stop = {"", "null", "[x]"};
  c->trainer.lr = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  const std::string yaml = run_config_to_yaml(*c);
  auto back = parse_run_config(yaml, full_path(), {});
  ASSERT_TRUE(back.ok()) << back.message() << "\n" << yaml;
  expect_equal(*back, *c);
  EXPECT_EQ(run_config_to_yaml(*back), yaml);
}

std::string reference_path() { return test::source_dir() + "/configs/reference.yaml"; }

TEST(RunConfig, ReferenceYamlLoadsAndStatesTheDefaults) {
  auto c = load_run_config(reference_path(), {"model.path=/m", "data.path=/d.jsonl"});
  ASSERT_TRUE(c.ok()) << c.message();
  RunConfig expected;
  expected.source = reference_path();
  expected.model.path = "/m";
  expected.data.path = "/d.jsonl";
  expected.rewards.emplace_back().kind = RewardKind::kExactMatch;
  expected.weight_sync.dir = "runs/default/weights";
  expected.checkpoint.dir = "runs/default/checkpoints";
  expected.check.report = "runs/default/check.json";
  expect_equal(*c, expected);
}

std::string reference_sft_path() { return test::source_dir() + "/configs/reference_sft.yaml"; }

// An SFT job's reference: its own keys at their defaults, and only keys an SFT job reads.
TEST(RunConfig, ReferenceSftYamlLoadsAndStatesTheDefaults) {
  auto c = load_run_config(reference_sft_path(), {"model.path=/m", "sft.data=/d.jsonl"});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(c->is_sft());
  RunConfig expected;
  expected.source = reference_sft_path();
  expected.model.path = "/m";
  expected.sft.data = "/d.jsonl";
  expected.weight_sync.dir = "runs/default/weights";
  expected.checkpoint.dir = "runs/default/checkpoints";
  expected.check.report = "runs/default/check.json";
  expect_equal(*c, expected);
}

TEST(RunConfig, ReferenceYamlDocumentsEveryKeyWithAComment) {
  std::set<std::string> documented, expected;
  // reference.yaml documents every key; reference_sft.yaml the sft section too.
  for (const std::string& path : {reference_path(), reference_sft_path()}) {
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::string line, section;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      if (line[0] != ' ') {
        section = line.substr(0, line.find(':'));
        continue;
      }
      std::string key = line.substr(line.find_first_not_of(" -"));
      key = key.substr(0, key.find(':'));
      EXPECT_NE(line.find(" # "), std::string::npos) << "no comment: " << line;
      documented.insert(section + "." + key);
    }
  }
  RunConfig config;
  for (const auto& s : rci::sections_of(config)) {
    for (const auto& f : s.fields) expected.insert(std::string(s.name) + "." + std::string(f.key));
  }
  RewardSpec spec;
  for (const auto& f : rci::reward_fields(spec)) expected.insert("rewards." + std::string(f.key));
  EXPECT_EQ(documented, expected);
}

TEST(RunConfig, EnumKeysAreSpelledAsTheirOwnersSpellThem) {
  // The device names are device_model.h's (parse_device); the config's table must agree.
  for (size_t i = 0; i < ConfigEnum<Device>::names.size(); ++i)
    EXPECT_EQ(ConfigEnum<Device>::names[i], device_name(static_cast<Device>(i)));
  EXPECT_EQ(ConfigEnum<Device>::names.size(), device_names().size());
  // An enum key takes exactly its names; the message lists them and the nearest one.
  auto c = parse_run_config(
      "model: {path: m}\ndata: {path: d.jsonl}\nrewards: [{kind: exact_match}]\n"
      "async: {pause_mode: inplace}\n",
      "job.yaml", {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("job.yaml:4: async.pause_mode: expected one of retract | in_place | "
                             "abort, got \"inplace\" (did you mean in_place?)"),
            std::string::npos)
      << c.message();
  auto ok =
      parse_run_config("model: {path: m}\ndata: {path: d.jsonl}\nrewards: [{kind: exact_match}]\n",
                       "job.yaml", {"async.pause_mode=abort", "trainer.device=emulated"});
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok->async.pause_mode, SyncPause::kAbort);
  EXPECT_EQ(ok->trainer.device, Device::kEmulated);
}

// An SFT job (sft.data set): written with only the keys it reads, read back equal; RL keys in it
// and SFT keys in an RL job are errors that name them.
TEST(RunConfig, SftJobKeepsOnlyItsKeys) {
  auto c = parse_run_config(
      "model: {path: m}\nsft: {data: d.jsonl, steps: 5, max_len: 64}\n"
      "trainer: {global_batch_size: 4}\nparallel: {dp: 2, timeout_s: 30}\n",
      "job.yaml", {});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(c->is_sft());
  EXPECT_EQ(c->sft.steps, 5);
  EXPECT_EQ(c->sft.max_len, 64);
  EXPECT_EQ(c->parallel.timeout_s, 30);
  const std::string yaml = run_config_to_yaml(*c);
  for (const char* rl : {"rollout:", "rewards:", "algorithm:", "weight_sync:", "async:", "check:",
                         "eval:", "num_steps_per_rollout", "reference:", "samples_every"})
    EXPECT_EQ(yaml.find(rl), std::string::npos) << rl << "\n" << yaml;
  auto back = parse_run_config(yaml, "job.yaml", {});
  ASSERT_TRUE(back.ok()) << back.message() << "\n" << yaml;
  expect_equal(*back, *c);
  EXPECT_EQ(run_config_to_yaml(*back), yaml);

  auto rl_in_sft =
      parse_run_config("model: {path: m}\nsft: {data: d.jsonl}\nrewards: [{kind: exact_match}]\n",
                       "job.yaml", {"trainer.num_steps_per_rollout=2"});
  ASSERT_FALSE(rl_in_sft.ok());
  EXPECT_NE(rl_in_sft.message().find("job.yaml:3: rewards: not used by an SFT job"),
            std::string::npos)
      << rl_in_sft.message();
  EXPECT_NE(rl_in_sft.message().find("override trainer.num_steps_per_rollout=2: "
                                     "trainer.num_steps_per_rollout: not used by an SFT job"),
            std::string::npos)
      << rl_in_sft.message();
  auto sft_in_rl = parse_run_config(
      "model: {path: m}\ndata: {path: d.jsonl}\nrewards: [{kind: exact_match}]\n"
      "sft: {steps: 3}\n",
      "job.yaml", {});
  ASSERT_FALSE(sft_in_rl.ok());
  EXPECT_NE(sft_in_rl.message().find("job.yaml:4: sft.steps: only an SFT job uses it"),
            std::string::npos)
      << sft_in_rl.message();
  auto bad = parse_run_config("model: {path: m}\nsft: {data: d.jsonl, steps: 0}\n", "job.yaml",
                              {"parallel.timeout_s=0"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("sft.steps: must be > 0"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("parallel.timeout_s: must be > 0"), std::string::npos)
      << bad.message();
  auto split = parse_run_config("model: {path: m}\nsft: {data: d.jsonl}\n", "job.yaml",
                                {"trainer.global_batch_size=6", "parallel.dp=4"});
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.message().find("trainer.global_batch_size: 6 is not divisible by "
                                 "trainer.micro_batch_size × parallel.dp = 1 × 4 = 4"),
            std::string::npos)
      << split.message();
}

TEST(RunConfig, LoadNamesAMissingFile) {
  auto c = load_run_config("/nonexistent/job.yaml", {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("/nonexistent/job.yaml"), std::string::npos) << c.message();
}

}  // namespace
}  // namespace miles
