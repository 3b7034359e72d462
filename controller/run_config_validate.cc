// Value checks of a typed RunConfig: enumerations, ranges, required keys, and the invariants that
// tie sections together (the batch invariant, layout divisibility, KL and staleness settings).
//
// Why: these are the mistakes that otherwise surface an hour into a run (or never, as a silently
// wrong objective). Each error names the keys and values involved and, when the parser saw the key,
// where it came from (`job.yaml:12` or `override section.key=value`). All errors are reported at
// once, one per line. Reward entries are checked by RewardSpec::validate (the controller calls it).
#include <algorithm>
#include <initializer_list>
#include <string>

#include "controller/run_config_internal.h"
#include "miles/device_model.h"
#include "miles/draft_head.h"
#include "miles/parallel_layout.h"

namespace miles::run_config_internal {
namespace {

std::string str(int64_t v) { return std::to_string(v); }
std::string str(double v) { return format_number(v); }

class Checker {
 public:
  Checker(const RunConfig& config, const Origins& origins) : config_(config), origins_(origins) {}

  // Records "<origin of the first key that has one>: <message>"; without any, the source file.
  void fail(std::initializer_list<std::string_view> keys, const std::string& message) {
    std::string where = config_.source;
    for (std::string_view key : keys) {
      auto it = origins_.find(std::string(key));
      if (it != origins_.end()) {
        where = it->second;
        break;
      }
    }
    errors_.push_back(where.empty() ? message : where + ": " + message);
  }
  void fail(std::string_view key, const std::string& message) {
    fail({key}, std::string(key) + ": " + message);
  }

  template <typename T>
  void at_least(std::string_view key, T value, T min) {
    if (!(value >= min)) fail(key, "must be >= " + str(min) + ", got " + str(value));
  }
  template <typename T>
  void positive(std::string_view key, T value) {
    if (!(value > 0)) fail(key, "must be > 0, got " + str(value));
  }
  void required(std::string_view key, const std::string& value, std::string_view what) {
    if (value.empty()) fail(key, "required (" + std::string(what) + ")");
  }

  Status status() const {
    if (errors_.empty()) return Status::Ok();
    std::string message;
    for (const std::string& e : errors_) message += (message.empty() ? "" : "\n") + e;
    return Status::Error(message);
  }

 private:
  const RunConfig& config_;
  const Origins& origins_;
  std::vector<std::string> errors_;
};

// "host:http_port/grpc_port" with both ports in 1..65535.
bool valid_engine_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  const size_t slash = address.rfind('/');
  if (colon == std::string::npos || colon == 0 || slash == std::string::npos || slash < colon) {
    return false;
  }
  for (std::string port :
       {address.substr(colon + 1, slash - colon - 1), address.substr(slash + 1)}) {
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
        std::stoi(port) > 65535) {
      return false;
    }
  }
  return true;
}

// Every optimizer step's samples split into whole micro-batches on every data-parallel rank.
void check_micro_batches(const RunConfig& c, Checker& check) {
  const TrainerSection& t = c.trainer;
  if (t.micro_batch_size >= 1 && c.parallel.dp >= 1 &&
      t.global_batch_size % (t.micro_batch_size * c.parallel.dp) != 0) {
    check.fail({"trainer.global_batch_size", "trainer.micro_batch_size", "parallel.dp"},
               "trainer.global_batch_size: " + str(t.global_batch_size) +
                   " is not divisible by trainer.micro_batch_size × parallel.dp = " +
                   str(t.micro_batch_size) + " × " + str(c.parallel.dp) + " = " +
                   str(t.micro_batch_size * c.parallel.dp));
  }
}

