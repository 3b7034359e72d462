// The co-trained draft head's versions beside the policy's disk-delta versions
// (docs/speculative.md): the publisher writes the trainer's head for every weight version it
// publishes, the engine (`miles serve --spec-draft-head`) reads the one of the version it adopted,
// so an engine's draft and policy always share a version whatever transport brought the policy.
//
// Layout: DIR/draft/<version>.safetensors (the head's trained tensors and "draft.vocab"), written
// atomically; the newest few are kept.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "miles/checkpoint.h"
#include "miles/draft_head.h"
#include "miles/model_config.h"
#include "miles/status.h"

namespace miles {

std::string draft_head_path(const std::string& dir, int64_t version);

// Writes `head` as `version` into DIR/draft/ and removes all but the newest `keep` versions.
Status write_draft_head(const std::string& dir, int64_t version, const DraftHead& head,
                        int keep = 3);

// The head of `version` in DIR, its frozen parts from `policy_weights` (the policy of that
// version); null (not an error) when DIR has no head of that version.
Result<std::shared_ptr<const DraftHead>> read_draft_head(const std::string& dir, int64_t version,
                                                         const ModelConfig& policy,
                                                         const TensorMap& policy_weights);

}  // namespace miles
