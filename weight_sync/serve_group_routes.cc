// The broadcast-group endpoints of `miles serve` (serve_routes.h): POST /join_weight_group forms
// the engine's side of the controller's Gloo group in the background; POST
// /update_weights_from_group receives one version over it and swaps it in.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "miles/host_guard.h"
#include "weight_sync/serve_state.h"
#include "miles/weight_sync/tp_intake.h"

namespace miles {

using nlohmann::json;

Result<Communicator*> WeightGroupJoin::wait() {
  std::unique_lock<std::mutex> lock(mu);
  // connect_gloo gives up within `timeout`; the margin only guards against a join that never ends.
  if (!cv.wait_for(lock, timeout + std::chrono::seconds(30), [this] { return done; }))
    return Status::Error("joining weight group " + prefix + " did not end");
  if (!status.ok()) return status.with_context("joining weight group " + prefix);
  return comm.get();
}

namespace {

bool has(const json& body, const char* key, json::value_t type) {
  if (!body.contains(key)) return false;
  const json& v = body[key];
  if (type == json::value_t::number_float) return v.is_number();
  if (type == json::value_t::number_integer) return v.is_number_integer();
  return v.type() == type;
}

// The join's options from its request body, or why they are not.
Result<CommOptions> join_options(const json& body) {
  const char* usage =
      "join_weight_group needs {\"store\": \"host:port\", \"prefix\": string, \"rank\": integer, "
      "\"world_size\": integer, optional \"timeout_s\": number, \"host\": string, "
      "\"plan_digest\": string, \"stage\": integer, \"stages\": integer, \"transport\": "
      "\"broadcast\" | \"p2p\", \"trainer_layout\": \"dp=A,pp=B,tp=C\", \"engine_tp\": integer}";
  if (body.is_discarded() || !body.is_object() || !has(body, "store", json::value_t::string) ||
      !has(body, "prefix", json::value_t::string) ||
      !has(body, "rank", json::value_t::number_integer) ||
      !has(body, "world_size", json::value_t::number_integer) ||
      (body.contains("timeout_s") && !has(body, "timeout_s", json::value_t::number_float)) ||
      (body.contains("host") && !has(body, "host", json::value_t::string)) ||
      (body.contains("plan_digest") && !has(body, "plan_digest", json::value_t::string)) ||
      (body.contains("stage") && !has(body, "stage", json::value_t::number_integer)) ||
      (body.contains("stages") && !has(body, "stages", json::value_t::number_integer)) ||
      (body.contains("transport") && !has(body, "transport", json::value_t::string)) ||
      (body.contains("trainer_layout") && !has(body, "trainer_layout", json::value_t::string)) ||
      (body.contains("engine_tp") && !has(body, "engine_tp", json::value_t::number_integer)))
    return Status::Error(usage);
  CommOptions o;
  o.store_address = body["store"].get<std::string>();
  o.prefix = body["prefix"].get<std::string>();
  o.rank = body["rank"].get<int>();
  o.world_size = body["world_size"].get<int>();
  o.host = body.value("host", std::string("127.0.0.1"));
  const double timeout_s = body.value("timeout_s", 60.0);
  if (o.world_size < 2 || o.rank < 1 || o.rank >= o.world_size)
    return Status::Error("join_weight_group: rank " + std::to_string(o.rank) + " of world_size " +
                         std::to_string(o.world_size) +
                         ": an engine is a rank in 1..world_size − 1 (rank 0 sends)");
  if (!(timeout_s > 0)) return Status::Error("join_weight_group: timeout_s must be > 0");
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
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
Result<JoinKind> join_kind(const json& body, const CommOptions& o, const ModelConfig& config,
                           int engine_tp) {
  JoinKind k;
  const std::string transport = body.value("transport", std::string("broadcast"));
  if (transport != "broadcast" && transport != "p2p")
    return Status::Error("join_weight_group: transport '" + transport +
                         "' (known: broadcast, p2p)");
  // The senders: the trainer's ranks (p2p) or one stage leader (broadcast).
  int senders = 1;
  if (transport == "p2p") {
    MILES_ASSIGN_OR_RETURN(k.layout,
                           ParallelLayout::parse(body.value("trainer_layout", std::string())));
    senders = k.layout.world_size();
    if (o.rank < senders)
      return Status::Error("join_weight_group: p2p rank " + std::to_string(o.rank) +
                           " is a trainer rank of " + k.layout.to_string() +
                           " (engines are ranks " + std::to_string(senders) + "..world_size − 1)");
  } else {
    const int64_t stages = body.value("stages", int64_t{1}),
                  stage = body.value("stage", int64_t{0});
    if (stages < 1 || stages > config.num_layers || stage < 0 || stage >= stages)
      return Status::Error("join_weight_group: stage " + std::to_string(stage) + " of " +
                           std::to_string(stages) + ": need 0 <= stage < stages <= " +
                           std::to_string(config.num_layers) + " (the model's layers)");
    k.stage = static_cast<int>(stage);
    k.stages = static_cast<int>(stages);
    MILES_ASSIGN_OR_RETURN(k.layout, ParallelLayout::create(1, k.stages, 1));
  }
  // Without engine_tp (or 1) the senders reach this engine's rank 0 only, which reshards over its
  // own group; with engine_tp every rank of it is a member and takes its own shard.
  const int64_t n = body.value("engine_tp", int64_t{1});
  if (n != 1 && n != engine_tp)
    return Status::Error("join_weight_group: engine_tp " + std::to_string(n) +
                         ", but this engine has " + std::to_string(engine_tp) +
                         " tensor-parallel rank" + (engine_tp == 1 ? "" : "s"));
  if ((o.rank - senders) % n != 0 || (o.world_size - senders) % n != 0)
    return Status::Error("join_weight_group: with engine_tp " + std::to_string(n) +
                         " every engine takes " + std::to_string(n) +
                         " consecutive ranks after the senders' " + std::to_string(senders) +
                         "; rank " + std::to_string(o.rank) + " of world_size " +
                         std::to_string(o.world_size) + " is not the first of such a run");
  k.engine_tp = static_cast<int>(n);
  if (transport == "p2p")
    k.p2p = P2pRoles{k.layout, static_cast<int>((o.world_size - senders) / n), static_cast<int>(n)};
  return k;
}

// A tensor-parallel engine whose every rank is in the group(s) (engine_tp): every rank receives
// its own shard (the followers on their intake threads, this rank here), then the engine swaps in
// the runner over them. Under st.mu.
void receive_shards(WeightSyncRoutes& st, rollout::EngineDriver& driver,
                    std::span<Communicator* const> comms, const TransferPlan& plan,
                    const IntakeGroup& group, int64_t v,
                    const std::vector<std::shared_ptr<WeightGroupJoin>>& gs,
                    httplib::Response& res) {
  auto got = st.tp_intake->receive(intake_receive_request(v), [&] {
    return receive_shard(comms, plan, group, v, /*tp_rank=*/0);
  });
  if (!got.ok()) {
    st.drop_groups(gs);
    return reply_failure(res, 400,
                         got.status().with_context("weight group " + gs.front()->prefix).message());
  }
  std::map<std::string, std::string> sums;
  for (const auto& [name, shards] : got->shard_checksums)
    sums[name] = sharded_checksum(name, shards);
  std::string error;
  if (int code = st.apply_runner(driver, std::move(got->runner), v, std::move(sums), &error);
      code != 200) {
    st.drop_groups(gs);
    return reply_failure(res, code, error);
  }
  st.receivers.clear();  // a disk-delta receiver's copy is older than the engine now
  reply_json(res, 200, json{{"success", true}, {"weight_version", v}});
}

}  // namespace

void register_group_routes(httplib::Server& s, std::shared_ptr<WeightSyncRoutes> st,
                           rollout::EngineDriver& driver) {
  s.Post("/join_weight_group", [st](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    auto o = join_options(body);
    if (!o.ok()) return reply_failure(res, 400, o.message());
    if (Status c = confine_host(o->store_address, st->store_hosts, "--weight-store-host"); !c.ok())
      return reply_failure(res, 403, "join_weight_group: the store " + c.message());
    // Broadcast: one group per pipeline stage of the sender, `stage` of `stages` (default 0 of 1).
    // p2p: one group of the trainer's ranks and the engines.
    auto kind = join_kind(body, *o, st->config, st->tp_intake ? st->tp_intake->size() : 1);
    if (!kind.ok()) return reply_failure(res, 400, kind.message());
    std::lock_guard<std::mutex> lock(st->group_mu);
    auto plan = st->plan_for(kind->layout);
    if (!plan.ok())
      return reply_failure(res, 400, plan.status().with_context("join_weight_group").message());
    const std::string mine = transfer_plan_digest(**plan);
    const std::string digest = body.value("plan_digest", std::string());
    if (!digest.empty() && digest != mine)
      return reply_failure(res, 400,
                           "join_weight_group: the sender's transfer plan (" + digest +
                               ") is not this engine's (" + mine +
                               "): another model or parameter layout");
    auto g = std::make_shared<WeightGroupJoin>();
    g->prefix = o->prefix;
    g->timeout = o->timeout;
    auto finished = std::make_shared<std::atomic<bool>>(false);
    // Reap the threads of earlier joins that have ended.
    for (auto it = st->joins.begin(); it != st->joins.end();) {
      if (!it->finished->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = st->joins.erase(it);
    }
    // The old groups' communicators go with their last user.
    if (kind->p2p || st->p2p || static_cast<int>(st->groups.size()) != kind->stages)
      st->groups.assign(kind->stages, nullptr);
    st->groups[kind->stage] = g;
    st->p2p = kind->p2p;
    // The followers join beside this rank (each as rank + its tensor-parallel rank).
    st->direct.reset();
    if (kind->engine_tp > 1) {
      IntakeGroup ig;
      ig.transport = kind->p2p ? "p2p" : "broadcast";
      ig.stage = kind->stage;
      ig.stages = kind->stages;
      ig.roles = kind->p2p ? *kind->p2p : P2pRoles{ParallelLayout{}, 1, kind->engine_tp};
      if (Status f = st->tp_intake->join_followers(intake_join_request(*o, ig)); !f.ok()) {
        st->groups.clear();
        st->p2p.reset();
        return reply_failure(res, 500, f.with_context("join_weight_group").message());
      }
      st->direct = ig;
    }
    st->joins.push_back({std::thread([g, finished, options = std::move(*o)] {
                           auto comm = connect_gloo(options);
                           {
                             std::lock_guard<std::mutex> l(g->mu);
                             g->status = comm.status();
                             if (comm.ok()) g->comm = std::move(comm).value();
                             g->done = true;
                           }
                           g->cv.notify_all();
                           *finished = true;
                         }),
                         finished});
    reply_json(res, 200, json{{"success", true}, {"prefix", g->prefix}, {"stage", kind->stage}});
  });

  s.Post("/update_weights_from_group",
         [st, &driver](const httplib::Request& req, httplib::Response& res) {
           const json body = json::parse(req.body, nullptr, false);
           if (body.is_discarded() || !body.is_object() ||
               !has(body, "weight_version", json::value_t::number_integer))
             return reply_failure(res, 400,
                                  "update_weights_from_group needs {\"weight_version\": integer}");
           const int64_t v = body["weight_version"].get<int64_t>();
           std::vector<std::shared_ptr<WeightGroupJoin>> gs;
           const TransferPlan* plan = nullptr;
           std::optional<P2pRoles> p2p;
           std::optional<IntakeGroup> direct;
           {
             std::lock_guard<std::mutex> lock(st->group_mu);
             gs = st->groups;
             p2p = st->p2p;
             direct = st->direct;
             if (!gs.empty()) {
               const ParallelLayout layout =
                   p2p ? p2p->trainer : *ParallelLayout::create(1, static_cast<int>(gs.size()), 1);
               plan = *st->plan_for(layout);  // made at the join
             }
           }
           if (gs.empty())
             return reply_failure(res, 400,
                                  "update_weights_from_group: this engine is in no weight group "
                                  "(POST /join_weight_group first)");
           std::vector<Communicator*> comms;
           for (size_t s = 0; s < gs.size(); ++s) {
             if (!gs[s])
               return reply_failure(res, 400,
                                    "update_weights_from_group: the group of pipeline stage " +
                                        std::to_string(s) + " was never joined");
             auto comm = gs[s]->wait();  // before taking the update lock: checksums stay readable
             if (!comm.ok()) {
               st->drop_groups(gs);
               return reply_failure(res, 400, comm.message());
             }
             comms.push_back(*comm);
           }
           std::lock_guard<std::mutex> lock(st->mu);
           if (direct) return receive_shards(*st, driver, comms, *plan, *direct, v, gs, res);
           // Every member must take part in the transfer, even one that will refuse to swap; the
           // stages arrive one after the other, each over its own group.
           ReceivedWeights received;
           Status rs = p2p ? p2p_receive_weights(*comms.front(), *plan, v, *p2p, &received)
                           : receive_stage_weights(comms, *plan, v, &received);
           if (!rs.ok()) {
             st->drop_groups(gs);
             return reply_failure(res, 400,
                                  rs.with_context("weight group " + gs.front()->prefix).message());
           }
           const ReceivedWeights* got = &received;
           // Already serving exactly these weights (e.g. brought to v over disk-delta just before):
           // nothing to swap.
           if (st->version == v && st->checksums == got->checksums)
             return reply_json(res, 200, json{{"success", true}, {"weight_version", v}});
           std::string error;
           if (int code = st->apply(driver, *got, &error); code != 200) {
             st->drop_groups(gs);
             return reply_failure(res, code, error);
           }
           // A disk-delta receiver's copy is older than the engine now: load afresh if needed.
           st->receivers.clear();
           reply_json(res, 200, json{{"success", true}, {"weight_version", v}});
         });
}

}  // namespace miles