void check_batches(const RunConfig& c, Checker& check) {
  const auto& r = c.rollout;
  const auto& t = c.trainer;
  if (r.rollout_batch_size < 1 || r.n_samples_per_prompt < 1 || t.global_batch_size < 1 ||
      t.num_steps_per_rollout < 1) {
    return;  // reported by the range checks
  }
  int64_t produced = 0, consumed = 0;
  if (__builtin_mul_overflow(r.rollout_batch_size, r.n_samples_per_prompt, &produced) ||
      __builtin_mul_overflow(t.global_batch_size, t.num_steps_per_rollout, &consumed)) {
    check.fail({"rollout.rollout_batch_size", "trainer.global_batch_size"},
               "batch sizes: the products overflow 64 bits");
    return;
  }
  if (produced != consumed) {
    std::string fix =
        produced % t.num_steps_per_rollout == 0
            ? "trainer.global_batch_size: " + str(produced / t.num_steps_per_rollout)
            : "trainer.num_steps_per_rollout: 1 and trainer.global_batch_size: " + str(produced);
    check.fail({"trainer.global_batch_size", "trainer.num_steps_per_rollout",
                "rollout.rollout_batch_size", "rollout.n_samples_per_prompt"},
               "batch sizes: rollout.rollout_batch_size × rollout.n_samples_per_prompt = " +
                   str(r.rollout_batch_size) + " × " + str(r.n_samples_per_prompt) + " = " +
                   str(produced) +
                   " samples per rollout step, but trainer.global_batch_size × "
                   "trainer.num_steps_per_rollout = " +
                   str(t.global_batch_size) + " × " + str(t.num_steps_per_rollout) + " = " +
                   str(consumed) + " (did you mean " + fix + "?)");
  }
  check_micro_batches(c, check);
  if (r.over_sampling_batch_size != 0 && r.over_sampling_batch_size < r.rollout_batch_size) {
    check.fail("rollout.over_sampling_batch_size",
               "must be 0 (as many as rollout.rollout_batch_size) or >= "
               "rollout.rollout_batch_size (" +
                   str(r.rollout_batch_size) + "), got " + str(r.over_sampling_batch_size));
  }
}

// rollout.function: "module:name", alone (not with an environment), on chat prompts; the
// `rollout` reward kind needs it.
void check_rollout_function(const RunConfig& c, Checker& check) {
  const RolloutSection& r = c.rollout;
  const size_t colon = r.function.find(':');
  if (!r.function.empty() &&
      (colon == std::string::npos || colon == 0 || colon + 1 == r.function.size() ||
       r.function.find(':', colon + 1) != std::string::npos)) {
    check.fail("rollout.function", "must be \"package.module:name\", got \"" + r.function + "\"");
    return;
  }
  if (!r.function.empty() && r.environment != Environment::kNone)
    check.fail({"rollout.function", "rollout.environment"},
               "rollout.function: runs the sample's session itself; rollout.environment must be "
               "none, got " +
                   std::string(name_of(r.environment)));
  if (!r.function.empty() && !c.data.apply_chat_template)
    check.fail({"rollout.function", "data.apply_chat_template"},
               "rollout.function: runs chat sessions; it needs data.apply_chat_template: true");
  if (r.function.empty() && !r.python_path.empty())
    check.fail({"rollout.python_path", "rollout.function"},
               "rollout.python_path: given without rollout.function");
  for (size_t i = 0; i < c.rewards.size(); ++i)
    if (c.rewards[i].kind == RewardKind::kRollout && r.function.empty())
      check.fail({"rewards"}, "rewards[" + std::to_string(i) +
                                  "]: kind rollout scores what rollout.function returns; "
                                  "rollout.function is not set");
}

