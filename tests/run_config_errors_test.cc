// Job-config errors from the parser: YAML syntax, unknown sections and keys (with hints), wrong
// types, duplicates, and command-line overrides; plus ${VAR} expansion. Messages are compared
// whole: they are the user interface.
#include <gtest/gtest.h>

#include <cstdlib>

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

TEST(RunConfigErrors, SyntaxErrorNamesTheLine) {
  EXPECT_EQ(error_of("model:\n  path: m\n  tokenizer: t: u\n"),
            "job.yaml:3: YAML syntax error: illegal map value");
}

// yaml-cpp stops at a nesting depth and calls it "bad file"; the message says what it is, for the
// file and for an override's value.
TEST(RunConfigErrors, DeepNestingIsNamed) {
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  const std::string file = error_of("rollout: " + deep + "\n");
  EXPECT_EQ(file.rfind("job.yaml:1: YAML syntax error: lists and maps nested too deep", 0), 0u)
      << file;
  EXPECT_EQ(file.find("bad file"), std::string::npos) << file;
  const std::string over = error_of(kBase, {"rollout.seed=" + deep});
  EXPECT_NE(over.find(": the value is not valid YAML: lists and maps nested too deep"),
            std::string::npos)
      << over.substr(over.size() - 200);
  // 100 levels are within the bound: the error is then about the value, not the nesting.
  const std::string fine =
      error_of(std::string(kBase) + "rollout: {seed: " + std::string(100, '[') +
               std::string(100, ']') + "}\n");
  EXPECT_EQ(fine.find("nested too deep"), std::string::npos) << fine;
}

TEST(RunConfigErrors, TopLevelMustBeAMap) {
  EXPECT_EQ(error_of("- model\n"),
            "job.yaml:1: the top level must be a map of sections (model: ..., rollout: ...), got a "
            "list");
}

TEST(RunConfigErrors, UnknownSectionHasAHint) {
  EXPECT_EQ(error_of(std::string(kBase) + "rollot:\n  seed: 3\n"),
            "job.yaml:4: unknown section 'rollot' (did you mean rollout?)");
  EXPECT_EQ(error_of(std::string(kBase) + "banana: 1\n"),
            "job.yaml:4: unknown section 'banana' (sections: model, sft, rollout, trainer, "
            "parallel, algorithm, data, eval, rewards, weight_sync, async, checkpoint, logging, "
            "controller, check)");
}

TEST(RunConfigErrors, UnknownKeyHasAHint) {
  EXPECT_EQ(error_of(std::string(kBase) + "rollout:\n  seed: 3\n  n_samples_per_promt: 4\n"),
            "job.yaml:6: rollout.n_samples_per_promt: unknown key (did you mean "
            "n_samples_per_prompt?)");
  EXPECT_EQ(error_of(std::string(kBase) + "parallel:\n  zz: 1\n"),
            "job.yaml:5: parallel.zz: unknown key (known keys: dp, pp, tp, comm, remote_ranks, "
            "host, timeout_s)");
  EXPECT_EQ(error_of("model: {path: m}\ndata: {path: d}\nrewards:\n  - kind: numeric\n"
                     "  - kind: numeric\n    tolerence: 0.1\n"),
            "job.yaml:6: rewards[1].tolerence: unknown key (did you mean tolerance?)");
}

TEST(RunConfigErrors, RewardKindsAreNamedAndKnown) {
  EXPECT_EQ(
      error_of("model: {path: m}\ndata: {path: d}\nrewards:\n  - kind: numeric\n"
               "  - kind: vibes\n"),
      "job.yaml:5: rewards[1].kind: expected one of exact_match | numeric | regex | keyword | "
      "length | http | command | python | rollout, got \"vibes\"");
  EXPECT_EQ(error_of("model: {path: m}\ndata: {path: d}\nrewards:\n  - kind: numeric\n"
                     "  - weight: 2\n"),
            "job.yaml:5: rewards[1]: kind is required (one of exact_match | numeric | regex | "
            "keyword | length | http | command | python | rollout)");
  EXPECT_EQ(error_of(std::string(kBase) + "", {"rewards.1.weight=2"}),
            "override rewards.1.weight=2: rewards[1]: kind is required (one of exact_match | "
            "numeric | regex | keyword | length | http | command | python | rollout)");
}

