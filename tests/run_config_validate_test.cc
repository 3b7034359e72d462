// Job-config value checks (validate_run_config and the parser's use of it): required keys, the
// batch invariant with its suggested fix, layout divisibility, ranges, enumerations and the
// settings that only make sense together. Each message names the keys, the values and the line.
#include <gtest/gtest.h>

#include <utility>

#include "miles/controller/run_config.h"

namespace miles {
namespace {

// model.path, data.path and one reward: valid on its own (lines 1-3).
constexpr char kBase[] =
    "model: {path: m}\ndata: {path: d.jsonl}\nrewards: [{kind: exact_match}]\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  auto c = parse_run_config(yaml, "job.yaml", overrides);
  return c.ok() ? "(no error)" : c.message();
}
std::string error_with(const std::string& more, const std::vector<std::string>& overrides = {}) {
  return error_of(std::string(kBase) + more, overrides);
}

TEST(RunConfigValidate, RequiredKeys) {
  EXPECT_EQ(error_of(""),
            "job.yaml: model.path: required (the HF model directory or llama2.c checkpoint)\n"
            "job.yaml: data.path: required (the JSONL prompt file)\n"
            "job.yaml: rewards: at least one reward is required (e.g. rewards: [{kind: "
            "exact_match}])");
  EXPECT_EQ(error_of("model:\n  path: \"\"\ndata: {path: d}\nrewards: []\n"),
            "job.yaml:2: model.path: required (the HF model directory or llama2.c checkpoint)\n"
            "job.yaml:4: rewards: at least one reward is required (e.g. rewards: [{kind: "
            "exact_match}])");
}

TEST(RunConfigValidate, BatchInvariantShowsTheProductsAndAFix) {
  EXPECT_EQ(error_with("rollout:\n  rollout_batch_size: 8\ntrainer:\n  global_batch_size: 32\n"),
            "job.yaml:7: batch sizes: rollout.rollout_batch_size × rollout.n_samples_per_prompt = "
            "8 × 8 = 64 samples per rollout step, but trainer.global_batch_size × "
            "trainer.num_steps_per_rollout = 32 × 1 = 32 (did you mean "
            "trainer.global_batch_size: 64?)");
  EXPECT_EQ(error_with("rollout:\n  n_samples_per_prompt: 4\n"),
            "job.yaml:5: batch sizes: rollout.rollout_batch_size × rollout.n_samples_per_prompt = "
            "8 × 4 = 32 samples per rollout step, but trainer.global_batch_size × "
            "trainer.num_steps_per_rollout = 64 × 1 = 64 (did you mean "
            "trainer.global_batch_size: 32?)");
  EXPECT_EQ(error_with("", {"trainer.num_steps_per_rollout=3"}),
            "override trainer.num_steps_per_rollout=3: batch sizes: rollout.rollout_batch_size × "
            "rollout.n_samples_per_prompt = 8 × 8 = 64 samples per rollout step, but "
            "trainer.global_batch_size × trainer.num_steps_per_rollout = 64 × 3 = 192 (did you "
            "mean trainer.num_steps_per_rollout: 1 and trainer.global_batch_size: 64?)");
  EXPECT_EQ(error_with("", {"trainer.global_batch_size=32", "trainer.num_steps_per_rollout=2"}),
            "(no error)");
}

TEST(RunConfigValidate, EngineDeviceIsNamedAndNotSplitAcrossProcesses) {
  EXPECT_EQ(error_with("", {"rollout.engine_device=cuda"}), "(no error)");
  const std::string typo = error_with("", {"rollout.engine_device=gpu"});
  EXPECT_NE(typo.find("rollout.engine_device"), std::string::npos) << typo;
  EXPECT_NE(typo.find("gpu"), std::string::npos) << typo;
  const std::string tp = error_with("", {"rollout.engine_device=cuda", "rollout.engine_tp=2"});
  EXPECT_NE(tp.find("engine_tp > 1"), std::string::npos) << tp;
  EXPECT_EQ(
      error_with("", {"trainer.device=emulated", "parallel.dp=2", "trainer.global_batch_size=64"}),
      "(no error)");
  const std::string ttp = error_with("", {"trainer.device=cuda", "parallel.pp=2"});
  EXPECT_NE(ttp.find("trainer.device: cuda with parallel.tp or parallel.pp > 1"), std::string::npos)
      << ttp;
  EXPECT_NE(error_with("", {"trainer.device=tpu"}).find("trainer.device"), std::string::npos);
}

// The co-trained draft head: its own keys' ranges, and every trainer layout it trains under (CPU
// dp / pp / tp, device trainers).
TEST(RunConfigValidate, DraftHeadKeysAndTheLayoutsItTrainsUnder) {
  for (const char* layout : {"parallel.dp=2", "parallel.pp=2", "parallel.tp=2"})
    EXPECT_EQ(error_with("", {"rollout.speculative_draft_head=true", layout}), "(no error)")
        << layout;
  // Device trainers train it too (its features and the logits come back to the host).
  EXPECT_EQ(error_with("", {"rollout.speculative_draft_head=true", "trainer.device=emulated",
                            "parallel.dp=2", "trainer.global_batch_size=64"}),
            "(no error)");
  // Engines draft with it on one process, on a device, or tensor-parallel with versions over
  // disk-delta (whole weights).
  EXPECT_EQ(error_with("", {"rollout.speculative=true", "rollout.speculative_draft_head=true",
                            "rollout.engine_tp=2", "weight_sync.transport=disk_delta"}),
            "(no error)");
  for (const char* group : {"weight_sync.transport=p2p", "weight_sync.transport=broadcast"}) {
    const std::string e =
        error_with("", {"rollout.speculative=true", "rollout.speculative_draft_head=true",
                        "rollout.engine_tp=2", group});
    EXPECT_NE(e.find("a weight group hands each of their ranks its shard only"), std::string::npos)
        << e;
  }
  EXPECT_EQ(error_with("", {"rollout.speculative=true", "rollout.speculative_draft_head=true",
                            "rollout.engine_device=emulated"}),
            "(no error)");
  const std::string lr = error_with("", {"rollout.speculative_draft_lr=0"});
  EXPECT_NE(lr.find("rollout.speculative_draft_lr"), std::string::npos) << lr;
  const std::string vocab = error_with("", {"rollout.speculative_draft_vocab=1"});
  EXPECT_NE(vocab.find("rollout.speculative_draft_vocab: must be >= 2, got 1"), std::string::npos)
      << vocab;
  // Feature layers (EAGLE-3): a list of ascending layer indices, with the head only.
  EXPECT_EQ(error_with("", {"rollout.speculative_draft_head=true", "parallel.pp=2",
                            "rollout.speculative_draft_layers=[0, 1]"}),
            "(no error)");
  const std::string alone = error_with("", {"rollout.speculative_draft_layers=[0]"});
  EXPECT_NE(alone.find("need rollout.speculative_draft_head: true"), std::string::npos) << alone;
  for (const char* bad : {"[1, 0]", "[0, 0]", "[-1]"}) {
    const std::string e = error_with("", {"rollout.speculative_draft_head=true",
                                          std::string("rollout.speculative_draft_layers=") + bad});
    EXPECT_NE(e.find("must be non-negative, ascending and distinct"), std::string::npos) << e;
  }
  const std::string many = error_with("", {"rollout.speculative_draft_head=true",
                                           "rollout.speculative_draft_layers=[0,1,2,3,4,5,6,7,8]"});
  EXPECT_NE(many.find("9 layers; at most 8"), std::string::npos) << many;
  const std::string text = error_with("", {"rollout.speculative_draft_layers=[a]"});
  EXPECT_NE(text.find("expected an integer"), std::string::npos) << text;
  const std::string scalar = error_with("", {"rollout.speculative_draft_layers=3"});
  EXPECT_NE(scalar.find("(write [3])"), std::string::npos) << scalar;
  // The training-time test: 1 to 8 passes, more than one with the head only.
  EXPECT_EQ(error_with("", {"rollout.speculative_draft_head=true",
                            "rollout.speculative_draft_ttt_length=4"}),
            "(no error)");
  const std::string ttt_alone = error_with("", {"rollout.speculative_draft_ttt_length=2"});
  EXPECT_NE(ttt_alone.find("needs rollout.speculative_draft_head: true"), std::string::npos)
      << ttt_alone;
  for (const char* bad : {"0", "9"}) {
    const std::string e =
        error_with("", {"rollout.speculative_draft_head=true",
                        std::string("rollout.speculative_draft_ttt_length=") + bad});
    EXPECT_NE(e.find(std::string(bad) + " passes; 1 to 8"), std::string::npos) << e;
  }
}

// weight_sync.comm: the communicator of the group transports, shm only where it applies.
TEST(RunConfigValidate, WeightSyncCommAppliesToGroupTransports) {
  EXPECT_EQ(error_with("", {"weight_sync.transport=broadcast", "weight_sync.comm=shm"}),
            "(no error)");
  EXPECT_EQ(error_with("", {"weight_sync.transport=p2p", "weight_sync.comm=gloo"}), "(no error)");
  EXPECT_EQ(error_with("", {"weight_sync.transport=broadcast", "parallel.pp=2"}), "(no error)");
  const std::string disk = error_with("", {"weight_sync.comm=shm"});
  EXPECT_NE(disk.find("weight_sync.comm: shm is the communicator of the broadcast and p2p"),
            std::string::npos)
      << disk;
  // Several sending ranks on the controller's host, and tensor-parallel engines (their followers
  // on their host): shared memory reaches them; a remote trainer rank it does not.
  EXPECT_EQ(
      error_with("", {"weight_sync.transport=broadcast", "weight_sync.comm=shm", "parallel.pp=2"}),
      "(no error)");
  const std::string pp =
      error_with("", {"weight_sync.transport=broadcast", "weight_sync.comm=shm", "parallel.pp=2",
                      "parallel.comm=gloo", "parallel.remote_ranks=1"});
  EXPECT_NE(pp.find("weight_sync.comm: shm needs every sending trainer rank on the controller's "
                    "host (2 send here, parallel.remote_ranks 1)"),
            std::string::npos)
      << pp;
  EXPECT_EQ(
      error_with("", {"weight_sync.transport=p2p", "weight_sync.comm=shm", "rollout.engine_tp=2"}),
      "(no error)");
  const std::string bad = error_with("", {"weight_sync.comm=nccl"});
  EXPECT_NE(bad.find("weight_sync.comm"), std::string::npos) << bad;
}

TEST(RunConfigValidate, GlobalBatchDividesIntoMicroBatchesPerRank) {
  EXPECT_EQ(error_with("trainer:\n  micro_batch_size: 3\n"),
            "job.yaml:5: trainer.global_batch_size: 64 is not divisible by "
            "trainer.micro_batch_size × parallel.dp = 3 × 1 = 3");
  EXPECT_EQ(error_with("", {"parallel.dp=3"}),
            "override parallel.dp=3: trainer.global_batch_size: 64 is not divisible by "
            "trainer.micro_batch_size × parallel.dp = 1 × 3 = 3");
  EXPECT_EQ(error_with("", {"parallel.dp=4", "trainer.micro_batch_size=2"}), "(no error)");
}

TEST(RunConfigValidate, RangesAndCombinations) {
  // One flow-map line (line 4) after the base, and the message it must give.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"rollout: {num_rollouts: 0}", "rollout.num_rollouts: must be > 0, got 0"},
      {"rollout: {function: agent.run}",
       "rollout.function: must be \"package.module:name\", got \"agent.run\""},
      {"rollout: {function: \"agent:run\"}",
       "rollout.function: runs chat sessions; it needs data.apply_chat_template: true"},
      {"rollout: {python_path: agents}", "rollout.python_path: given without rollout.function"},
      {"rollout: {over_sampling_batch_size: 4}",
       "rollout.over_sampling_batch_size: must be 0 (as many as rollout.rollout_batch_size) or "
       ">= rollout.rollout_batch_size (8), got 4"},
      {"rollout: {max_new_tokens: 0}", "rollout.max_new_tokens: must be > 0, got 0"},
      {"rollout: {temperature: -0.5}", "rollout.temperature: must be >= 0, got -0.5"},
      {"rollout: {top_p: 0}", "rollout.top_p: must be in (0, 1], got 0"},
      {"rollout: {top_p: 1.5}", "rollout.top_p: must be in (0, 1], got 1.5"},
      {"rollout: {top_k: -1}", "rollout.top_k: must be >= 0, got -1"},
      {"rollout: {num_engines: 0}",
       "rollout.num_engines: 0 engines to start, none in rollout.engines, and controller.port is "
       "0 so none can register (start some, list some, or set controller.port)"},
      {"rollout: {num_engines: 0, engines: [localhost]}",
       "rollout.engines[0]: expected \"host:http_port/grpc_port\", got \"localhost\""},
      {"trainer: {lr: 0}", "trainer.lr: must be > 0, got 0"},
      {"trainer: {min_lr: 1e-5}", "trainer.min_lr: must be <= trainer.lr (1e-06), got 1e-05"},
      {"trainer: {beta2: 1}", "trainer.beta2: must be in [0, 1), got 1"},
      {"parallel: {tp: 0}", "parallel.tp: must be > 0, got 0"},
      {"parallel: {pp: -2}", "parallel.pp: must be > 0, got -2"},
      {"algorithm: {eps_clip: -0.1}", "algorithm.eps_clip: must be >= 0, got -0.1"},
      {"algorithm: {dual_clip_c: 0.5}", "algorithm.dual_clip_c: must be 0 (off) or > 1, got 0.5"},
      {"algorithm: {kl_coef: 0.1}",
       "algorithm.kl_coef: 0.1 needs algorithm.kl_estimator k1, k2 or k3 (it is none)"},
      {"algorithm: {kl_estimator: k2}",
       "algorithm.kl_estimator: k2 needs algorithm.kl_coef > 0 (it is 0; or set kl_estimator: "
       "none)"},
      {"algorithm: {loss_reduction: constant}",
       "algorithm.constant_normaliser: must be > 0 with algorithm.loss_reduction constant, got 0"},
      {"algorithm: {mis_low: 3}", "algorithm.mis_low: must be <= algorithm.mis_high (2), got 3"},
      {"async: {mode: one_step_off, max_weight_staleness: 0}",
       "async.max_weight_staleness: must be >= 1 with async.mode one_step_off, got 0"},
      {"async: {max_weight_staleness: -1}", "async.max_weight_staleness: must be >= 0, got -1"},
      {"async: {update_weights_interval: 0}", "async.update_weights_interval: must be > 0, got 0"},
      {"controller: {port: 70000}",
       "controller.port: must be in 0..65535 (0: any free port), got 70000"},
  };
  for (const auto& [line, message] : cases) {
    EXPECT_EQ(error_with(line + "\n"), "job.yaml:4: " + message) << line;
  }
  EXPECT_EQ(error_with("rollout: {num_engines: 0}\ncontroller: {port: 7000}\n"), "(no error)");
  // rollout.function: alone, on chat prompts; `kind: rollout` rewards need it.
  const std::string chat = "data: {path: d.jsonl, apply_chat_template: true}\n";
  EXPECT_EQ(error_of("model: {path: m}\n" + chat +
                     "rewards: [{kind: rollout}]\n"
                     "rollout: {function: \"a:run\", environment: calculator}\n"),
            "job.yaml:4: rollout.function: runs the sample's session itself; "
            "rollout.environment must be none, got calculator");
  EXPECT_EQ(error_of("model: {path: m}\n" + chat + "rewards: [{kind: rollout}]\n"),
            "job.yaml:3: rewards[0]: kind rollout scores what rollout.function returns; "
            "rollout.function is not set");
  EXPECT_EQ(error_of("model: {path: m}\n" + chat +
                     "rewards: [{kind: rollout}]\n"
                     "rollout: {function: \"a:run\", python_path: agents}\n"),
            "(no error)");
  EXPECT_EQ(error_with("rollout: {num_engines: 0, engines: [\"h:1/2\"]}\n"), "(no error)");
  EXPECT_EQ(error_with("algorithm: {kl_estimator: k1, kl_coef: 0.1, loss_reduction: constant, "
                       "constant_normaliser: 256, dual_clip_c: 3}\n"),
            "(no error)");
}

