// The trainer batch of one rollout step as bytes: rank 0 of a trainer group (the controller)
// broadcasts it to the other ranks, which train on exactly the same samples (TITO holds across
// processes: token ids, logprobs, advantages and routed experts travel bit for bit).
#pragma once

#include <cstdint>
#include <vector>

#include "miles/trainer/rl_objective.h"
#include "miles/trainer/trainer.h"

namespace miles::controller {

std::vector<uint8_t> encode_batch(const std::vector<TrainSample>& samples,
                                  const std::vector<RlSampleData>& data);
// Errors name what is truncated or inconsistent.
Status decode_batch(const std::vector<uint8_t>& bytes, std::vector<TrainSample>* samples,
                    std::vector<RlSampleData>* data);

}  // namespace miles::controller