void check_rollout(const RunConfig& c, Checker& check) {
  const auto& r = c.rollout;
  check.positive("rollout.num_rollouts", r.num_rollouts);
  check.positive("rollout.rollout_batch_size", r.rollout_batch_size);
  check.positive("rollout.n_samples_per_prompt", r.n_samples_per_prompt);
  check.at_least<int64_t>("rollout.over_sampling_batch_size", r.over_sampling_batch_size, 0);
  check.positive("rollout.max_new_tokens", r.max_new_tokens);
  check.positive("rollout.max_turns", r.max_turns);
  check.at_least<int64_t>("logging.samples_every", c.logging.samples_every, 0);
  check.at_least<int64_t>("eval.every", c.eval.every, 0);
  check.positive("eval.n_samples", c.eval.n_samples);
  check.at_least("eval.temperature", c.eval.temperature, 0.0);
  check.at_least<int64_t>("eval.max_prompts", c.eval.max_prompts, 0);
  check.at_least<int64_t>("eval.max_new_tokens", c.eval.max_new_tokens, 0);
  if (c.eval.every > 0 && c.eval.data.empty())
    check.fail({"eval.every", "eval.data"},
               "eval.every: " + str(c.eval.every) + " evaluates on eval.data, which is empty");
  check.at_least<int64_t>("logging.samples_keep", c.logging.samples_keep, 0);
  check.at_least<int64_t>("logging.report_every", c.logging.report_every, 0);
  if (r.environment != Environment::kNone && !c.data.apply_chat_template)
    check.fail({"rollout.environment", "data.apply_chat_template"},
               "rollout.environment: " + std::string(name_of(r.environment)) +
                   " runs chat sessions; it needs data.apply_chat_template: true");
  check_rollout_function(c, check);
  check.at_least("rollout.temperature", r.temperature, 0.0);
  if (!(r.top_p > 0 && r.top_p <= 1)) {
    check.fail("rollout.top_p", "must be in (0, 1], got " + str(r.top_p));
  }
  check.at_least<int64_t>("rollout.top_k", r.top_k, 0);
  check.at_least<int64_t>("rollout.num_engines", r.num_engines, 0);
  if (r.num_engines == 0 && r.engines.empty() && c.controller.port == 0) {
    check.fail({"rollout.num_engines", "rollout.engines", "controller.port"},
               "rollout.num_engines: 0 engines to start, none in rollout.engines, and "
               "controller.port is 0 so none can register (start some, list some, or set "
               "controller.port)");
  }
  for (size_t i = 0; i < r.engines.size(); ++i) {
    if (!valid_engine_address(r.engines[i])) {
      check.fail({"rollout.engines"}, "rollout.engines[" + std::to_string(i) +
                                          "]: expected \"host:http_port/grpc_port\", got " +
                                          double_quoted(r.engines[i]));
    }
  }
  check.positive("rollout.engine_threads", r.engine_threads);
  check.positive("rollout.engine_tp", r.engine_tp);
  if (r.engine_device != Device::kCpu && r.engine_tp > 1)
    check.fail({"rollout.engine_device", "rollout.engine_tp"},
               "rollout.engine_device: " + std::string(name_of(r.engine_device)) +
                   " with engine_tp > 1: tensor-parallel engines run on the CPU only for now");
  check.positive("rollout.engine_num_blocks", r.engine_num_blocks);
  check.positive("rollout.engine_max_batch_tokens", r.engine_max_batch_tokens);
  check.positive("rollout.engine_max_running", r.engine_max_running);
  check.positive("rollout.speculative_max_draft_tokens", r.speculative_max_draft_tokens);
  if (r.speculative_max_draft_tokens > 64)
    check.fail({"rollout.speculative_max_draft_tokens"},
               "rollout.speculative_max_draft_tokens: " +
                   std::to_string(r.speculative_max_draft_tokens) + " is more than 64");
  check.positive("rollout.speculative_draft_lr", r.speculative_draft_lr);
  check.at_least<int64_t>("rollout.speculative_draft_vocab", r.speculative_draft_vocab, 2);
  const std::vector<int64_t>& layers = r.speculative_draft_layers;
  if (!layers.empty() && !r.speculative_draft_head)
    check.fail({"rollout.speculative_draft_layers", "rollout.speculative_draft_head"},
               "rollout.speculative_draft_layers: the draft head's feature layers need "
               "rollout.speculative_draft_head: true");
  if (static_cast<int64_t>(layers.size()) > DraftHead::kMaxFeatureLayers)
    check.fail({"rollout.speculative_draft_layers"},
               "rollout.speculative_draft_layers: " + std::to_string(layers.size()) +
                   " layers; at most " + std::to_string(DraftHead::kMaxFeatureLayers));
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i] < 0 || (i > 0 && layers[i] <= layers[i - 1])) {
      check.fail({"rollout.speculative_draft_layers"},
                 "rollout.speculative_draft_layers: layer indices must be non-negative, ascending "
                 "and distinct (" +
                     std::to_string(layers[i]) + " at position " + std::to_string(i) + ")");
      break;
    }
  if (r.speculative_draft_ttt_length < 1 || r.speculative_draft_ttt_length > DraftHead::kMaxPasses)
    check.fail(
        {"rollout.speculative_draft_ttt_length"},
        "rollout.speculative_draft_ttt_length: " + std::to_string(r.speculative_draft_ttt_length) +
            " passes; 1 to " + std::to_string(DraftHead::kMaxPasses));
  else if (r.speculative_draft_ttt_length > 1 && !r.speculative_draft_head)
    check.fail({"rollout.speculative_draft_ttt_length", "rollout.speculative_draft_head"},
               "rollout.speculative_draft_ttt_length: training the draft head on its own drafts "
               "needs rollout.speculative_draft_head: true");
  check.positive("rollout.health_check_interval_s", r.health_check_interval_s);
  check.positive("rollout.engine_start_timeout_s", r.engine_start_timeout_s);
  check.at_least<int64_t>("rollout.max_engine_restarts", r.max_engine_restarts, 0);
}

