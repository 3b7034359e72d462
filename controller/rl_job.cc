// RlJob setup and teardown (rl_job_internal.h): run directory, trainer (and resume), rewards,
// prompts, weight publisher, controller service, engines.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "controller/rl_job_internal.h"
#include "miles/device_model.h"
#include "miles/host_port.h"
#include "miles/model.h"
#include "miles/tensor_parallel.h"
#include "miles/trainer/train_checkpoint.h"

namespace miles::controller {

namespace fs = std::filesystem;

RlJob::~RlJob() {
  rt_.stop_service();  // first: its calls read the members below
  if (engines_) engines_->stop();
}

void RlJob::log_line(const std::string& line) {
  if (metrics_) {
    metrics_->message("miles run: " + line);
  } else {
    spdlog::info("miles run: {}", line);
  }
}

bool RlJob::should_stop() const { return rt_.should_stop(); }

Status RlJob::setup_trainer() {
  if (cfg_.algorithm.old_logp == OldLogp::kRecompute &&
      (cfg_.parallel.pp > 1 || cfg_.parallel.tp > 1))
    return Status::Error(
        "algorithm.old_logp recompute needs parallel.pp = parallel.tp = 1 (use rollout)");
  MILES_ASSIGN_OR_RETURN(TrainState st, rt_.start_trainer_group());
  group_ = &rt_.group();
  if (cfg_.checkpoint.resume) {
    if (st.step == 0) {
      log_line("checkpoint.resume: no checkpoint in " + cfg_.checkpoint.dir + "; starting fresh");
    } else {
      rollout_step_ = st.step;
      next_position_ = trained_position_ = st.data_position;
      log_line("resumed from " + cfg_.checkpoint.dir + "/" + checkpoint_dir_name(st.step) +
               " (rollout step " + std::to_string(rollout_step_) + ", weight version " +
               std::to_string(group_->trainer().steps_done()) + ")");
      if (cfg_.rollout.speculative_draft_head) {
        MILES_ASSIGN_OR_RETURN(const DraftTrainState d, group_->trainer().draft_state());
        log_line(d.steps > 0 ? "draft head resumed after its step " + std::to_string(d.steps)
                             : std::string("rollout.speculative_draft_head: the checkpoint holds "
                                           "no draft head; the resumed run trains a new one"));
      }
    }
  }
  if (cfg_.algorithm.kl_coef > 0) {
    std::string ref = cfg_.model.reference.empty() ? cfg_.model.path : cfg_.model.reference;
    MILES_ASSIGN_OR_RETURN(ModelFiles rf, load_model_files(ref));
    pool_ = std::make_unique<ThreadPool>(static_cast<int>(cfg_.trainer.threads));
    MILES_ASSIGN_OR_RETURN(reference_, Trainer::create(rf.config, rf.weights,
                                                       group_->trainer().config(), pool_.get()));
  }
  return Status::Ok();
}

// The controller's gRPC service, before the trainer: remote trainer ranks join through it.
Status RlJob::start_service() {
  return rt_.start_service([this](v1::ControllerStatus* s) {
    s->set_rollout_step(rollout_step_);
    s->set_num_rollouts(cfg_.rollout.num_rollouts);
    if (const WeightPublisher* p = published_.load()) s->set_weight_version(p->current());
    s->set_mode(std::string(name_of(cfg_.async.mode)));
    s->set_last_reward_mean(last_reward_.load());
    s->set_run_dir(cfg_.logging.run_dir);
  });
}

Status RlJob::setup_engines() {
  EnginePoolOptions po;
  po.launch.model = cfg_.model.path;
  po.launch.tokenizer = cfg_.model.tokenizer;
  po.launch.threads = cfg_.rollout.engine_threads;
  po.launch.tp = cfg_.rollout.engine_tp;
  po.launch.device = std::string(name_of(cfg_.rollout.engine_device));
  po.launch.num_blocks = cfg_.rollout.engine_num_blocks;
  po.launch.max_batch_tokens = cfg_.rollout.engine_max_batch_tokens;
  po.launch.max_running = cfg_.rollout.engine_max_running;
  po.launch.speculative = cfg_.rollout.speculative;
  po.launch.spec_max_draft_tokens = cfg_.rollout.speculative_max_draft_tokens;
  po.launch.spec_adaptive = cfg_.rollout.speculative_adaptive;
  po.launch.spec_draft_head = cfg_.rollout.speculative_draft_head;
  po.launch.log_dir = cfg_.logging.run_dir + "/engines";
  // The engines load weight versions from the disk-delta directory only (docs/security.md).
  po.launch.weights_dir =
      std::filesystem::absolute(cfg_.weight_sync.dir.empty() ? cfg_.logging.run_dir + "/weights"
                                                             : cfg_.weight_sync.dir)
          .lexically_normal()
          .string();
  po.health_interval_s = cfg_.rollout.health_check_interval_s;
  po.start_timeout_s = cfg_.rollout.engine_start_timeout_s;
  po.max_restarts = cfg_.rollout.max_engine_restarts;
  WeightPublisher* pub = publisher_.get();
  po.prepare = [pub](EngineClient& e) { return pub->bring(e, nullptr); };
  po.log = [this](const std::string& s) { log_line(s); };
  engines_ = std::make_unique<EnginePool>(std::move(po));
  engines_->set_controller_address(rt_.controller_address());
  rt_.service().attach_engines(*engines_);

  for (const std::string& e : cfg_.rollout.engines) {
    // "host:http_port/grpc_port"
    const size_t colon = e.rfind(':'), slash = e.find('/', colon == std::string::npos ? 0 : colon);
    if (colon == std::string::npos || slash == std::string::npos)
      return Status::Error("rollout.engines: '" + e + "' is not host:http_port/grpc_port");
    EngineAddress a;
    a.host = unbracket(e.substr(0, colon));
    a.http_port = std::atoi(e.substr(colon + 1, slash - colon - 1).c_str());
    a.grpc_port = std::atoi(e.substr(slash + 1).c_str());
    if (a.http_port <= 0 || a.grpc_port <= 0)
      return Status::Error("rollout.engines: '" + e + "' is not host:http_port/grpc_port");
    MILES_RETURN_IF_ERROR(engines_->attach(a));
  }
  if (cfg_.rollout.num_engines > 0)
    MILES_RETURN_IF_ERROR(engines_->start_local(cfg_.rollout.num_engines));
  const int64_t want = cfg_.rollout.num_engines + static_cast<int64_t>(cfg_.rollout.engines.size());
  return engines_->wait_ready(std::max<int64_t>(want, 1), cfg_.rollout.engine_start_timeout_s);
}

Status RlJob::setup() {
  MILES_RETURN_IF_ERROR(rt_.make_run_dir());
  MILES_RETURN_IF_ERROR(start_service());
  std::vector<RewardSpec> specs = cfg_.rewards;
  for (const RewardSpec& s : specs) MILES_RETURN_IF_ERROR(s.validate());
  MILES_ASSIGN_OR_RETURN(rewards_, RewardModel::create(specs));
  if (!cfg_.rollout.function.empty()) {
    MILES_ASSIGN_OR_RETURN(rollout_function_,
                           RolloutFunction::load(cfg_.rollout.function, cfg_.rollout.python_path));
  }
  MILES_ASSIGN_OR_RETURN(PromptData d,
                         PromptData::load(cfg_.data, *res_.tokenizer, res_.chat.get()));
  data_ = std::make_unique<PromptData>(std::move(d));
  MILES_RETURN_IF_ERROR(setup_trainer());
  MILES_ASSIGN_OR_RETURN(const Trainer* full, group_->full());
  // Transport broadcast: one group per pipeline stage, stages 1.. sent by the ranks that lead them;
  // p2p: every trainer rank sends its own shards.
  StageSenders senders;
  TrainerRank* rank = group_;
  senders.local = [rank](const std::string& name) {
    return std::as_const(rank->trainer()).params().get(name);
  };
  senders.join = [rank](const std::string& store, const std::string& prefix, int world,
                        double timeout_s, bool shm) {
    return rank->join_weight_groups(store, prefix, world, timeout_s, shm);
  };
  senders.on_host = cfg_.parallel.remote_ranks == 0;
  senders.send = [rank](int64_t version) { return rank->send_stage_weights(version); };
  MILES_ASSIGN_OR_RETURN(publisher_,
                         WeightPublisher::create(
                             cfg_.weight_sync, *full, cfg_.controller.host,
                             [this](const std::string& s) { log_line(s); }, rank->layout(),
                             std::move(senders), static_cast<int>(cfg_.rollout.engine_tp)));
  published_ = publisher_.get();
  const int64_t version = full->steps_done();
  MILES_RETURN_IF_ERROR(publisher_->drop_newer_than(version));
  MILES_RETURN_IF_ERROR(publisher_->publish(version, *full));
  MILES_ASSIGN_OR_RETURN(
      metrics_,
      MetricsLog::open(cfg_.logging.run_dir + "/metrics.jsonl", cfg_.logging.progress,
                       cfg_.rollout.num_rollouts, cfg_.checkpoint.resume ? rollout_step_ : -1));
  if (cfg_.logging.tensorboard) {
    MILES_ASSIGN_OR_RETURN(tensorboard_,
                           TensorBoardLog::open(cfg_.logging.run_dir + "/tensorboard"));
  }
  MILES_ASSIGN_OR_RETURN(
      samples_,
      SampleDump::open(cfg_.logging.run_dir, cfg_.logging.samples_every, cfg_.logging.samples_keep,
                       cfg_.checkpoint.resume ? rollout_step_ : -1));
  const ModelConfig& mc = full->model_config();
  if (cfg_.rollout.engine_tp > 1)  // before any engine starts: say which dimension does not split
    MILES_RETURN_IF_ERROR(tensor_parallel::local_config(mc, cfg_.rollout.engine_tp)
                              .status()
                              .with_context("rollout.engine_tp"));
  if (cfg_.rollout.engine_device != Device::kCpu)  // before any engine starts: model and GPU
    MILES_RETURN_IF_ERROR(check_device_engines(std::string(name_of(cfg_.rollout.engine_device)), mc)
                              .with_context("rollout.engine_device"));
  MILES_RETURN_IF_ERROR(setup_engines());
  runner_ = std::make_unique<GroupRunner>(*engines_, *rewards_, *res_.tokenizer, cfg_.rollout,
                                          mc.num_moe_layers() * mc.moe.top_k, res_.chat.get(),
                                          rollout_function_.get());
  if (!cfg_.eval.data.empty()) {
    MILES_ASSIGN_OR_RETURN(evaluator_,
                           Evaluator::create(cfg_, *engines_, cfg_.rewards, *res_.tokenizer,
                                             res_.chat.get(), mc.num_moe_layers() * mc.moe.top_k));
    MILES_ASSIGN_OR_RETURN(
        eval_log_, MetricsLog::open(cfg_.logging.run_dir + "/eval.jsonl", Progress::kNone, 0,
                                    cfg_.checkpoint.resume ? rollout_step_ : -1));
  }
  return Status::Ok();
}

Result<RunSummary> RlJob::run() {
  last_step_end_ = Clock::now();
  if (evaluator_ && cfg_.eval.every > 0 && rollout_step_ == 0) {  // the starting point
    MILES_RETURN_IF_ERROR(evaluate_and_log().status());
  }
  Status s = cfg_.async.mode == AsyncMode::kSync         ? run_sync()
             : cfg_.async.mode == AsyncMode::kOneStepOff ? run_one_step_off()
                                                         : run_async();
  if (cfg_.logging.report_every > 0 && rollout_step_ > 0) write_live_report(/*live=*/false);
  if (!s.ok()) return s;
  MILES_RETURN_IF_ERROR(group_->stop());
  RunSummary sum;
  sum.rollout_steps = rollout_step_;
  // Two disjoint windows: up to 5 steps each, at most half of the steps (none for one step).
  const size_t n = reward_means_.size(), k = std::min<size_t>(5, n / 2);
  sum.window_steps = static_cast<int64_t>(k);
  for (size_t i = 0; i < k; ++i) {
    sum.first_reward_mean += reward_means_[i] / k;
    sum.last_reward_mean += reward_means_[n - k + i] / k;
  }
  sum.evaluations = static_cast<int64_t>(evals_.size());
  if (!evals_.empty()) {
    sum.eval_k = evaluator_->k();
    sum.first_eval = {evals_.front().reward_mean, evals_.front().pass_at_1,
                      evals_.front().pass_at_k};
    sum.last_eval = {evals_.back().reward_mean, evals_.back().pass_at_1, evals_.back().pass_at_k};
  }
  return sum;
}

Result<EvalResult> RlJob::evaluate_once() {
  if (!evaluator_) return Status::Error("eval.data: no held-out prompts to evaluate on");
  // Asked for a checkpoint's weights: the initial model in their place would be a wrong answer.
  if (cfg_.checkpoint.resume && rollout_step_ == 0)
    return Status::Error("checkpoint.dir " + cfg_.checkpoint.dir +
                         " holds no checkpoint to evaluate (checkpoint.resume is set)");
  MILES_ASSIGN_OR_RETURN(EvalResult r, evaluator_->run());
  MILES_RETURN_IF_ERROR(
      SampleDump::write_eval(cfg_.logging.run_dir, rollout_step_, r.groups, *res_.tokenizer));
  MILES_RETURN_IF_ERROR(group_->stop());
  return r;
}

Result<RunSummary> run_rl_job(const RunConfig& config, const RunResources& resources) {
  RlJob job(config, resources);
  MILES_RETURN_IF_ERROR(job.setup());
  return job.run();
}

}  // namespace miles::controller

namespace miles::controller {

Result<nlohmann::json> run_rl_eval(const RunConfig& config, const RunResources& resources) {
  RunConfig c = config;
  c.checkpoint.save_every = 0;
  c.checkpoint.save_final = false;
  c.logging.samples_every = 0;
  c.logging.tensorboard = false;
  RlJob job(c, resources);
  MILES_RETURN_IF_ERROR(job.setup());
  MILES_ASSIGN_OR_RETURN(EvalResult r, job.evaluate_once());
  nlohmann::json j = r.metrics(job.eval_k());
  j["eval_min_weight_version"] = r.min_version;
  return j;
}

Result<nlohmann::json> run_rl_check(const RunConfig& config, const RunResources& resources) {
  RunConfig c = config;
  c.weight_sync.check_checksums = true;
  c.checkpoint.resume = false;
  c.checkpoint.save_every = 0;
  c.checkpoint.save_final = false;
  c.async.mode = AsyncMode::kSync;
  RlJob job(c, resources);
  MILES_RETURN_IF_ERROR(job.setup());
  return job.check();
}

}  // namespace miles::controller
