// EngineWeights (engine_weights.h): joining the sender's weight groups in the background and
// receiving a version over them.
#include "miles/host_guard.h"
#include "miles/weight_sync/engine_weights.h"
#include "miles/weight_sync/tp_intake.h"
#include "weight_sync/engine_weights_state.h"

namespace miles {

Result<Communicator*> WeightGroupJoin::wait() {
  std::unique_lock<std::mutex> lock(mu);
  // connect_gloo gives up within `timeout`; the margin only guards against a join that never ends.
  if (!cv.wait_for(lock, timeout + std::chrono::seconds(30), [this] { return done; }))
    return Status::Error("joining weight group " + prefix + " did not end");
  if (!status.ok()) return status.with_context("joining weight group " + prefix);
  return comm.get();
}

namespace {

WeightReply invalid(const std::string& message) {
  return WeightReply::refuse(WeightFault::kInvalid, message);
}

// The Gloo options of a join, or why the spec is not one.
Result<CommOptions> comm_options(const GroupJoinSpec& spec) {
  if (spec.store.empty() || spec.prefix.empty())
    return Status::Error("join_weight_group needs a store (host:port) and a prefix");
  if (spec.world_size < 2 || spec.rank < 1 || spec.rank >= spec.world_size)
    return Status::Error("join_weight_group: rank " + std::to_string(spec.rank) +
                         " of world_size " + std::to_string(spec.world_size) +
                         ": an engine is a rank in 1..world_size − 1 (rank 0 sends)");
  // Bounded so that the milliseconds below, and the wait's margin on them, stay in range.
  constexpr double kMaxTimeoutS = 86400;
  if (!(spec.timeout_s > 0 && spec.timeout_s <= kMaxTimeoutS))
    return Status::Error("join_weight_group: timeout_s must be in (0, 86400] seconds, got " +
                         std::to_string(spec.timeout_s));
  if (spec.comm != "gloo" && spec.comm != "shm")
    return Status::Error("join_weight_group: comm '" + spec.comm + "' (known: gloo, shm)");
  CommOptions o;
  o.store_address = spec.store;
  o.prefix = spec.prefix;
  o.rank = spec.rank;
  o.world_size = spec.world_size;
  o.host = spec.host.empty() ? "127.0.0.1" : spec.host;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeout_s * 1000));
  return o;
}

// What a join is for: one stage's broadcast group (of `stages`), or the p2p group of the trainer's
// ranks and the engines; the layout whose plan the sender follows; and how many ranks of this
// engine take part (engine_tp: each receiving its own shard; 1: rank 0 takes whole tensors).
struct JoinKind {
  int stage = 0, stages = 1;
  ParallelLayout layout;  // broadcast: dp=1,pp=stages,tp=1; p2p: the trainer's
  std::optional<P2pRoles> p2p;
  int engine_tp = 1;
};

// `engine_tp`: this engine's tensor-parallel ranks (1 for a one-process engine).
Result<JoinKind> join_kind(const GroupJoinSpec& spec, const ModelConfig& config, int engine_tp) {
  JoinKind k;
  // The senders: the trainer's ranks (p2p) or one stage leader (broadcast).
  int senders = 1;
  if (!spec.trainer_layout.empty()) {
    MILES_ASSIGN_OR_RETURN(k.layout, ParallelLayout::parse(spec.trainer_layout));
    senders = k.layout.world_size();
    if (spec.rank < senders)
      return Status::Error("join_weight_group: p2p rank " + std::to_string(spec.rank) +
                           " is a trainer rank of " + k.layout.to_string() +
                           " (engines are ranks " + std::to_string(senders) + "..world_size − 1)");
  } else {
    if (spec.stages < 1 || spec.stages > config.num_layers || spec.stage < 0 ||
        spec.stage >= spec.stages)
      return Status::Error("join_weight_group: stage " + std::to_string(spec.stage) + " of " +
                           std::to_string(spec.stages) + ": need 0 <= stage < stages <= " +
                           std::to_string(config.num_layers) + " (the model's layers)");
    k.stage = spec.stage;
    k.stages = spec.stages;
    MILES_ASSIGN_OR_RETURN(k.layout, ParallelLayout::create(1, k.stages, 1));
  }
  // Without engine_tp (or 1) the senders reach this engine's rank 0 only, which reshards over its
  // own group; with engine_tp every rank of it is a member and takes its own shard.
  const int n = spec.engine_tp;
  if (n != 1 && n != engine_tp)
    return Status::Error("join_weight_group: engine_tp " + std::to_string(n) +
                         ", but this engine has " + std::to_string(engine_tp) +
                         " tensor-parallel rank" + (engine_tp == 1 ? "" : "s"));
  if ((spec.rank - senders) % n != 0 || (spec.world_size - senders) % n != 0)
    return Status::Error("join_weight_group: with engine_tp " + std::to_string(n) +
                         " every engine takes " + std::to_string(n) +
                         " consecutive ranks after the senders' " + std::to_string(senders) +
                         "; rank " + std::to_string(spec.rank) + " of world_size " +
                         std::to_string(spec.world_size) + " is not the first of such a run");
  k.engine_tp = n;
  if (!spec.trainer_layout.empty()) k.p2p = P2pRoles{k.layout, (spec.world_size - senders) / n, n};
  return k;
}