// Remote trainer ranks (controller/trainer_group.h) meet over Gloo at an address they can reach.
void check_remote_ranks(const RunConfig& c, Checker& check) {
  const ParallelSection& p = c.parallel;
  const int64_t world = p.dp * p.pp * p.tp;
  if (p.remote_ranks < 0 || (p.remote_ranks > 0 && p.remote_ranks >= world)) {
    check.fail({"parallel.remote_ranks", "parallel.dp", "parallel.pp", "parallel.tp"},
               "parallel.remote_ranks: must be in [0, dp × pp × tp − 1] = [0, " +
                   str(std::max<int64_t>(world - 1, 0)) + "] (rank 0 is the controller), got " +
                   str(p.remote_ranks));
    return;
  }
  if (p.remote_ranks == 0) return;
  if (p.comm != TrainerComm::kGloo)
    check.fail({"parallel.remote_ranks", "parallel.comm"},
               "parallel.remote_ranks: " + str(p.remote_ranks) +
                   " needs parallel.comm gloo (shm reaches ranks on one host only)");
  const std::string& host = p.host.empty() ? c.controller.host : p.host;
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]")
    check.fail({"parallel.host", "controller.host"},
               "parallel.remote_ranks: the controller's trainer ranks need an address remote "
               "ranks can reach: set parallel.host to this host's address (controller.host is " +
                   (host.empty() ? std::string("empty") : "the wildcard " + host) + ")");
}

void check_trainer(const RunConfig& c, Checker& check) {
  const auto& t = c.trainer;
  check.positive("trainer.global_batch_size", t.global_batch_size);
  check.positive("trainer.num_steps_per_rollout", t.num_steps_per_rollout);
  check.positive("trainer.micro_batch_size", t.micro_batch_size);
  check.positive("trainer.lr", t.lr);
  check.at_least("trainer.min_lr", t.min_lr, 0.0);
  if (t.lr > 0 && t.min_lr > t.lr) {
    check.fail("trainer.min_lr", "must be <= trainer.lr (" + str(t.lr) + "), got " + str(t.min_lr));
  }
  check.at_least<int64_t>("trainer.warmup_steps", t.warmup_steps, 0);
  if (t.device != Device::kCpu && (c.parallel.tp > 1 || c.parallel.pp > 1))
    check.fail({"trainer.device", "parallel.tp", "parallel.pp"},
               "trainer.device: " + std::string(name_of(t.device)) +
                   " with parallel.tp or parallel.pp > 1: a device trainer runs data parallelism "
                   "only for now");
  check.at_least("trainer.weight_decay", t.weight_decay, 0.0);
  for (auto [key, beta] : {std::pair{"trainer.beta1", t.beta1}, {"trainer.beta2", t.beta2}}) {
    if (!(beta >= 0 && beta < 1)) check.fail(key, "must be in [0, 1), got " + str(beta));
  }
  check.positive("trainer.eps", t.eps);
  check.at_least("trainer.clip_grad_norm", t.clip_grad_norm, 0.0);
  check.positive("trainer.threads", t.threads);
  check.positive("parallel.dp", c.parallel.dp);
  check.positive("parallel.pp", c.parallel.pp);
  check.positive("parallel.tp", c.parallel.tp);
  check_remote_ranks(c, check);
}

