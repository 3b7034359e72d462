// WeightPublisher (weight_publisher.h).
#include "controller/weight_publisher.h"

#include <filesystem>
#include <thread>

#include "miles/flat_params.h"
#include "miles/trainer/trainer.h"
#include "miles/weight_sync/disk_delta.h"
#include "miles/weight_sync/draft_files.h"

namespace miles::controller {

namespace fs = std::filesystem;

namespace {

TensorSource source_of(const Trainer& trainer) {
  return [&trainer](const std::string& name) { return trainer.params().get(name); };
}

std::map<std::string, std::string> checksums_of(const Trainer& trainer, const TransferPlan& plan) {
  std::map<std::string, std::string> out;
  for (const Bucket& b : plan.buckets)
    for (const PlannedTensor& t : b.tensors) {
      std::span<const float> v = trainer.params().get(t.name);
      out[t.name] = xxh3_128_hex(v.data(), v.size_bytes());
    }
  return out;
}

using Checksums = std::map<std::string, std::string>;

// The checksums a tensor-parallel engine of `engine_tp` ranks reports after a weight group brought
// every rank its own shard.
Checksums sharded_checksums_of(const Trainer& trainer, const TransferPlan& plan, int engine_tp) {
  Checksums out;
  for (const Bucket& b : plan.buckets)
    for (const PlannedTensor& t : b.tensors)
      out[t.name] = sharded_checksum_of(t.name, t.shape, trainer.params().get(t.name), engine_tp);
  return out;
}

// OK when the engine holds version v with the expected checksums (whole tensors, or `sharded`'s
// per-shard form when given); else what differs.
Status compare_held(const EngineClient& engine, int64_t v, const WeightChecksums& held,
                    const Checksums& expected, const Checksums& sharded = {}) {
  int64_t bad = 0;
  std::string first;
  for (const auto& [name, sum] : expected) {
    auto it = held.checksums.find(name);
    auto alt = sharded.find(name);
    if (it == held.checksums.end() ||
        (it->second != sum && (alt == sharded.end() || it->second != alt->second))) {
      if (!bad++) first = name;
    }
  }
  if (held.version == v && bad == 0) return Status::Ok();
  return Status::Error("engine " + engine.address().http() + " holds version " +
                       std::to_string(held.version) + ", not " + std::to_string(v) + " (" +
                       std::to_string(bad) + " tensors differ" +
                       (first.empty() ? "" : ", e.g. " + first) + ")");
}

// fn(i) for i in [0, n), each on a thread of its own (engine calls that should overlap).
void for_each_parallel(size_t n, const std::function<void(size_t)>& fn) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

}  // namespace

Result<std::unique_ptr<WeightPublisher>> WeightPublisher::create(
    const WeightSyncSection& cfg, const Trainer& trainer, const std::string& host,
    std::function<void(const std::string&)> log, const ParallelLayout& layout, StageSenders senders,
    int engine_tp) {
  auto p = std::unique_ptr<WeightPublisher>(new WeightPublisher());
  p->cfg_ = cfg;
  p->log_ = std::move(log);
  p->engine_tp_ = cfg.transport == Transport::kDiskDelta ? 1 : engine_tp;
  // Engines are told this path; one on another host (Slurm, Kubernetes) resolves a relative path
  // against its own working directory, so send the absolute one.
  p->cfg_.dir = fs::absolute(cfg.dir).lexically_normal().string();
  MILES_ASSIGN_OR_RETURN(p->plan_, make_transfer_plan(trainer.model_config(),
                                                      trainer.params().layout(), ParallelLayout{}));
  DiskDeltaOptions o;
  o.full_every = static_cast<int>(cfg.full_every);
  o.encoding = cfg.encoding == Encoding::kOverwrite ? DeltaEncoding::kOverwrite
               : cfg.encoding == Encoding::kXor     ? DeltaEncoding::kXor
                                                    : DeltaEncoding::kDifference;
  o.compression =
      cfg.compression == Compression::kFast ? DeltaCompression::kFast : DeltaCompression::kSmall;
  WeightPublisher* self = p.get();
  o.known_xxh3 = [self](const std::string& name) -> std::string {
    auto it = self->disk_sums_.find(name);
    return it == self->disk_sums_.end() ? "" : it->second;
  };
  std::error_code ec;
  fs::create_directories(p->cfg_.dir, ec);
  if (ec) return Status::Error("weight_sync.dir " + p->cfg_.dir + ": " + ec.message());
  p->sender_ = make_disk_delta_sender(p->cfg_.dir, p->plan_, o);
  if (cfg.transport != Transport::kDiskDelta) {
    WeightGroupOptions go;
    go.host = host;
    go.log = p->log_;
    go.senders = std::move(senders);
    go.transport = cfg.transport;
    go.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.group_timeout_s * 1000));
    go.trainer = layout;
    go.engine_tp = p->engine_tp_;
    go.comm = cfg.comm;
    MILES_ASSIGN_OR_RETURN(TransferPlan group_plan,
                           weight_group_plan(cfg.transport, trainer.model_config(),
                                             trainer.params().layout(), layout));
    MILES_ASSIGN_OR_RETURN(p->group_, WeightGroup::create(std::move(go), std::move(group_plan)));
  }
  return p;
}

