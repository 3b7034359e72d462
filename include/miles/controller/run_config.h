// The job file of `miles run`: typed sections, validated before anything starts.
//
// Why: an RL job has a dozen coupled knobs (batch sizes, parallel layout, staleness, rewards); a
// typo or an inconsistent value must stop the run at load time with the YAML line at fault and a
// hint, not after an hour of rollouts. Every key has a type and a default; unknown keys, wrong
// types and values that break an invariant (docs/contracts.md §1: rollout_batch_size ×
// n_samples_per_prompt = global_batch_size × num_steps_per_rollout) are errors that name
// `file:line: section.key` and what would be accepted ("did you mean ...?" for unknown keys).
//
// Command-line overrides `section.key=value` (value parsed as YAML: numbers, booleans, strings,
// flow lists `[a, b]`) are applied after the file and reported as `override section.key`.
// String values expand `${VAR}` and `${VAR:-default}` from the environment (so a config can say
// `${MILES_SHARED_DIR:-../shared}/models/...`).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "miles/controller/config_enum.h"
#include "miles/controller/reward.h"
#include "miles/device_model.h"
#include "miles/status.h"

namespace miles {

// The enums of the job file (config_enum.h).

enum class Environment { kNone, kCalculator };
enum class LrDecay { kConstant, kCosine };
enum class TrainerComm { kShm, kGloo };
enum class Advantage { kGrpo, kDrGrpo, kReinforcePp, kReinforcePpBaseline };
enum class PolicyLoss { kPpo, kGspo };
enum class KlEstimatorKind { kNone, kK1, kK2, kK3 };
enum class Reduction { kTokenMean, kSampleMean, kConstant };
enum class Correction { kNone, kTis, kMisToken, kMisSequence };
enum class OldLogp { kRollout, kRecompute };
enum class Transport { kDiskDelta, kBroadcast, kP2p };
enum class WeightComm { kAuto, kGloo, kShm };
enum class Encoding { kDifference, kXor, kOverwrite };
enum class Compression { kSmall, kFast };
enum class AsyncMode { kSync, kOneStepOff, kAsync };
enum class StalePolicy { kDrop, kRetry };
enum class SyncPause { kRetract, kInPlace, kAbort };
enum class Progress { kAuto, kBar, kLines, kNone };

#define MILES_CONFIG_ENUM(E, ...)                                                       \
  template <>                                                                           \
  struct ConfigEnum<E> {                                                                \
    static constexpr std::array names = std::to_array<std::string_view>({__VA_ARGS__}); \
  };
MILES_CONFIG_ENUM(Device, "cpu", "cuda", "emulated")
MILES_CONFIG_ENUM(Environment, "none", "calculator")
MILES_CONFIG_ENUM(LrDecay, "constant", "cosine")
MILES_CONFIG_ENUM(TrainerComm, "shm", "gloo")
MILES_CONFIG_ENUM(Advantage, "grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline")
MILES_CONFIG_ENUM(PolicyLoss, "ppo", "gspo")
MILES_CONFIG_ENUM(KlEstimatorKind, "none", "k1", "k2", "k3")
MILES_CONFIG_ENUM(Reduction, "token_mean", "sample_mean", "constant")
MILES_CONFIG_ENUM(Correction, "none", "tis", "mis_token", "mis_sequence")
MILES_CONFIG_ENUM(OldLogp, "rollout", "recompute")
MILES_CONFIG_ENUM(Transport, "disk_delta", "broadcast", "p2p")
MILES_CONFIG_ENUM(WeightComm, "auto", "gloo", "shm")
MILES_CONFIG_ENUM(Encoding, "difference", "xor", "overwrite")
MILES_CONFIG_ENUM(Compression, "small", "fast")
MILES_CONFIG_ENUM(AsyncMode, "sync", "one_step_off", "async")
MILES_CONFIG_ENUM(StalePolicy, "drop", "retry")
MILES_CONFIG_ENUM(SyncPause, "retract", "in_place", "abort")
MILES_CONFIG_ENUM(Progress, "auto", "bar", "lines", "none")
#undef MILES_CONFIG_ENUM

struct ModelSection {
  std::string path;       // HF directory or llama2.c checkpoint (required)
  std::string tokenizer;  // default: found beside the model
  std::string reference;  // reference model for KL (default: the initial policy, `path`)
};

// Supervised fine-tuning: a job file with `sft.data` is an SFT job (controller/sft_job.h), run by
// the same job layer and trainer group as RL; it uses the model, trainer, parallel, checkpoint,
// logging and controller sections and must not set the RL ones (rollout, algorithm, data, eval,
// rewards, weight_sync, async, check, trainer.num_steps_per_rollout).
struct SftSection {
  std::string data;       // JSONL: {"text": ...} or {"input_ids": [...]} per line; set: an SFT job
  int64_t steps = 10;     // optimizer steps of trainer.global_batch_size samples
  int64_t max_len = 256;  // tokens kept per sample
};

struct RolloutSection {
  int64_t num_rollouts = 10;           // rollout steps of the run (required > 0)
  int64_t rollout_batch_size = 8;      // prompts per rollout step
  int64_t n_samples_per_prompt = 8;    // samples per prompt (a group)
  int64_t over_sampling_batch_size = 0;  // prompts asked per step (0: rollout_batch_size; else >=)
  bool filter_zero_variance = false;   // drop groups whose rewards are all equal
  int64_t max_new_tokens = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  std::vector<std::string> stop;       // stop strings
  uint64_t seed = 1;                   // sample seeds derive from (seed, rollout step, prompt, n)
  // Multi-turn: `calculator` runs each sample as a TITO session (chat template required) in which
  // tool calls in the model's text get a tool message with the result, up to max_turns model turns.
  Environment environment = Environment::kNone;
  int64_t max_turns = 4;
  // Or the user's own: "package.module:name", an `async def fn(client, sample)` run for each
  // sample in an embedded CPython (controller/rollout_function.h), its module found in
  // `python_path`, the working directory or $VIRTUAL_ENV; max_turns bounds its model turns.
  std::string function;
  std::string python_path;
  // Engines: `num_engines` started by the controller (`miles serve` processes on this machine),
  // plus any listed in `engines` ("host:http_port/grpc_port") or registering themselves with
  // `miles serve --controller HOST:PORT`.
  int64_t num_engines = 1;
  std::vector<std::string> engines;
  int64_t engine_threads = 1;          // compute threads of each started engine (per process)
  int64_t engine_tp = 1;               // tensor-parallel processes of each started engine
  Device engine_device = Device::kCpu;  // where started engines' forwards run
  int64_t engine_num_blocks = 4096;
  int64_t engine_max_batch_tokens = 2048;
  int64_t engine_max_running = 256;
  // Speculative decoding in started engines (docs/speculative.md): the model-free suffix drafter
  // over each sample's siblings and the prompt's earlier responses; samples are the same bits.
  bool speculative = false;
  int64_t speculative_max_draft_tokens = 4;
  bool speculative_adaptive = true;  // draft only where the engine's measured costs say it pays
  // The co-trained draft head (include/miles/draft_head.h): the trainer fits it to the policy every
  // step (its loss and estimated acceptance in metrics.jsonl as draft_*), each weight version's
  // head is published beside it, and with `speculative` the started engines draft with the head
  // of their version instead of the suffix drafter (docs/speculative.md).
  bool speculative_draft_head = false;
  double speculative_draft_lr = 1e-4;
  int64_t speculative_draft_vocab = 4096;  // draft vocabulary: the most frequent ids trained on
  // The policy layers whose outputs the head reads (empty: the last; several: EAGLE-3's features,
  // e.g. [1, 15, 26] of 30 layers), ascending.
  std::vector<int64_t> speculative_draft_layers;
  // EAGLE-3's training-time test: the head is also trained on its own drafted features, this
  // many passes in all (1: on the policy's features only; DraftHead::accumulate_grad's passes).
  int64_t speculative_draft_ttt_length = 1;
  double health_check_interval_s = 1.0;
  double engine_start_timeout_s = 60;
  int64_t max_engine_restarts = 3;     // per engine, over the run
};

struct TrainerSection {
  int64_t global_batch_size = 64;      // samples per optimizer step
  int64_t num_steps_per_rollout = 1;
  int64_t micro_batch_size = 1;
  double lr = 1e-6;
  double min_lr = 0;
  int64_t warmup_steps = 0;
  LrDecay decay = LrDecay::kConstant;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip_grad_norm = 1.0;
  int64_t threads = 1;                 // compute threads of the trainer
  Device device = Device::kCpu;        // where forward and backward run
};

struct ParallelSection {
  int64_t dp = 1, pp = 1, tp = 1;      // trainer layout
  TrainerComm comm = TrainerComm::kShm;  // the trainer ranks' collectives: shm is one host
  // The highest `remote_ranks` ranks join from other hosts (`miles train-worker --controller
  // HOST:PORT`, controller/trainer_group.h); the controller starts the others on its host.
  int64_t remote_ranks = 0;
  // The address the trainer ranks on the controller's host bind their collectives to (remote ranks
  // connect to it). "": controller.host (127.0.0.1 when no rank is remote).
  std::string host;
  double timeout_s = 600;  // seconds a rank waits for the others (joining, each collective)
};

struct AlgorithmSection {
  Advantage advantage = Advantage::kGrpo;
  bool std_normalize = true;
  PolicyLoss policy_loss = PolicyLoss::kPpo;
  double eps_clip = 0.2;               // ε_low
  double eps_clip_high = 0.2;          // ε_high (DAPO clip-higher)
  double dual_clip_c = 0;              // 0 = off, else > 1
  KlEstimatorKind kl_estimator = KlEstimatorKind::kNone;
  double kl_coef = 0;
  double entropy_coef = 0;
  Reduction loss_reduction = Reduction::kTokenMean;
  double constant_normaliser = 0;      // loss_reduction constant: > 0
  Correction correction = Correction::kNone;
  double tis_c = 2.0, mis_low = 0.5, mis_high = 2.0;
  OldLogp old_logp = OldLogp::kRollout;  // rollout: the engine's raw logprobs
};

struct DataSection {
  std::string path;                    // JSONL, one prompt per line (required)
  std::string prompt_key = "prompt";   // a string, or chat messages with apply_chat_template
  std::string label_key = "label";     // any JSON, passed to the rewards
  bool apply_chat_template = false;
  bool shuffle = true;                 // reshuffled every epoch with `seed`
  uint64_t seed = 1;
};

// Evaluation on held-out prompts (controller/evaluator.h): before the first step, every `every`
// steps and after the last, on the engines, with its own sampling; `miles eval` runs it once.
struct EvalSection {
  std::string data;             // JSONL with the data section's keys; empty: no evaluation
  int64_t every = 0;            // rollout steps between evaluations (0: only `miles eval`)
  int64_t n_samples = 1;        // samples per prompt: pass@k with k = n_samples
  double temperature = 0.0;     // 0: greedy
  int64_t max_prompts = 0;      // the file's first N prompts (0: all)
  int64_t max_new_tokens = 0;   // 0: rollout.max_new_tokens
  double pass_threshold = 1.0;  // a sample passes when its reward is at least this
};

struct WeightSyncSection {
  Transport transport = Transport::kDiskDelta;  // broadcast, p2p: Gloo groups with engines
  std::string dir;                     // default RUN_DIR/weights
  int64_t full_every = 10;
  int64_t keep_versions = 4;  // newest versions kept loadable on disk (0: every version)
  Encoding encoding = Encoding::kDifference;      // a delta's changed tensors (DeltaEncoding)
  Compression compression =
      Compression::kSmall;             // how the data files' frames are made (DeltaCompression)
  bool check_checksums = true;         // compare engine and trainer checksums after every update
  double group_timeout_s = 60;         // broadcast / p2p: forming a group, and each collective
  // broadcast / p2p: the groups' communicator. shm: shared memory (the engines on the
  // controller's host, one sending trainer rank, one-process engines); gloo: TCP; auto: shm
  // where it applies, else gloo.
  WeightComm comm = WeightComm::kAuto;
};

struct AsyncSection {
  AsyncMode mode = AsyncMode::kSync;
  int64_t max_weight_staleness = 1;    // versions, per sample (async)
  StalePolicy stale_policy = StalePolicy::kDrop;
  int64_t update_weights_interval = 1; // optimizer steps between syncs (async)
  int64_t buffer_groups = 0;           // async buffer bound (0: 2 × over_sampling_batch_size)
  SyncPause pause_mode = SyncPause::kRetract;  // in-flight work at a sync
};

struct CheckpointSection {
  std::string dir;                     // default RUN_DIR/checkpoints
  int64_t save_every = 0;              // rollout steps; 0 = only at the end when save_final
  bool save_final = false;
  bool resume = false;                 // continue from the newest checkpoint in dir
};

struct LoggingSection {
  std::string run_dir = "runs/default";  // metrics.jsonl, weights, checkpoints, engine logs
  Progress progress = Progress::kAuto;   // auto: a bar on a terminal
  bool tensorboard = true;               // RUN_DIR/tensorboard: scalars, histograms, samples
  int64_t samples_every = 1;             // RUN_DIR/samples/step_N.jsonl every N steps (0: off)
  int64_t samples_keep = 50;             // sample files kept, the newest (0: all)
  int64_t report_every = 1;              // RUN_DIR/report.html, live, every N steps (0: off)
};

struct ControllerSection {
  std::string host = "127.0.0.1";      // gRPC controller service (status, engine registration)
  int64_t port = 0;                    // 0: any free port (written to RUN_DIR/controller.json)
};

// `miles check`: the thresholds of the train–rollout agreement gate (defaults: true on-policy,
// every difference must be exactly zero).
struct CheckSection {
  double max_logp_abs_diff = 0;   // per token |trainer logp − engine logp|, max over the batch
  double max_rollout_kl = 0;      // KL(rollout || train), k3 estimate
  double min_ess = 1.0;           // effective sample size of the importance weights, in (0, 1]
  double min_r3_agreement = 1.0;  // MoE: fraction of tokens whose replayed experts equal rollout's
  double max_ppo_kl = 0;          // |ppo_kl| of the first optimizer step
  double max_clipfrac = 0;        // clipfrac of the first optimizer step
  std::vector<std::string> layouts;  // trainer layouts ("dp=2", "pp=2", "tp=2", "dp=2,pp=2")
  double grad_norm_rel_tol = 0;   // |Δ grad norm| / grad norm allowed between layouts (0: bitwise)
  // The same for layouts with tp > 1: their forward (logprobs, loss) is bitwise where the split
  // falls on chunk boundaries, but column-parallel input gradients add the ranks' partials off the
  // single-process tree (within ~1e-7 relative).
  double grad_norm_rel_tol_tp = 1e-6;
  std::string report;             // the JSON report (default RUN_DIR/check.json)
};

struct RunConfig {
  std::string source;                  // the file it was read from
  ModelSection model;
  SftSection sft;
  RolloutSection rollout;
  TrainerSection trainer;
  ParallelSection parallel;
  AlgorithmSection algorithm;
  DataSection data;
  EvalSection eval;
  std::vector<RewardSpec> rewards;     // YAML list under `rewards:` (at least one)
  WeightSyncSection weight_sync;
  AsyncSection async;
  CheckpointSection checkpoint;
  LoggingSection logging;
  ControllerSection controller;
  CheckSection check;

  // An SFT job (sft.data set) rather than an RL job.
  bool is_sft() const { return !sft.data.empty(); }
};

// Reads `path`, applies `overrides` ("section.key=value"), validates. Errors name the file, line
// and key.
Result<RunConfig> load_run_config(const std::string& path,
                                  const std::vector<std::string>& overrides);
// The same from YAML text (`source_name` stands for the file in messages).
Result<RunConfig> parse_run_config(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides);
// Cross-field checks (batch invariant, layout divisibility, staleness ≥ 0, ...); parse_run_config
// calls it. Messages name the keys involved and the values.
Status validate_run_config(const RunConfig& config);
// The resolved config as YAML (written to RUN_DIR/config.yaml so a run records what it ran).
std::string run_config_to_yaml(const RunConfig& config);

}  // namespace miles