void check_algorithm(const RunConfig& c, Checker& check) {
  const auto& a = c.algorithm;
  check.at_least("algorithm.eps_clip", a.eps_clip, 0.0);
  check.at_least("algorithm.eps_clip_high", a.eps_clip_high, 0.0);
  if (!(a.dual_clip_c == 0 || a.dual_clip_c > 1)) {
    check.fail("algorithm.dual_clip_c", "must be 0 (off) or > 1, got " + str(a.dual_clip_c));
  }
  check.at_least("algorithm.kl_coef", a.kl_coef, 0.0);
  if (a.kl_coef > 0 && a.kl_estimator == KlEstimatorKind::kNone) {
    check.fail({"algorithm.kl_coef", "algorithm.kl_estimator"},
               "algorithm.kl_coef: " + str(a.kl_coef) +
                   " needs algorithm.kl_estimator k1, k2 or k3 (it is none)");
  } else if (a.kl_coef == 0 && a.kl_estimator != KlEstimatorKind::kNone) {
    check.fail({"algorithm.kl_estimator", "algorithm.kl_coef"},
               "algorithm.kl_estimator: " + std::string(name_of(a.kl_estimator)) +
                   " needs algorithm.kl_coef > 0 (it is 0; or set kl_estimator: none)");
  }
  check.at_least("algorithm.constant_normaliser", a.constant_normaliser, 0.0);
  if (a.loss_reduction == Reduction::kConstant && !(a.constant_normaliser > 0)) {
    check.fail({"algorithm.constant_normaliser", "algorithm.loss_reduction"},
               "algorithm.constant_normaliser: must be > 0 with algorithm.loss_reduction "
               "constant, got " +
                   str(a.constant_normaliser));
  }
  check.positive("algorithm.tis_c", a.tis_c);
  check.at_least("algorithm.mis_low", a.mis_low, 0.0);
  if (a.mis_low > a.mis_high) {
    check.fail({"algorithm.mis_low", "algorithm.mis_high"},
               "algorithm.mis_low: must be <= algorithm.mis_high (" + str(a.mis_high) + "), got " +
                   str(a.mis_low));
  }
}

void check_required(const RunConfig& c, Checker& check) {
  check.required("model.path", c.model.path, "the HF model directory or llama2.c checkpoint");
  check.required("data.path", c.data.path, "the JSONL prompt file");
  check.required("data.prompt_key", c.data.prompt_key, "the prompt's field in each JSONL row");
  if (c.rewards.empty()) {
    check.fail({"rewards"},
               "rewards: at least one reward is required (e.g. rewards: [{kind: exact_match}])");
  }
}

void check_services(const RunConfig& c, Checker& check) {
  check.positive("weight_sync.full_every", c.weight_sync.full_every);
  check.at_least<int64_t>("weight_sync.keep_versions", c.weight_sync.keep_versions, 0);
  check.positive("weight_sync.group_timeout_s", c.weight_sync.group_timeout_s);
  const WeightSyncSection& w = c.weight_sync;
  if (w.comm != WeightComm::kAuto && w.transport == Transport::kDiskDelta)
    check.fail({"weight_sync.comm", "weight_sync.transport"},
               "weight_sync.comm: " + std::string(name_of(w.comm)) +
                   " is the communicator of the broadcast and p2p transports; "
                   "weight_sync.transport is disk_delta");
  const int64_t senders = w.transport == Transport::kP2p
                              ? c.parallel.dp * c.parallel.pp * c.parallel.tp
                              : c.parallel.pp;
  if (w.comm == WeightComm::kShm && w.transport != Transport::kDiskDelta && senders > 1 &&
      c.parallel.remote_ranks > 0)
    check.fail({"weight_sync.comm", "parallel.remote_ranks"},
               "weight_sync.comm: shm needs every sending trainer rank on the controller's host (" +
                   std::to_string(senders) + " send here, parallel.remote_ranks " +
                   std::to_string(c.parallel.remote_ranks) + "); use gloo or auto");
  if (c.rollout.speculative && c.rollout.speculative_draft_head && c.rollout.engine_tp > 1 &&
      w.transport != Transport::kDiskDelta)
    check.fail({"rollout.speculative_draft_head", "rollout.engine_tp", "weight_sync.transport"},
               "rollout.speculative_draft_head: tensor-parallel engines build the head from the "
               "policy's whole weights, and a weight group hands each of their ranks its shard "
               "only; use weight_sync.transport disk_delta");
  const auto& y = c.async;
  check.at_least<int64_t>("async.max_weight_staleness", y.max_weight_staleness, 0);
  if (y.mode == AsyncMode::kOneStepOff && y.max_weight_staleness == 0) {
    check.fail({"async.max_weight_staleness", "async.mode"},
               "async.max_weight_staleness: must be >= 1 with async.mode one_step_off, got 0");
  }
  check.positive("async.update_weights_interval", y.update_weights_interval);
  check.at_least<int64_t>("async.buffer_groups", y.buffer_groups, 0);
}