// Joins the threads of earlier joins that have ended. Under group_mu.
void reap_finished(std::vector<JoinThread>& threads) {
  for (auto it = threads.begin(); it != threads.end();) {
    if (!it->finished->load()) {
      ++it;
      continue;
    }
    it->thread.join();
    it = threads.erase(it);
  }
}

// Runs connect_gloo (or connect_shm) for `g` on a thread of its own.
JoinThread start_join(std::shared_ptr<WeightGroupJoin> g, CommOptions options, bool shm) {
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread t([g, finished, shm, options = std::move(options)] {
    auto comm = shm ? connect_shm(options) : connect_gloo(options);
    {
      std::lock_guard<std::mutex> l(g->mu);
      g->status = comm.status();
      if (comm.ok()) g->comm = std::move(comm).value();
      g->done = true;
    }
    g->cv.notify_all();
    *finished = true;
  });
  return {std::move(t), finished};
}

// A tensor-parallel engine whose every rank is in the group(s) (engine_tp): every rank receives
// its own shard (the followers on their intake threads, this rank here), then the engine swaps in
// the runner over them. Under st.mu.
WeightReply receive_shards(EngineWeights::State& st, std::span<Communicator* const> comms,
                           const TransferPlan& plan, const IntakeGroup& group, int64_t v,
                           const std::vector<std::shared_ptr<WeightGroupJoin>>& joins) {
  auto got = st.tp_intake->receive(intake_receive_request(v), [&] {
    return receive_shard(comms, plan, group, v, /*tp_rank=*/0);
  });
  if (!got.ok()) {
    st.drop_groups(joins);
    return invalid(got.status().with_context("weight group " + joins.front()->prefix).message());
  }
  std::map<std::string, std::string> sums;
  for (const auto& [name, shards] : got->shard_checksums)
    sums[name] = sharded_checksum(name, shards);
  WeightReply r = st.adopt_runner(std::move(got->runner), v, std::move(sums));
  if (!r.ok()) {
    st.drop_groups(joins);
    return r;
  }
  st.receivers.clear();  // a disk-delta receiver's copy is older than the engine now
  return r;
}

// The current groups' communicators, once every join formed; on a failed join the groups are
// dropped.
Result<std::vector<Communicator*>> wait_for_joins(
    EngineWeights::State& st, const std::vector<std::shared_ptr<WeightGroupJoin>>& joins) {
  if (joins.empty())
    return Status::Error(
        "update_weights_from_group: this engine is in no weight group (join_weight_group first)");
  std::vector<Communicator*> comms;
  for (size_t s = 0; s < joins.size(); ++s) {
    if (!joins[s])
      return Status::Error("update_weights_from_group: the group of pipeline stage " +
                           std::to_string(s) + " was never joined");
    auto comm = joins[s]->wait();
    if (!comm.ok()) {
      st.drop_groups(joins);
      return comm.status();
    }
    comms.push_back(*comm);
  }
  return comms;
}

}  // namespace