WeightPublisher::~WeightPublisher() {
  const Status s = disk_written();
  if (!s.ok() && log_) log_(s.message());
}

Status WeightPublisher::disk_written() const {
  std::lock_guard<std::mutex> lock(disk_mu_);
  if (disk_.valid()) disk_status_ = disk_.get();
  return disk_status_;
}

Status WeightPublisher::publish(int64_t version, const Trainer& trainer) {
  auto sums = checksums_of(trainer, plan_);
  MILES_RETURN_IF_ERROR(disk_written());  // the last version's disk copy, before this one's
  MILES_RETURN_IF_ERROR(prune(version));
  DiskDeltaReader reader(cfg_.dir);
  auto existing = reader.versions();
  bool adopt = false;
  if (existing.ok() && !existing->empty() && existing->back() == version) {
    // A resumed run: the version was published before the checkpoint; it must be these weights.
    MILES_ASSIGN_OR_RETURN(WeightSet ws, reader.load(version));
    for (const NamedTensor& t : ws) {
      auto it = sums.find(t.name);
      if (it == sums.end() || it->second != xxh3_128_hex(t.bytes.data(), t.bytes.size()))
        return Status::Error("weight_sync.dir " + cfg_.dir + " holds version " +
                             std::to_string(version) + " with other weights than the trainer's (" +
                             t.name + "); remove the directory or resume from its run");
    }
    adopt = true;
  }
  // The co-trained draft head of this version, on disk before any engine can adopt the version.
  if (const DraftHead* draft = trainer.draft())
    MILES_RETURN_IF_ERROR(write_draft_head(cfg_.dir, version, *draft));
  disk_sums_ = sums;  // the disk-delta writer's manifest takes these instead of hashing again
  if (!adopt && group_) {
    // The engines get this version over the group: its disk copy is written in the background,
    // from a copy of the weights (the trainer's change in the next step).
    if (disk_copy_.all().size() != trainer.params().all().size())
      disk_copy_ = FlatTensors(trainer.params().layout_ptr());
    std::ranges::copy(trainer.params().all(), disk_copy_.all().begin());
    disk_ = std::async(std::launch::async, [this, version] {
      const FlatTensors& copy = disk_copy_;
      return sender_->send(version, [&copy](const std::string& name) { return copy.get(name); })
          .with_context("writing weight version " + std::to_string(version) + " to " + cfg_.dir);
    });
  } else if (!adopt) {
    MILES_RETURN_IF_ERROR(sender_->send(version, source_of(trainer)));
  }
  Checksums sharded = engine_tp_ > 1 && cfg_.check_checksums
                          ? sharded_checksums_of(trainer, plan_, engine_tp_)
                          : Checksums{};
  std::lock_guard<std::mutex> lock(mu_);
  current_ = version;
  checksums_ = std::move(sums);
  sharded_ = std::move(sharded);
  return Status::Ok();
}

int64_t WeightPublisher::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

