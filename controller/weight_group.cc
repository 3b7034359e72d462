// WeightGroup (weight_group.h): form the controller + engines Gloo group, broadcast a version.
#include "controller/weight_group.h"

#include <cstdio>
#include <thread>

namespace miles::controller {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string fixed2(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

}  // namespace

std::string weight_stage_prefix(const std::string& prefix, int stage) {
  return prefix + "-s" + std::to_string(stage);
}

Result<TransferPlan> weight_group_plan(Transport transport, const ModelConfig& config,
                                       const ParamLayout& params, const ParallelLayout& trainer) {
  if (transport == Transport::kP2p) return make_transfer_plan(config, params, trainer);
  MILES_ASSIGN_OR_RETURN(ParallelLayout stages, ParallelLayout::create(1, trainer.pp(), 1));
  return make_transfer_plan(config, params, stages);
}

Result<std::unique_ptr<WeightGroup>> WeightGroup::create(WeightGroupOptions options,
                                                         TransferPlan plan) {
  auto g = std::unique_ptr<WeightGroup>(new WeightGroup(std::move(options), std::move(plan)));
  TcpStoreServerOptions so;
  so.host = g->options_.host;
  MILES_ASSIGN_OR_RETURN(g->store_, TcpStoreServer::start(so));
  g->store_address_ = g->store_->address();
  g->plan_digest_ = transfer_plan_digest(g->plan_);
  g->p2p_ = g->options_.transport == Transport::kP2p;
  g->stages_ = g->p2p_ ? 1 : plan_stages(g->plan_);
  g->trainer_ranks_ = g->p2p_ ? g->options_.trainer.world_size() : 1;
  g->engine_tp_ = g->options_.engine_tp;
  if (g->engine_tp_ < 1) return Status::Error("weight group: engine_tp must be >= 1");
  const bool others = g->stages_ > 1 || g->trainer_ranks_ > 1;
  if (others && (!g->options_.senders.join || !g->options_.senders.send))
    return Status::Error("weight group: other trainer ranks send, but no senders were given");
  if (g->p2p_ && !g->options_.senders.local)
    return Status::Error("weight group: p2p needs trainer rank 0's shards");
  if (g->options_.comm == WeightComm::kShm && others && !g->options_.senders.on_host)
    return Status::Error("weight group: comm shm needs the sending trainer ranks on this host");
  return g;
}

bool WeightGroup::use_shm(const std::vector<std::shared_ptr<EngineClient>>& engines) const {
  if (options_.comm != WeightComm::kAuto) return options_.comm == WeightComm::kShm;
  // A tensor-parallel engine at a loopback address runs its followers here too (one whose
  // followers are elsewhere refuses the join, naming gloo).
  if ((stages_ > 1 || trainer_ranks_ > 1) && !options_.senders.on_host) return false;
  for (const auto& e : engines) {
    const std::string& h = e->address().host;
    if (h != "127.0.0.1" && h != "::1" && h != "localhost") return false;
  }
  return true;
}

void WeightGroup::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void WeightGroup::drop() {
  comm_.reset();
  members_.clear();
}

std::vector<Status> WeightGroup::form(const std::vector<std::shared_ptr<EngineClient>>& engines) {
  drop();
  const auto t0 = Clock::now();
  const double timeout_s = std::chrono::duration<double>(options_.timeout).count();
  std::vector<Status> out(engines.size());
  std::vector<size_t> joining;
  for (size_t i = 0; i < engines.size(); ++i) joining.push_back(i);
  const bool shm = use_shm(engines);
  std::string prefix;
  // An engine that refuses the join (gone, or another plan) is left out and the rest asked again
  // under a new prefix, so that every rank of the group is a member that said yes.
  while (!joining.empty()) {
    prefix = "wsync-" + std::to_string(++generation_);
    const int world = static_cast<int>(joining.size()) * engine_tp_ + trainer_ranks_;
    std::vector<size_t> accepted;
    for (size_t k = 0; k < joining.size(); ++k) {
      const EngineClient& e = *engines[joining[k]];
      GroupJoinSpec join;
      join.store = store_address_;
      join.prefix = prefix;
      join.host = e.address().host;
      join.plan_digest = plan_digest_;
      join.rank = trainer_ranks_ + static_cast<int>(k) * engine_tp_;
      join.world_size = world;
      join.timeout_s = timeout_s;
      if (p2p_) join.trainer_layout = options_.trainer.to_string();
      join.engine_tp = engine_tp_;
      join.stages = stages_;
      join.comm = shm ? "shm" : "gloo";
      Status s;
      for (int st = 0; st < stages_ && s.ok(); ++st) {  // p2p: one group (stages_ is 1)
        join.stage = st;
        if (!p2p_) join.prefix = weight_stage_prefix(prefix, st);
        s = e.join_weight_group(join);
      }
      if (s.ok()) {
        accepted.push_back(joining[k]);
      } else {
        out[joining[k]] = s;
      }
    }
    if (accepted.size() == joining.size()) break;
    joining = std::move(accepted);
  }
  if (joining.empty()) return out;
  CommOptions o;
  o.rank = 0;
  o.world_size = static_cast<int>(joining.size()) * engine_tp_ + trainer_ranks_;
  o.store_address = store_address_;
  o.prefix = p2p_ ? prefix : weight_stage_prefix(prefix, 0);
  if (stages_ > 1 || trainer_ranks_ > 1) {
    // The other trainer ranks connect to theirs while this process connects.
    const Status told = options_.senders.join(store_address_, prefix, o.world_size, timeout_s, shm);
    if (!told.ok()) {
      const Status s = told.with_context("weight group " + prefix + ": the stage leaders");
      for (size_t i : joining) out[i] = s;
      log(s.message());
      return out;
    }
  }
  o.host = options_.host;
  o.timeout = options_.timeout;
  auto comm = shm ? connect_shm(o) : connect_gloo(o);
  if (!comm.ok()) {
    const Status s = comm.status().with_context("forming weight group " + prefix);
    for (size_t i : joining) out[i] = s;
    log(s.message());
    return out;
  }
  comm_ = std::move(comm).value();
  for (size_t i : joining) members_.push_back(engines[i]);
  log("weight group " + prefix + " formed: " + std::to_string(members_.size()) + " engine" +
      (members_.size() == 1 ? "" : "s") +
      (stages_ > 1 ? ", one group per pipeline stage (" + std::to_string(stages_) + ")" : "") +
      (p2p_ ? ", p2p from " + std::to_string(trainer_ranks_) + " trainer rank" +
                  (trainer_ranks_ == 1 ? "" : "s") + " (" + options_.trainer.to_string() + ")"
            : "") +
      (engine_tp_ > 1 ? ", straight to each engine's " + std::to_string(engine_tp_) +
                            " tensor-parallel ranks (each keeps its shard)"
                      : "") +
      (shm ? ", over shared memory" : ", over TCP (gloo)") + " (" + store_address_ + ", " +
      fixed2(seconds_since(t0)) + " s)");
  return out;
}

std::vector<Status> WeightGroup::update(const std::vector<std::shared_ptr<EngineClient>>& engines,
                                        int64_t version, const TensorSource& source,
                                        std::function<std::string(const std::string&)> known_xxh3) {
  std::vector<Status> out(engines.size());
  if (engines.empty()) {
    drop();
    return out;
  }
  if (!comm_ || engines != members_) out = form(engines);
  if (!comm_) return out;  // every engine has its error

  // Every member receives on a thread of its own while this one sends: the broadcast needs them
  // all at once. A receive is bounded by the join wait and two collectives per bucket.
  const double receive_timeout_s = std::chrono::duration<double>(options_.timeout).count() *
                                   static_cast<double>(3 + stages_ + 2 * plan_.buckets.size());
  std::vector<Status> got(members_.size());
  std::vector<std::thread> receivers;
  for (size_t k = 0; k < members_.size(); ++k)
    receivers.emplace_back(
        [&, k] { got[k] = members_[k]->update_weights_from_group(version, receive_timeout_s); });
  // The other trainer ranks send theirs on command; this process sends stage 0's (broadcast) or
  // its own shards (p2p).
  Status sent = stages_ > 1 || trainer_ranks_ > 1 ? options_.senders.send(version) : Status::Ok();
  if (sent.ok())
    sent = p2p_ ? p2p_send_weights(
                      *comm_, plan_, version, options_.senders.local,
                      P2pRoles{options_.trainer, static_cast<int>(members_.size()), engine_tp_})
                : send_stage_weights(*comm_, plan_, 0, version, source, known_xxh3);
  // A failed send leaves receivers waiting on this rank; closing its connections fails them now
  // rather than at their timeout.
  if (!sent.ok()) comm_.reset();
  for (std::thread& t : receivers) t.join();

  bool failed = !sent.ok();
  for (size_t i = 0; i < engines.size(); ++i) {
    if (!out[i].ok()) continue;  // did not join
    for (size_t k = 0; k < members_.size(); ++k) {
      if (members_[k] != engines[i]) continue;
      out[i] = got[k];
      if (!got[k].ok() && !sent.ok())
        out[i] = Status::Error(got[k].message() + " (the send: " + sent.message() + ")");
      failed = failed || !got[k].ok();
    }
  }
  if (failed) {
    log("weight group: version " + std::to_string(version) + " failed" +
        (sent.ok() ? "" : " (" + sent.message() + ")") + "; the group is formed again next time");
    drop();
  }
  return out;
}

}  // namespace miles::controller
