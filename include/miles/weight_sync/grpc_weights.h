// The EngineWeights service of proto/miles/v1/weights.proto: the gRPC adapter onto the engine's
// weight lifecycle (engine_weights.h), served beside RolloutEngine on the engine's gRPC port
// (GrpcServer::add_service). GetWeightChecksums takes the API key, the rest the admin key (as
// the HTTP routes).
#pragma once

#include <memory>

#include "miles/secret.h"

namespace grpc {
class Service;
}

namespace miles {

class EngineWeights;

std::unique_ptr<grpc::Service> make_weights_service(std::shared_ptr<EngineWeights> weights,
                                                    ApiKeys keys);

}  // namespace miles