WeightReply EngineWeights::join_group(const GroupJoinSpec& spec) {
  auto o = comm_options(spec);
  if (!o.ok()) return invalid(o.message());
  if (Status c = confine_host(o->store_address, st_->trust.store_hosts, "--weight-store-host");
      !c.ok())
    return WeightReply::refuse(WeightFault::kForbidden,
                               "join_weight_group: the store " + c.message());
  auto kind = join_kind(spec, st_->config, st_->tp_intake ? st_->tp_intake->size() : 1);
  if (!kind.ok()) return invalid(kind.message());
  if (spec.comm == "shm" && kind->engine_tp > 1 &&
      (!st_->tp_intake || !st_->tp_intake->followers_on_host()))
    return invalid(
        "join_weight_group: comm shm, but this tensor-parallel engine's followers are not on its "
        "host (their group is not a shared-memory one): join over gloo");
  std::lock_guard<std::mutex> lock(st_->group_mu);
  auto plan = st_->plan_for(kind->layout);
  if (!plan.ok()) return invalid(plan.status().with_context("join_weight_group").message());
  const std::string mine = transfer_plan_digest(**plan);
  if (!spec.plan_digest.empty() && spec.plan_digest != mine)
    return invalid("join_weight_group: the sender's transfer plan (" + spec.plan_digest +
                   ") is not this engine's (" + mine + "): another model or parameter layout");
  auto g = std::make_shared<WeightGroupJoin>();
  g->prefix = o->prefix;
  g->timeout = o->timeout;
  reap_finished(st_->threads);
  // The old groups' communicators go with their last user.
  WeightGroups& groups = st_->groups;
  if (kind->p2p || groups.p2p || static_cast<int>(groups.joins.size()) != kind->stages)
    groups.joins.assign(kind->stages, nullptr);
  groups.joins[kind->stage] = g;
  groups.p2p = kind->p2p;
  // The followers join beside this rank (each as rank + its tensor-parallel rank).
  groups.direct.reset();
  if (kind->engine_tp > 1) {
    IntakeGroup ig;
    ig.transport = kind->p2p ? "p2p" : "broadcast";
    ig.comm = spec.comm;
    ig.stage = kind->stage;
    ig.stages = kind->stages;
    ig.roles = kind->p2p ? *kind->p2p : P2pRoles{ParallelLayout{}, 1, kind->engine_tp};
    if (Status f = st_->tp_intake->join_followers(intake_join_request(*o, ig)); !f.ok()) {
      groups = WeightGroups{};
      return WeightReply::refuse(WeightFault::kInternal,
                                 f.with_context("join_weight_group").message());
    }
    groups.direct = ig;
  }
  st_->threads.push_back(start_join(g, std::move(*o), spec.comm == "shm"));
  return WeightReply::done(st_->engine_version());
}

WeightReply EngineWeights::update_from_group(int64_t v) {
  if (v < 0) return refuse_negative_version(v);
  WeightGroups groups;
  const TransferPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(st_->group_mu);
    groups = st_->groups;
    if (!groups.joins.empty()) {
      const ParallelLayout layout =
          groups.p2p ? groups.p2p->trainer
                     : *ParallelLayout::create(1, static_cast<int>(groups.joins.size()), 1);
      plan = *st_->plan_for(layout);  // made at the join
    }
  }
  // Before taking the update lock: checksums stay readable while the groups form.
  auto comms = wait_for_joins(*st_, groups.joins);
  if (!comms.ok()) return invalid(comms.message());
  std::lock_guard<std::mutex> lock(st_->mu);
  if (groups.direct) return receive_shards(*st_, *comms, *plan, *groups.direct, v, groups.joins);
  // Every member must take part in the transfer, even one that will refuse to swap; the stages
  // arrive one after the other, each over its own group.
  ReceivedWeights& got = st_->staging;
  Status rs = groups.p2p ? p2p_receive_weights(*comms->front(), *plan, v, *groups.p2p, &got)
                         : receive_stage_weights(*comms, *plan, v, &got);
  if (!rs.ok()) {
    st_->drop_groups(groups.joins);
    return invalid(rs.with_context("weight group " + groups.joins.front()->prefix).message());
  }
  // Already serving exactly these weights (e.g. brought to v over disk-delta just before):
  // nothing to swap.
  if (st_->have_checksums && st_->checksums == got.checksums && st_->engine_version() == v)
    return WeightReply::done(v);
  WeightReply r = st_->adopt(got);
  if (!r.ok()) {
    st_->drop_groups(groups.joins);
    return r;
  }
  // A disk-delta receiver's copy is older than the engine now: load afresh if needed.
  st_->receivers.clear();
  return r;
}

}  // namespace miles