TEST(RunConfigErrors, WrongTypesSayWhatWasExpected) {
  auto one = [](const std::string& section_and_key) {
    return error_of(std::string(kBase) + section_and_key);
  };
  EXPECT_EQ(one("trainer:\n  lr: fast\n"),
            "job.yaml:5: trainer.lr: expected a number, got \"fast\"");
  EXPECT_EQ(one("trainer:\n  lr:\n"), "job.yaml:5: trainer.lr: expected a number, got nothing");
  EXPECT_EQ(one("trainer:\n  lr: .inf\n"),
            "job.yaml:5: trainer.lr: expected a number, got \".inf\"");
  EXPECT_EQ(one("rollout:\n  num_rollouts: 1.5\n"),
            "job.yaml:5: rollout.num_rollouts: expected an integer, got \"1.5\"");
  EXPECT_EQ(one("rollout:\n  top_k: 1e3\n"),
            "job.yaml:5: rollout.top_k: expected an integer, got \"1e3\"");
  EXPECT_EQ(one("rollout:\n  top_k: 99999999999999999999\n"),
            "job.yaml:5: rollout.top_k: expected an integer, got \"99999999999999999999\" (out of "
            "range)");
  EXPECT_EQ(one("rollout:\n  seed: -1\n"),
            "job.yaml:5: rollout.seed: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(one("rollout:\n  filter_zero_variance: yes\n"),
            "job.yaml:5: rollout.filter_zero_variance: expected true or false, got \"yes\"");
  EXPECT_EQ(
      one("rollout:\n  stop: </s>\n"),
      "job.yaml:5: rollout.stop: expected a list of strings, got \"</s>\" (write [\"</s>\"])");
  EXPECT_EQ(one("rollout:\n  stop: [a, [b]]\n"),
            "job.yaml:5: rollout.stop: expected a list of strings, got a list in the list");
  EXPECT_EQ(one("weight_sync:\n  dir: {a: 1}\n"),
            "job.yaml:5: weight_sync.dir: expected a string, got a map");
  EXPECT_EQ(one("async: 5\n"), "job.yaml:4: async: expected a map of keys, got \"5\"");
}

TEST(RunConfigErrors, RewardsMustBeAListOfMaps) {
  EXPECT_EQ(error_of("model: {path: m}\ndata: {path: d}\nrewards: {kind: numeric}\n"),
            "job.yaml:3: rewards: expected a list of rewards (- kind: exact_match ...), got a map");
  EXPECT_EQ(error_of("model: {path: m}\ndata: {path: d}\nrewards:\n  - numeric\n"),
            "job.yaml:4: rewards[0]: expected a map of reward keys (kind, weight, ...), got "
            "\"numeric\"");
}

TEST(RunConfigErrors, DuplicatesAreErrors) {
  EXPECT_EQ(error_of(std::string(kBase) + "rollout:\n  seed: 1\n  seed: 2\n"),
            "job.yaml:6: rollout.seed: duplicate key (first at line 5)");
  EXPECT_EQ(error_of(std::string(kBase) + "model: {path: n}\n"),
            "job.yaml:4: model: duplicate section (first at line 1)");
}

TEST(RunConfigErrors, AllErrorsAreReportedOnePerLine) {
  EXPECT_EQ(error_of(std::string(kBase) + "trainer:\n  lr: fast\n  lrr: 1\nrollot: {}\n"),
            "job.yaml:5: trainer.lr: expected a number, got \"fast\"\n"
            "job.yaml:6: trainer.lrr: unknown key (did you mean lr?)\n"
            "job.yaml:7: unknown section 'rollot' (did you mean rollout?)");
}

TEST(RunConfigOverrides, SetValuesOfEveryType) {
  auto c = parse_run_config(
      kBase, "job.yaml",
      {"rollout.seed=42", "trainer.lr=3e-6", "rollout.stop=[a, \"b c\"]", "data.shuffle=false",
       "model.tokenizer=", "rewards.0.weight=2", "rewards.1.kind=length", "rewards.1.max_tokens=50",
       "model.path=/over/ride"});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->rollout.seed, 42u);
  EXPECT_EQ(c->trainer.lr, 3e-6);
  EXPECT_EQ(c->rollout.stop, (std::vector<std::string>{"a", "b c"}));
  EXPECT_FALSE(c->data.shuffle);
  EXPECT_EQ(c->model.tokenizer, "");
  EXPECT_EQ(c->model.path, "/over/ride");
  ASSERT_EQ(c->rewards.size(), 2u);
  EXPECT_EQ(c->rewards[0].weight, 2);
  EXPECT_EQ(c->rewards[1].kind, RewardKind::kLength);
  EXPECT_EQ(c->rewards[1].max_tokens, 50);

  auto whole = parse_run_config(kBase, "job.yaml", {"rewards=[{kind: numeric, weight: 0.5}]"});
  ASSERT_TRUE(whole.ok()) << whole.message();
  ASSERT_EQ(whole->rewards.size(), 1u);
  EXPECT_EQ(whole->rewards[0].kind, RewardKind::kNumeric);
  EXPECT_EQ(whole->rewards[0].weight, 0.5);
}