Status WeightPublisher::bring(EngineClient& engine, const PauseMode* pause) const {
  int64_t v;
  std::map<std::string, std::string> expected, sharded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v = current_;
    if (cfg_.check_checksums) expected = checksums_;
    sharded = sharded_;
  }
  MILES_RETURN_IF_ERROR(disk_written());  // the version this reads from disk
  if (pause) MILES_RETURN_IF_ERROR(engine.pause(*pause));
  MILES_ASSIGN_OR_RETURN(auto held, engine.weight_checksums());
  if (held.version != v) {
    Status s = engine.update_weights_from_disk_delta(cfg_.dir, v);
    if (!s.ok()) {
      if (pause) (void)engine.resume();
      return s;
    }
    if (cfg_.check_checksums) {
      MILES_ASSIGN_OR_RETURN(held, engine.weight_checksums());
    }
  }
  if (cfg_.check_checksums) {
    if (Status s = compare_held(engine, v, held, expected, sharded); !s.ok()) {
      if (pause) (void)engine.resume();
      return s;
    }
  }
  if (pause) MILES_RETURN_IF_ERROR(engine.resume());
  return Status::Ok();
}

std::vector<Status> WeightPublisher::broadcast(
    const std::vector<std::shared_ptr<EngineClient>>& engines, const Trainer& trainer,
    const PauseMode* pause) {
  int64_t v;
  Checksums expected;  // of version v: the bucket headers' checksums, and the engines' check
  Checksums sharded;   // the same per shard (p2p into tensor-parallel engines)
  {
    std::lock_guard<std::mutex> lock(mu_);
    v = current_;
    expected = checksums_;
    sharded = sharded_;
  }
  std::vector<Status> out(engines.size());
  if (pause)
    for_each_parallel(engines.size(), [&](size_t i) { out[i] = engines[i]->pause(*pause); });
  std::vector<std::shared_ptr<EngineClient>> members;  // those paused (all, without a pause)
  std::vector<size_t> at;
  for (size_t i = 0; i < engines.size(); ++i)
    if (out[i].ok()) {
      members.push_back(engines[i]);
      at.push_back(i);
    }
  const std::vector<Status> got =
      group_->update(members, v, source_of(trainer), [&expected](const std::string& name) {
        auto it = expected.find(name);
        return it == expected.end() ? std::string() : it->second;
      });
  for_each_parallel(members.size(), [&](size_t k) {
    EngineClient& e = *members[k];
    Status s = got[k];
    if (!s.ok()) {
      // The group could not reach it; the same version is on disk (once its write ends).
      Status d = disk_written();
      if (d.ok()) d = e.update_weights_from_disk_delta(cfg_.dir, v);
      if (d.ok() && log_)
        log_("engine " + e.address().http() + ": broadcast failed (" + s.message() +
             "); brought to version " + std::to_string(v) + " over disk-delta");
      s = d.ok() ? Status::Ok()
                 : Status::Error("broadcast: " + s.message() + "; disk-delta: " + d.message());
    }
    if (s.ok() && cfg_.check_checksums) {
      auto held = e.weight_checksums();
      s = held.ok() ? compare_held(e, v, *held, expected, sharded) : held.status();
    }
    if (pause) {
      Status r = e.resume();
      if (s.ok()) s = r;
    }
    out[at[k]] = s;
  });
  return out;
}

// weight_sync.keep_versions: with `version` about to be published, versions version − N + 1 and
// newer stay loadable; older ones go once a newer full version exists. (Every delta stores about
// the whole model, which Adam moves everywhere: kept, a SmolLM2 run wrote 11 GB of versions in 40
// steps.) A run resumed from a checkpoint whose version is gone publishes that version again, in
// full, from the checkpoint's weights.
Status WeightPublisher::prune(int64_t version) const {
  if (cfg_.keep_versions <= 0) return Status::Ok();
  return prune_versions(cfg_.dir, version - cfg_.keep_versions + 1).status();
}

Status WeightPublisher::drop_newer_than(int64_t version) const {
  MILES_RETURN_IF_ERROR(disk_written());
  DiskDeltaReader reader(cfg_.dir);
  auto versions = reader.versions();
  if (!versions.ok()) return Status::Ok();  // nothing published yet
  for (int64_t v : *versions) {
    if (v <= version) continue;
    char name[32];
    std::snprintf(name, sizeof name, "weight_v%06lld", static_cast<long long>(v));
    std::error_code ec;
    fs::remove_all(fs::path(cfg_.dir) / name, ec);
    if (ec) return Status::Error("cannot remove " + cfg_.dir + "/" + name + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace miles::controller