TEST(RunConfigValidate, EnumerationsListWhatIsAccepted) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trainer: {decay: linear}", "trainer.decay: expected one of constant | cosine"},
      {"algorithm: {advantage: ppo}",
       "algorithm.advantage: expected one of grpo | dr_grpo | reinforce_pp | "
       "reinforce_pp_baseline"},
      {"algorithm: {policy_loss: x}", "algorithm.policy_loss: expected one of ppo | gspo"},
      {"algorithm: {kl_estimator: k4}",
       "algorithm.kl_estimator: expected one of none | k1 | k2 | k3"},
      {"algorithm: {loss_reduction: x}",
       "algorithm.loss_reduction: expected one of token_mean | sample_mean | constant"},
      {"algorithm: {correction: x}",
       "algorithm.correction: expected one of none | tis | mis_token | mis_sequence"},
      {"algorithm: {old_logp: x}", "algorithm.old_logp: expected one of rollout | recompute"},
      {"weight_sync: {transport: nccl}",
       "weight_sync.transport: expected one of disk_delta | broadcast | p2p"},
      {"weight_sync: {encoding: x}",
       "weight_sync.encoding: expected one of difference | xor | overwrite"},
      {"async: {mode: x}", "async.mode: expected one of sync | one_step_off | async"},
      {"async: {stale_policy: x}", "async.stale_policy: expected one of drop | retry"},
      {"async: {pause_mode: x}", "async.pause_mode: expected one of retract | in_place | abort"},
      {"logging: {progress: x}", "logging.progress: expected one of auto | bar | lines | none"},
  };
  for (const auto& [line, message] : cases) {
    std::string error = error_with(line + "\n");
    EXPECT_TRUE(error.starts_with("job.yaml:4: " + message + ", got \"")) << error;
  }
  EXPECT_EQ(error_with("async:\n  mode: one_step_of\n"),
            "job.yaml:5: async.mode: expected one of sync | one_step_off | async, got "
            "\"one_step_of\" (did you mean one_step_off?)");
}

