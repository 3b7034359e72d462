// EngineWeights (engine_weights.h): adopting a version, disk-delta and checkpoint loads, checksums.
// The weight groups' join and receive are in engine_weights_group.cc.
#include "miles/weight_sync/engine_weights.h"

#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/path_guard.h"
#include "miles/rollout/engine.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/engine_weights_state.h"

namespace miles {

namespace {

// xxh3-128 of each tensor of a checkpoint, as float32 (as the trainer holds it).
Result<std::map<std::string, std::string>> checksums_of(const ModelFiles& f) {
  auto layout = ParamLayout::for_model(f.config, &f.weights);
  MILES_ASSIGN_OR_RETURN(FlatTensors t, FlatTensors::from_tensor_map(layout, f.weights));
  std::map<std::string, std::string> sums;
  for (const ParamSpec& s : layout->specs()) {
    std::span<const float> v = std::as_const(t).get(s.name);
    sums[s.name] = xxh3_128_hex(v.data(), v.size_bytes());
  }
  return sums;
}

}  // namespace

int64_t EngineWeights::State::engine_version() {
  return driver->call<int64_t>([](Engine& e) { return e.stats().weight_version; });
}

Status EngineWeights::State::initial_checksums() {
  if (have_checksums) return Status::Ok();
  MILES_ASSIGN_OR_RETURN(ModelFiles f, load_model_files(model_path));
  MILES_ASSIGN_OR_RETURN(checksums, checksums_of(f));
  have_checksums = true;
  return Status::Ok();
}

WeightReply EngineWeights::State::adopt(const ReceivedWeights& got) {
  Status applied;
  driver->run_sync([&](Engine& e) {
    applied = apply_to_engine(e, config, got, plan, pool);
    if (applied.ok() && adopt_hook) {
      const TensorMap view = got.view();
      adopt_hook(e, got.version, &view);
    }
  });
  return record(applied, got.version, got.checksums);
}

WeightReply EngineWeights::State::adopt_runner(std::unique_ptr<ModelRunner> runner, int64_t v,
                                               std::map<std::string, std::string> sums) {
  Status applied;
  driver->run_sync([&](Engine& e) {
    applied = apply_runner_to_engine(e, std::move(runner), v);
    if (applied.ok() && adopt_hook) adopt_hook(e, v, nullptr);
  });
  return record(applied, v, std::move(sums));
}

void EngineWeights::set_adopt_hook(AdoptHook hook) { st_->adopt_hook = std::move(hook); }

WeightReply EngineWeights::State::record(const Status& applied, int64_t v,
                                         std::map<std::string, std::string> sums) {
  if (!applied.ok()) {
    const bool generating = applied.message().find("pause it first") != std::string::npos;
    return WeightReply::refuse(generating ? WeightFault::kConflict : WeightFault::kInvalid,
                               applied.message());
  }
  checksums = std::move(sums);
  have_checksums = true;
  return WeightReply::done(v);
}

void EngineWeights::State::drop_groups(const std::vector<std::shared_ptr<WeightGroupJoin>>& js) {
  std::lock_guard<std::mutex> lock(group_mu);
  if (groups.joins == js) groups = WeightGroups{};
}

Result<const TransferPlan*> EngineWeights::State::plan_for(const ParallelLayout& layout) {
  const std::string key = layout.to_string();
  auto it = plans.find(key);
  if (it != plans.end()) return &it->second;
  auto params = ParamLayout::for_model(config);
  MILES_ASSIGN_OR_RETURN(TransferPlan made, make_transfer_plan(config, *params, layout));
  return &plans.emplace(key, std::move(made)).first->second;
}

EngineWeights::EngineWeights(rollout::EngineDriver& driver, ModelConfig config,
                             std::string model_path, ThreadPool* pool,
                             std::shared_ptr<rollout::TpShardIntake> tp_intake,
                             WeightSyncTrust trust)
    : st_(std::make_unique<State>()) {
  st_->driver = &driver;
  st_->config = std::move(config);
  st_->model_path = std::move(model_path);
  st_->pool = pool;
  st_->tp_intake = std::move(tp_intake);
  st_->trust = std::move(trust);
  auto layout = ParamLayout::for_model(st_->config);
  auto plan = make_transfer_plan(st_->config, *layout, ParallelLayout{});
  if (plan.ok()) st_->plan = std::move(*plan);
  st_->plan_digest = transfer_plan_digest(st_->plan);
}

EngineWeights::~EngineWeights() {
  std::lock_guard<std::mutex> lock(st_->group_mu);
  for (JoinThread& j : st_->threads)
    if (j.thread.joinable()) j.thread.join();
}

const std::string& EngineWeights::plan_digest() const { return st_->plan_digest; }

WeightReply EngineWeights::update_from_disk_delta(const std::string& dir, int64_t v) {
  if (v < 0) return refuse_negative_version(v);
  if (Status c = confine_path(dir, st_->trust.weight_dirs, "--weights-dir"); !c.ok())
    return WeightReply::refuse(WeightFault::kForbidden, c.message());
  std::lock_guard<std::mutex> lock(st_->mu);
  auto& rx = st_->receivers[dir];
  if (!rx) rx = make_disk_delta_receiver(dir, st_->plan);
  auto got = rx->receive(v);
  if (!got.ok()) {
    st_->receivers.erase(dir);  // start over from the latest full version next time
    return WeightReply::refuse(WeightFault::kInvalid, got.message());
  }
  WeightReply r = st_->adopt(*got);
  if (!r.ok()) st_->receivers.erase(dir);
  return r;
}

WeightReply EngineWeights::load_checkpoint(const std::string& path) {
  if (Status c = confine_path(path, st_->trust.weight_dirs, "--weights-dir"); !c.ok())
    return WeightReply::refuse(WeightFault::kForbidden, c.message());
  auto files = load_model_files(path);
  if (!files.ok()) return WeightReply::refuse(WeightFault::kInvalid, files.message());
  auto sums = checksums_of(*files);
  if (!sums.ok()) return WeightReply::refuse(WeightFault::kInvalid, sums.message());
  std::lock_guard<std::mutex> lock(st_->mu);
  Status applied;
  st_->driver->run_sync([&](Engine& e) { applied = e.update_weights(files->weights); });
  WeightReply r = st_->record(applied, st_->engine_version(), std::move(*sums));
  if (r.ok()) st_->receivers.clear();  // a disk-delta receiver's copy is not the engine's now
  return r;
}

Result<WeightChecksums> EngineWeights::checksums() {
  std::lock_guard<std::mutex> lock(st_->mu);
  MILES_RETURN_IF_ERROR(st_->initial_checksums());
  return WeightChecksums{st_->engine_version(), st_->checksums};
}

Result<WeightCheck> EngineWeights::check(const std::map<std::string, std::string>& theirs) {
  MILES_ASSIGN_OR_RETURN(WeightChecksums mine, checksums());
  std::vector<std::string> bad;
  for (const auto& [name, sum] : mine.checksums) {
    auto it = theirs.find(name);
    if (it == theirs.end() || it->second != sum) bad.push_back(name);
  }
  for (const auto& [name, sum] : theirs)
    if (!mine.checksums.count(name)) bad.push_back(name);
  WeightCheck c;
  c.match = bad.empty();
  c.version = mine.version;
  c.message = bad.empty() ? "all " + std::to_string(mine.checksums.size()) + " tensors match"
                          : std::to_string(bad.size()) + " tensors differ, e.g. " + bad[0];
  return c;
}

}  // namespace miles
