// Requests and the follower's intake of the direct p2p transport (tp_intake.h).
#include "weight_sync/tp_intake.h"

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "miles/flat_params.h"

namespace miles {

using nlohmann::json;

namespace {

std::vector<uint8_t> bytes_of(const json& j) {
  const std::string s = j.dump();
  return std::vector<uint8_t>(s.begin(), s.end());
}

Result<json> parse(const std::vector<uint8_t>& request, const char* what) {
  json j = json::parse(request.begin(), request.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(std::string("garbled ") + what + " request from rank 0");
  return j;
}

class P2pFollowerIntake final : public rollout::FollowerIntake {
 public:
  explicit P2pFollowerIntake(std::string host) : host_(std::move(host)) {}
  ~P2pFollowerIntake() override {
    if (joining_.joinable()) joining_.join();
  }

  void join(const std::vector<uint8_t>& request, int tp_rank, const ModelConfig& full) override {
    if (joining_.joinable()) joining_.join();  // bounded by its timeout
    std::lock_guard<std::mutex> l(mu_);
    comm_.reset();
    done_ = false;
    joined_ = Status::Error("joining");
    auto j = parse(request, "weight group join");
    Status ok = j.status();
    CommOptions o;
    if (ok.ok()) {
      try {
        o.store_address = (*j)["store"].get<std::string>();
        o.prefix = (*j)["prefix"].get<std::string>();
        o.rank = (*j)["rank"].get<int>() + tp_rank;
        o.world_size = (*j)["world_size"].get<int>();
        o.host = host_.empty() ? (*j)["host"].get<std::string>() : host_;
        o.timeout = std::chrono::milliseconds((*j)["timeout_ms"].get<int64_t>());
        auto layout = ParallelLayout::parse((*j)["trainer_layout"].get<std::string>());
        ok = layout.status();
        if (ok.ok())
          roles_ = P2pRoles{*layout, (*j)["engines"].get<int>(), (*j)["engine_tp"].get<int>()};
      } catch (const json::exception& e) {
        ok = Status::Error(std::string("weight group join request: ") + e.what());
      }
    }
    if (ok.ok()) {
      auto plan = make_transfer_plan(full, *ParamLayout::for_model(full), roles_.trainer);
      ok = plan.status();
      if (ok.ok()) plan_ = std::move(plan).value();
    }
    if (!ok.ok()) {
      joined_ = ok;
      done_ = true;
      cv_.notify_all();
      return;
    }
    joining_ = std::thread([this, o] {
      auto comm = connect_gloo(o);
      std::lock_guard<std::mutex> l(mu_);
      joined_ = comm.status();
      if (comm.ok()) comm_ = std::move(comm).value();
      done_ = true;
      cv_.notify_all();
    });
  }

  Result<rollout::ShardWeights> receive(const std::vector<uint8_t>& request, int) override {
    MILES_ASSIGN_OR_RETURN(json j, parse(request, "weight intake"));
    if (!j.contains("version") || !j["version"].is_number_integer())
      return Status::Error("weight intake request without a version");
    const int64_t version = j["version"].get<int64_t>();
    std::shared_ptr<Communicator> comm;  // kept alive if a new join replaces it meanwhile
    TransferPlan plan;
    P2pRoles roles;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return done_; });
      if (!joined_.ok()) return joined_.with_context("joining the weight group");
      comm = comm_;
      plan = plan_;
      roles = roles_;
    }
    ReceivedWeights set;
    if (Status s = p2p_receive_weights(*comm, plan, version, roles, &set); !s.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      if (comm_ == comm) {  // out of step with the senders: rank 0's controller forms a new group
        comm_.reset();
        joined_ = s.with_context("an earlier transfer");
      }
      return s;
    }
    return to_shard(std::move(set));
  }

 private:
  std::string host_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = true;  // false while a join runs
  Status joined_ = Status::Error("this engine rank was never asked to join a weight group");
  std::shared_ptr<Communicator> comm_;
  std::thread joining_;
  P2pRoles roles_;
  TransferPlan plan_;
};

}  // namespace

std::vector<uint8_t> intake_join_request(const CommOptions& o, const P2pRoles& roles) {
  return bytes_of(json{{"store", o.store_address},
                       {"prefix", o.prefix},
                       {"rank", o.rank},
                       {"world_size", o.world_size},
                       {"host", o.host},
                       {"timeout_ms", o.timeout.count()},
                       {"trainer_layout", roles.trainer.to_string()},
                       {"engines", roles.num_engines},
                       {"engine_tp", roles.engine_tp}});
}

std::vector<uint8_t> intake_receive_request(int64_t version) {
  return bytes_of(json{{"version", version}});
}

std::unique_ptr<rollout::FollowerIntake> make_p2p_follower_intake(std::string host) {
  return std::make_unique<P2pFollowerIntake>(std::move(host));
}

rollout::ShardWeights to_shard(ReceivedWeights&& set) {
  rollout::ShardWeights out;
  out.tensors = std::move(set.tensors);
  out.shapes = std::move(set.shapes);
  out.checksums = std::move(set.checksums);
  return out;
}

}  // namespace miles
