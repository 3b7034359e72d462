// Requests and the follower's intake of weight groups into tensor-parallel engines (tp_intake.h).
#include "miles/weight_sync/tp_intake.h"

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "miles/flat_params.h"
#include "miles/json_text.h"

namespace miles {

using nlohmann::json;

namespace {

std::vector<uint8_t> bytes_of(const json& j) {
  const std::string s = j.dump();
  return std::vector<uint8_t>(s.begin(), s.end());
}

Result<json> parse(const std::vector<uint8_t>& request, const char* what) {
  json j = parse_json_or_discarded(
      std::string_view(reinterpret_cast<const char*>(request.data()), request.size()));
  if (j.is_discarded() || !j.is_object())
    return Status::Error(std::string("garbled ") + what + " request from rank 0");
  return j;
}

// One group's join: connect_gloo (or connect_shm) on a thread of its own (it blocks until every
// member joined).
struct Join {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status = Status::Error("joining");
  std::shared_ptr<Communicator> comm;
  std::thread thread;

  Join(CommOptions o, bool shm) {
    thread = std::thread([this, o, shm] {
      auto c = shm ? connect_shm(o) : connect_gloo(o);
      std::lock_guard<std::mutex> l(mu);
      status = c.status();
      if (c.ok()) comm = std::move(c).value();
      done = true;
      cv.notify_all();
    });
  }
  ~Join() {
    if (thread.joinable()) thread.join();  // bounded by the join's timeout
  }
  bool finished() {
    std::lock_guard<std::mutex> l(mu);
    return done;
  }
  Result<std::shared_ptr<Communicator>> wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return done; });
    if (!status.ok()) return status;
    return comm;
  }
};

class GroupIntake final : public rollout::FollowerIntake {
 public:
  explicit GroupIntake(std::string host) : host_(std::move(host)) {}

  void join(const std::vector<uint8_t>& request, int tp_rank, const ModelConfig& full) override {
    CommOptions o;
    IntakeGroup g;
    Status ok = parse_join(request, tp_rank, &o, &g);
    std::lock_guard<std::mutex> l(mu_);
    // Joins replaced earlier are let go once their connect has ended (a replaced join still
    // connecting would block this loop, which serves forwards, until its timeout).
    std::erase_if(retired_, [](const std::shared_ptr<Join>& j) { return j->finished(); });
    broken_ = Status::Ok();
    if (!ok.ok()) {
      broken_ = ok;
      return;
    }
    // A join of another kind (transport, stage count) or a p2p join starts a new set of groups.
    if (g.transport != group_.transport || g.stages != group_.stages || g.transport == "p2p" ||
        joins_.empty()) {
      for (auto& j : joins_)
        if (j) retired_.push_back(std::move(j));
      joins_.assign(g.stages, nullptr);
      group_ = g;
      // The plan the senders follow: p2p the trainer's layout, broadcast one sender per stage.
      auto senders = g.transport == "p2p" ? Result<ParallelLayout>(g.roles.trainer)
                                          : ParallelLayout::create(1, g.stages, 1);
      if (!senders.ok()) {
        broken_ = senders.status();
        return;
      }
      auto plan = make_transfer_plan(full, *ParamLayout::for_model(full), *senders);
      if (!plan.ok()) {
        broken_ = plan.status();
        return;
      }
      plan_ = std::move(plan).value();
    }
    group_.stage = g.stage;
    if (joins_[g.stage]) retired_.push_back(std::move(joins_[g.stage]));
    joins_[g.stage] = std::make_shared<Join>(o, g.comm == "shm");
  }