TEST(RunConfigValidate, PlainStructWithoutLines) {
  RunConfig c;
  c.model.path = "m";
  c.data.path = "d";
  c.rewards.emplace_back().kind = RewardKind::kExactMatch;
  EXPECT_TRUE(validate_run_config(c).ok()) << validate_run_config(c).message();
  c.parallel.dp = 0;
  c.source = "";
  EXPECT_EQ(validate_run_config(c).message(), "parallel.dp: must be > 0, got 0");
  c.source = "job.yaml";
  EXPECT_EQ(validate_run_config(c).message(), "job.yaml: parallel.dp: must be > 0, got 0");
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

// Remote trainer ranks: a rank count the layout has, Gloo (shm is one host) and an address the
// remote ranks can reach.
TEST(RunConfigValidate, RemoteRanksNeedGlooAndAReachableAddress) {
  EXPECT_EQ(error_with("", {"parallel.dp=2", "parallel.comm=gloo", "parallel.remote_ranks=1"}),
            "(no error)");
  const std::string too_many = error_with("", {"parallel.dp=2", "parallel.remote_ranks=2"});
  EXPECT_NE(too_many.find("parallel.remote_ranks: must be in [0, dp × pp × tp − 1] = [0, 1] "
                          "(rank 0 is the controller), got 2"),
            std::string::npos)
      << too_many;
  const std::string shm = error_with("", {"parallel.pp=2", "parallel.remote_ranks=1"});
  EXPECT_NE(shm.find("parallel.remote_ranks: 1 needs parallel.comm gloo (shm reaches ranks on "
                     "one host only)"),
            std::string::npos)
      << shm;
  const std::string wildcard =
      error_with("", {"parallel.dp=2", "parallel.comm=gloo", "parallel.remote_ranks=1",
                      "controller.host=0.0.0.0"});
  EXPECT_NE(wildcard.find("set parallel.host to this host's address (controller.host is the "
                          "wildcard 0.0.0.0)"),
            std::string::npos)
      << wildcard;
  EXPECT_EQ(error_with("", {"parallel.dp=2", "parallel.comm=gloo", "parallel.remote_ranks=1",
                            "controller.host=0.0.0.0", "parallel.host=10.0.0.5"}),
            "(no error)");
}

}  // namespace
}  // namespace miles