TEST(RunConfigOverrides, ErrorsNameTheOverride) {
  EXPECT_EQ(error_of(kBase, {"trainer.lr=fast"}),
            "override trainer.lr=fast: trainer.lr: expected a number, got \"fast\"");
  EXPECT_EQ(error_of(kBase, {"rollout.n_samples_per_promt=4"}),
            "override rollout.n_samples_per_promt=4: rollout.n_samples_per_promt: unknown key "
            "(did you mean n_samples_per_prompt?)");
  EXPECT_EQ(error_of(kBase, {"rollot.seed=1"}),
            "override rollot.seed=1: unknown section 'rollot' (did you mean rollout?)");
  EXPECT_EQ(error_of(kBase, {"rollout.seed"}),
            "override rollout.seed: expected section.key=value (e.g. rollout.seed=3)");
  EXPECT_EQ(
      error_of(kBase, {"rollout.stop=[a"}),
      "override rollout.stop=[a: the value is not valid YAML: end of sequence flow not found");
  EXPECT_EQ(error_of(kBase, {"rewards.5.weight=1"}),
            "override rewards.5.weight=1: rewards[5]: no such entry (the list has 1; "
            "rewards.1.kind=... adds one)");
  EXPECT_EQ(error_of(kBase, {"rewards.0.wieght=1"}),
            "override rewards.0.wieght=1: rewards[0].wieght: unknown key (did you mean weight?)");
  // A value checked after parsing still names the override it came from.
  EXPECT_EQ(error_of(kBase, {"algorithm.advantage=grpoo"}),
            "override algorithm.advantage=grpoo: algorithm.advantage: expected one of grpo | "
            "dr_grpo | reinforce_pp | reinforce_pp_baseline, got \"grpoo\" (did you mean grpo?)");
}

TEST(RunConfigEnv, ExpandsVariablesAndDefaults) {
  setenv("MILES_RC_TEST_DIR", "/x", 1);
  setenv("MILES_RC_TEST_EMPTY", "", 1);
  unsetenv("MILES_RC_TEST_UNSET");
  auto c = parse_run_config(
      "model:\n  path: ${MILES_RC_TEST_DIR}/m\n  tokenizer: ${MILES_RC_TEST_UNSET:-../shared}/t\n"
      "  reference: a$${MILES_RC_TEST_DIR}b\n"
      "data: {path: \"${MILES_RC_TEST_EMPTY:-d}.jsonl\", label_key: \"${MILES_RC_TEST_EMPTY}\"}\n"
      "rollout: {stop: [\"${MILES_RC_TEST_DIR}\"]}\nrewards: [{kind: exact_match}]\n",
      "job.yaml", {"logging.run_dir=${MILES_RC_TEST_DIR}/run"});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->model.path, "/x/m");
  EXPECT_EQ(c->model.tokenizer, "../shared/t");
  EXPECT_EQ(c->model.reference, "a${MILES_RC_TEST_DIR}b");
  EXPECT_EQ(c->data.path, "d.jsonl");  // like the shell's :-, empty takes the default
  EXPECT_EQ(c->data.label_key, "");
  EXPECT_EQ(c->rollout.stop, std::vector<std::string>{"/x"});
  EXPECT_EQ(c->logging.run_dir, "/x/run");
  EXPECT_EQ(c->weight_sync.dir, "/x/run/weights");
}

TEST(RunConfigEnv, UnsetVariableIsAnError) {
  unsetenv("MILES_RC_TEST_UNSET");
  EXPECT_EQ(error_of("model:\n  path: ${MILES_RC_TEST_UNSET}/m\n"),
            "job.yaml:2: model.path: environment variable MILES_RC_TEST_UNSET is not set (write "
            "${MILES_RC_TEST_UNSET:-default} for a fallback)");
  EXPECT_EQ(error_of("model:\n  path: ${MILES_RC_TEST_UNSET/m\n"),
            "job.yaml:2: model.path: unterminated ${ in \"${MILES_RC_TEST_UNSET/m\"");
  EXPECT_EQ(error_of("model:\n  path: ${1X}\n"),
            "job.yaml:2: model.path: bad variable name in ${1X}");
}

}  // namespace
}  // namespace miles