// What every job has: checkpoints, the run directory, the controller's service.
void check_job(const RunConfig& c, Checker& check) {
  check.at_least<int64_t>("checkpoint.save_every", c.checkpoint.save_every, 0);
  check.required("logging.run_dir", c.logging.run_dir, "where the run writes everything");
  check.required("controller.host", c.controller.host, "the controller service's address");
  if (c.controller.port < 0 || c.controller.port > 65535) {
    check.fail("controller.port",
               "must be in 0..65535 (0: any free port), got " + str(c.controller.port));
  }
}

}  // namespace

void check_gate(const RunConfig& c, Checker& check) {
  const CheckSection& q = c.check;
  check.at_least("check.max_logp_abs_diff", q.max_logp_abs_diff, 0.0);
  check.at_least("check.max_rollout_kl", q.max_rollout_kl, 0.0);
  check.at_least("check.max_ppo_kl", q.max_ppo_kl, 0.0);
  check.at_least("check.max_clipfrac", q.max_clipfrac, 0.0);
  check.at_least("check.grad_norm_rel_tol", q.grad_norm_rel_tol, 0.0);
  check.at_least("check.grad_norm_rel_tol_tp", q.grad_norm_rel_tol_tp, 0.0);
  if (!(q.min_ess > 0 && q.min_ess <= 1))
    check.fail({"check.min_ess"}, "check.min_ess: must be in (0, 1], got " + str(q.min_ess));
  if (!(q.min_r3_agreement >= 0 && q.min_r3_agreement <= 1))
    check.fail({"check.min_r3_agreement"},
               "check.min_r3_agreement: must be in [0, 1], got " + str(q.min_r3_agreement));
  for (size_t i = 0; i < q.layouts.size(); ++i) {
    auto l = ParallelLayout::parse(q.layouts[i]);
    if (!l.ok())
      check.fail({"check.layouts"},
                 "check.layouts[" + std::to_string(i) + "]: " + l.message() + " (e.g. dp=2,pp=2)");
  }
}

// An SFT job: its own keys, and none of the RL job's (they would be ignored).
void check_sft(const RunConfig& c, const Origins& origins, Checker& check) {
  check.required("model.path", c.model.path, "the HF model directory or llama2.c checkpoint");
  check.positive("sft.steps", c.sft.steps);
  check.at_least<int64_t>("sft.max_len", c.sft.max_len, 2);
  for (const auto& [path, where] : origins) {
    if (rl_only_path(path))
      check.fail({path}, path +
                             ": not used by an SFT job (sft.data is set); remove it, or "
                             "remove sft.data for an RL job");
  }
  if (c.trainer.global_batch_size >= 1) check_micro_batches(c, check);
}

Status validate_with_origins(const RunConfig& config, const Origins& origins) {
  Checker check(config, origins);
  check.positive("parallel.timeout_s", config.parallel.timeout_s);
  if (config.is_sft()) {
    check_sft(config, origins, check);
    check_trainer(config, check);
    check_job(config, check);
    return check.status();
  }
  for (const auto& [path, where] : origins) {
    if (path.starts_with("sft."))
      check.fail({path}, path + ": only an SFT job uses it (set sft.data for one)");
  }
  check_required(config, check);
  check_rollout(config, check);
  check_trainer(config, check);
  check_batches(config, check);
  check_algorithm(config, check);
  check_services(config, check);
  check_job(config, check);
  check_gate(config, check);
  return check.status();
}

}  // namespace miles::run_config_internal
