// TrainerRank / TrainerWorkers (trainer_group.h).
#include "controller/trainer_group.h"

#include <unistd.h>

#include <cmath>
#include <mutex>

#include "controller/batch_wire.h"
#include "controller/child_process.h"
#include "controller/train_batch.h"
#include "miles/model.h"

namespace miles::controller {

namespace {

enum Command : int64_t { kStop = 0, kTrain = 1, kGather = 2 };

Result<TrainerConfig> trainer_config(const RunConfig& cfg) {
  const TrainerSection& t = cfg.trainer;
  TrainerConfig tc;
  tc.optimizer.beta1 = t.beta1;
  tc.optimizer.beta2 = t.beta2;
  tc.optimizer.eps = t.eps;
  tc.optimizer.weight_decay = t.weight_decay;
  tc.optimizer.clip_grad_norm = t.clip_grad_norm;
  tc.lr.lr = t.lr;
  tc.lr.min_lr = t.min_lr;
  tc.lr.warmup_steps = t.warmup_steps;
  tc.lr.total_steps = cfg.rollout.num_rollouts * t.num_steps_per_rollout;
  tc.lr.decay = t.decay == "cosine" ? LrSchedule::Decay::kCosine : LrSchedule::Decay::kConstant;
  tc.micro_batch_size = t.micro_batch_size;
  tc.need_entropy = cfg.algorithm.entropy_coef != 0;
  tc.replay_experts = true;
  MILES_RETURN_IF_ERROR(tc.validate());
  return tc;
}

// Adds |trainer logp − engine logp| sums (reduced over ranks with the other metric sums) and keeps
// this rank's max.
TokenObjective with_mismatch(TokenObjective base, std::span<const RlSampleData> data, double* max) {
  return [base = std::move(base), data, max](const TokenView& v) -> Result<TokenLoss> {
    double sum = 0, nonzero = 0, count = 0;
    for (size_t s = 0; s < v.samples.size(); ++s) {
      const std::vector<float>& r = data[v.samples[s]].rollout_logp;
      for (int64_t j = v.offsets[s]; j < v.offsets[s + 1]; ++j) {
        const double d = std::fabs(static_cast<double>(v.logp[j]) - r[j - v.offsets[s]]);
        sum += d;
        nonzero += d != 0;
        count += 1;
        *max = std::max(*max, d);
      }
    }
    MILES_ASSIGN_OR_RETURN(TokenLoss loss, base(v));
    loss.sums["mismatch_abs_sum"] += sum;
    loss.sums["mismatch_nonzero"] += nonzero;
    loss.sums["mismatch_tokens"] += count;
    return loss;
  };
}

}  // namespace

Result<std::unique_ptr<TrainerRank>> TrainerRank::create(const RunConfig& cfg, int rank,
                                                         int world_size, const std::string& store,
                                                         TrainState* resumed) {
  auto r = std::unique_ptr<TrainerRank>(new TrainerRank());
  r->cfg_ = cfg;
  MILES_ASSIGN_OR_RETURN(r->layout_, ParallelLayout::create(static_cast<int>(cfg.parallel.dp),
                                                            static_cast<int>(cfg.parallel.pp),
                                                            static_cast<int>(cfg.parallel.tp)));
  if (r->layout_.world_size() != world_size)
    return Status::Error(
        "trainer group: world size " + std::to_string(world_size) +
        " does not match parallel dp × pp × tp = " + std::to_string(r->layout_.world_size()));
  MILES_ASSIGN_OR_RETURN(TrainerConfig tc, trainer_config(cfg));
  MILES_ASSIGN_OR_RETURN(ModelFiles files, load_model_files(cfg.model.path));
  r->pool_ = std::make_unique<ThreadPool>(static_cast<int>(cfg.trainer.threads));
  MILES_ASSIGN_OR_RETURN(r->trainer_,
                         Trainer::create(files.config, files.weights, tc, r->pool_.get()));
  *resumed = TrainState{};
  if (cfg.checkpoint.resume) {
    auto latest = latest_checkpoint(cfg.checkpoint.dir);
    if (latest.ok()) {
      MILES_ASSIGN_OR_RETURN(*resumed, load_checkpoint(*latest, *r->trainer_));
    }
  }
  if (world_size > 1) {
    CommOptions co;
    co.rank = rank;
    co.world_size = world_size;
    co.store_address = store;
    co.prefix = "rl";
    co.timeout = std::chrono::milliseconds(600'000);
    MILES_ASSIGN_OR_RETURN(r->world_, connect_gloo(co));
    MILES_ASSIGN_OR_RETURN(r->groups_, make_parallel_groups(*r->world_, r->layout_));
    if (r->layout_.pp() > 1)
      MILES_RETURN_IF_ERROR(r->trainer_->set_pipeline_stage(r->groups_.coord.pp, r->layout_.pp()));
    if (r->layout_.tp() > 1)
      MILES_RETURN_IF_ERROR(r->trainer_->shard_for_tensor_parallel(*r->groups_.tp));
  }
  return r;
}

TrainerRank::~TrainerRank() = default;

Result<TrainOutcome> TrainerRank::run_steps(const std::vector<TrainSample>& samples,
                                            const std::vector<RlSampleData>& data) {
  MILES_ASSIGN_OR_RETURN(rl::LossConfig lc, loss_config(cfg_.algorithm));
  const int64_t gbs = cfg_.trainer.global_batch_size;
  const int64_t steps = cfg_.trainer.num_steps_per_rollout;
  if (static_cast<int64_t>(samples.size()) != gbs * steps || data.size() != samples.size())
    return Status::Error("trainer: " + std::to_string(samples.size()) + " samples for " +
                         std::to_string(steps) + " steps of " + std::to_string(gbs));
  const TrainerComms comms{groups_.dp.get(), groups_.pp.get()};
  TrainOutcome out;
  for (int64_t k = 0; k < steps; ++k) {
    std::span<const TrainSample> s(samples.data() + k * gbs, gbs);
    std::span<const RlSampleData> d(data.data() + k * gbs, gbs);
    MILES_ASSIGN_OR_RETURN(TokenObjective obj, rl_objective(s, d, lc));
    if (k == 0) obj = with_mismatch(std::move(obj), d, &out.mismatch_max);
    MILES_ASSIGN_OR_RETURN(StepResult r, trainer_->step(s, obj, comms));
    for (const auto& [name, v] : r.sums) out.sums[name] += v;
    out.loss += r.loss / static_cast<double>(steps);
    out.grad_norm = std::max(out.grad_norm, r.grad_norm);
    out.lr = r.lr;
  }
  return out;
}

Result<const Trainer*> TrainerRank::gather() {
  if (groups_.pp) MILES_RETURN_IF_ERROR(trainer_->gather_pipeline_state(*groups_.pp));
  if (layout_.tp() > 1) {
    MILES_ASSIGN_OR_RETURN(gathered_, trainer_->gather_tensor_parallel(*groups_.tp));
    return gathered_.get();
  }
  return trainer_.get();
}

Status TrainerRank::command(int64_t cmd, const std::vector<uint8_t>& payload) {
  if (!world_) return Status::Ok();
  int64_t header[2] = {cmd, static_cast<int64_t>(payload.size())};
  MILES_RETURN_IF_ERROR(world_->broadcast(header, sizeof header, 0));
  if (!payload.empty()) {
    std::vector<uint8_t> copy = payload;
    MILES_RETURN_IF_ERROR(world_->broadcast(copy.data(), copy.size(), 0));
  }
  return Status::Ok();
}

Result<TrainOutcome> TrainerRank::train(const std::vector<TrainSample>& samples,
                                        const std::vector<RlSampleData>& data) {
  if (world_) MILES_RETURN_IF_ERROR(command(kTrain, encode_batch(samples, data)));
  return run_steps(samples, data);
}

Result<const Trainer*> TrainerRank::full() {
  if (!world_) return static_cast<const Trainer*>(trainer_.get());
  if (whole()) return static_cast<const Trainer*>(trainer_.get());  // dp replicas are equal
  MILES_RETURN_IF_ERROR(command(kGather, {}));
  return gather();
}

Status TrainerRank::stop() { return command(kStop, {}); }

Status TrainerRank::follow() {
  while (true) {
    int64_t header[2] = {0, 0};
    MILES_RETURN_IF_ERROR(world_->broadcast(header, sizeof header, 0));
    if (header[0] == kStop) return world_->barrier();
    std::vector<uint8_t> payload(static_cast<size_t>(header[1]));
    if (!payload.empty())
      MILES_RETURN_IF_ERROR(world_->broadcast(payload.data(), payload.size(), 0));
    if (header[0] == kGather) {
      MILES_RETURN_IF_ERROR(gather().status());
    } else if (header[0] == kTrain) {
      std::vector<TrainSample> samples;
      std::vector<RlSampleData> data;
      MILES_RETURN_IF_ERROR(decode_batch(payload, &samples, &data));
      MILES_RETURN_IF_ERROR(run_steps(samples, data).status());
    } else {
      return Status::Error("trainer worker: unknown command " + std::to_string(header[0]));
    }
  }
}

Result<std::unique_ptr<TrainerWorkers>> TrainerWorkers::start(const RunConfig& cfg,
                                                              const std::string& config_path) {
  auto w = std::unique_ptr<TrainerWorkers>(new TrainerWorkers());
  TcpStoreServerOptions so;
  so.host = cfg.controller.host;
  MILES_ASSIGN_OR_RETURN(w->store_, TcpStoreServer::start(so));
  const int64_t world = cfg.parallel.dp * cfg.parallel.pp * cfg.parallel.tp;
  for (int64_t r = 1; r < world; ++r) {
    std::vector<std::string> argv = {miles_executable(), "rl-worker",
                                     "--rank",           std::to_string(r),
                                     "--world-size",     std::to_string(world),
                                     "--store",          w->store_->address(),
                                     "--config",         config_path};
    MILES_ASSIGN_OR_RETURN(ChildProcess p,
                           ChildProcess::spawn(argv, cfg.logging.run_dir + "/trainer_rank_" +
                                                         std::to_string(r) + ".log"));
    w->procs_.push_back(std::move(p));
  }
  return w;
}

TrainerWorkers::~TrainerWorkers() {
  // Workers exit after the stop command; give them a moment, then make sure.
  for (ChildProcess& p : procs_) {
    for (int i = 0; i < 100 && p.alive(); ++i) usleep(50'000);
    p.terminate();
  }
}

}  // namespace miles::controller
