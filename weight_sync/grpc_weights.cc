// The gRPC adapter onto EngineWeights (grpc_weights.h): the request message to the typed step,
// its refusal to a gRPC status.
#include "miles/weight_sync/grpc_weights.h"

#include <grpcpp/grpcpp.h>

#include "miles/rollout/grpc_server.h"
#include "miles/v1/weights.grpc.pb.h"
#include "miles/weight_sync/engine_weights.h"

namespace miles {

namespace pb = ::miles::v1;

namespace {

grpc::Status to_grpc(WeightFault f, const std::string& message) {
  switch (f) {
    case WeightFault::kNone:
      return grpc::Status::OK;
    case WeightFault::kInvalid:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
    case WeightFault::kForbidden:
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, message);
    case WeightFault::kConflict:
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, message);
    case WeightFault::kInternal:
      return grpc::Status(grpc::StatusCode::INTERNAL, message);
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, message);
}

grpc::Status reply(const WeightReply& r, pb::WeightVersion* out) {
  if (!r.ok()) return to_grpc(r.fault, r.message);
  out->set_weight_version(r.version);
  return grpc::Status::OK;
}

// The proto's zeros mean the spec's defaults.
GroupJoinSpec join_spec(const pb::JoinWeightGroupRequest& in) {
  GroupJoinSpec s;
  s.store = in.store();
  s.prefix = in.prefix();
  s.rank = in.rank();
  s.world_size = in.world_size();
  if (in.timeout_s() != 0) s.timeout_s = in.timeout_s();
  if (!in.host().empty()) s.host = in.host();
  s.plan_digest = in.plan_digest();
  s.stage = in.stage();
  if (in.stages() != 0) s.stages = in.stages();
  s.trainer_layout = in.trainer_layout();
  if (in.engine_tp() != 0) s.engine_tp = in.engine_tp();
  if (!in.comm().empty()) s.comm = in.comm();
  return s;
}

class WeightsService final : public pb::EngineWeights::Service {
 public:
  WeightsService(std::shared_ptr<EngineWeights> w, ApiKeys keys)
      : w_(std::move(w)), keys_(std::move(keys)) {}

  grpc::Status JoinWeightGroup(grpc::ServerContext* ctx, const pb::JoinWeightGroupRequest* in,
                               pb::WeightVersion* out) override {
    if (grpc::Status a = rollout::authorize_grpc_call(*ctx, keys_, true); !a.ok()) return a;
    return reply(w_->join_group(join_spec(*in)), out);
  }

  grpc::Status UpdateWeightsFromGroup(grpc::ServerContext* ctx,
                                      const pb::UpdateWeightsFromGroupRequest* in,
                                      pb::WeightVersion* out) override {
    if (grpc::Status a = rollout::authorize_grpc_call(*ctx, keys_, true); !a.ok()) return a;
    return reply(w_->update_from_group(in->weight_version()), out);
  }

  grpc::Status UpdateWeightsFromDiskDelta(grpc::ServerContext* ctx,
                                          const pb::UpdateWeightsFromDiskDeltaRequest* in,
                                          pb::WeightVersion* out) override {
    if (grpc::Status a = rollout::authorize_grpc_call(*ctx, keys_, true); !a.ok()) return a;
    if (in->dir().empty()) return to_grpc(WeightFault::kInvalid, "dir is empty");
    return reply(w_->update_from_disk_delta(in->dir(), in->weight_version()), out);
  }

  grpc::Status GetWeightChecksums(grpc::ServerContext* ctx, const pb::WeightChecksumsRequest*,
                                  pb::WeightChecksums* out) override {
    if (grpc::Status a = rollout::authorize_grpc_call(*ctx, keys_, false); !a.ok()) return a;
    auto sums = w_->checksums();
    if (!sums.ok()) return to_grpc(WeightFault::kInternal, sums.message());
    out->set_weight_version(sums->version);
    out->mutable_checksums()->insert(sums->checksums.begin(), sums->checksums.end());
    return grpc::Status::OK;
  }

  grpc::Status CheckWeights(grpc::ServerContext* ctx, const pb::CheckWeightsRequest* in,
                            pb::CheckWeightsResponse* out) override {
    if (grpc::Status a = rollout::authorize_grpc_call(*ctx, keys_, true); !a.ok()) return a;
    auto c = w_->check(
        std::map<std::string, std::string>(in->checksums().begin(), in->checksums().end()));
    if (!c.ok()) return to_grpc(WeightFault::kInternal, c.message());
    out->set_match(c->match);
    out->set_weight_version(c->version);
    out->set_message(c->message);
    return grpc::Status::OK;
  }

 private:
  std::shared_ptr<EngineWeights> w_;
  ApiKeys keys_;
};

}  // namespace

std::unique_ptr<grpc::Service> make_weights_service(std::shared_ptr<EngineWeights> weights,
                                                    ApiKeys keys) {
  return std::make_unique<WeightsService>(std::move(weights), std::move(keys));
}

}  // namespace miles