  Result<rollout::ShardWeights> receive(const std::vector<uint8_t>& request, int tp_rank) override {
    MILES_ASSIGN_OR_RETURN(json j, parse(request, "weight intake"));
    if (!j.contains("version") || !j["version"].is_number_integer())
      return Status::Error("weight intake request without a version");
    std::vector<std::shared_ptr<Join>> joins;
    TransferPlan plan;
    IntakeGroup group;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!broken_.ok()) return broken_;
      joins = joins_;
      plan = plan_;
      group = group_;
    }
    if (joins.empty()) return Status::Error("this engine rank was never asked to join a group");
    std::vector<std::shared_ptr<Communicator>> held;
    std::vector<Communicator*> comms;
    for (size_t s = 0; s < joins.size(); ++s) {
      if (!joins[s])
        return Status::Error("the group of pipeline stage " + std::to_string(s) +
                             " was never joined");
      auto c = joins[s]->wait();
      if (!c.ok()) return c.status().with_context("joining the weight group");
      held.push_back(*c);
      comms.push_back(c->get());
    }
    auto got = receive_shard(comms, plan, group, j["version"].get<int64_t>(), tp_rank);
    if (!got.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      // Out of step with the senders: refuse until rank 0's controller forms new groups.
      if (joins_ == joins) broken_ = got.status().with_context("an earlier transfer");
    }
    return got;
  }

 private:
  Status parse_join(const std::vector<uint8_t>& request, int tp_rank, CommOptions* o,
                    IntakeGroup* g) const {
    MILES_ASSIGN_OR_RETURN(json j, parse(request, "weight group join"));
    try {
      o->store_address = j["store"].get<std::string>();
      o->prefix = j["prefix"].get<std::string>();
      o->rank = j["rank"].get<int>() + tp_rank;
      o->world_size = j["world_size"].get<int>();
      o->host = host_.empty() ? j["host"].get<std::string>() : host_;
      o->timeout = std::chrono::milliseconds(j["timeout_ms"].get<int64_t>());
      g->transport = j["transport"].get<std::string>();
      g->comm = j["comm"].get<std::string>();
      g->stage = j["stage"].get<int>();
      g->stages = j["stages"].get<int>();
      MILES_ASSIGN_OR_RETURN(g->roles.trainer,
                             ParallelLayout::parse(j["trainer_layout"].get<std::string>()));
      g->roles.num_engines = j["engines"].get<int>();
      g->roles.engine_tp = j["engine_tp"].get<int>();
    } catch (const json::exception& e) {
      return Status::Error(std::string("weight group join request: ") + e.what());
    }
    if (g->comm != "gloo" && g->comm != "shm")
      return Status::Error("weight group join request: comm '" + g->comm + "' (gloo, shm)");
    if (g->stages < 1 || g->stage < 0 || g->stage >= g->stages)
      return Status::Error("weight group join request: stage " + std::to_string(g->stage) + " of " +
                           std::to_string(g->stages));
    return Status::Ok();
  }

  std::string host_;
  std::mutex mu_;  // guards the fields below
  IntakeGroup group_;
  TransferPlan plan_;
  std::vector<std::shared_ptr<Join>> joins_;    // by stage (p2p: one)
  std::vector<std::shared_ptr<Join>> retired_;  // replaced, maybe still connecting
  Status broken_;                               // an error every receive reports until a new join
};

}  // namespace

std::vector<uint8_t> intake_join_request(const CommOptions& o, const IntakeGroup& g) {
  return bytes_of(json{{"store", o.store_address},
                       {"prefix", o.prefix},
                       {"rank", o.rank},
                       {"world_size", o.world_size},
                       {"host", o.host},
                       {"timeout_ms", o.timeout.count()},
                       {"transport", g.transport},
                       {"comm", g.comm},
                       {"stage", g.stage},
                       {"stages", g.stages},
                       {"trainer_layout", g.roles.trainer.to_string()},
                       {"engines", g.roles.num_engines},
                       {"engine_tp", g.roles.engine_tp}});
}

std::vector<uint8_t> intake_receive_request(int64_t version) {
  return bytes_of(json{{"version", version}});
}

std::unique_ptr<rollout::FollowerIntake> make_weight_group_intake(std::string host) {
  return std::make_unique<GroupIntake>(std::move(host));
}

Result<rollout::ShardWeights> receive_shard(std::span<Communicator* const> comms,
                                            const TransferPlan& plan, const IntakeGroup& group,
                                            int64_t version, int tp_rank) {
  ReceivedWeights set;
  if (group.transport == "p2p") {
    if (comms.size() != 1) return Status::Error("p2p weights come over one group");
    MILES_RETURN_IF_ERROR(p2p_receive_weights(*comms[0], plan, version, group.roles, &set));
  } else {
    MILES_RETURN_IF_ERROR(
        receive_stage_weights(comms, plan, version, &set, tp_rank, group.roles.engine_tp));
  }
  rollout::ShardWeights out;
  out.tensors = std::move(set.tensors);
  out.shapes = std::move(set.shapes);
  out.checksums = std::move(set.checksums);
  return out;
}

}  // namespace miles
