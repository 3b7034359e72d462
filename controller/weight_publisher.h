// WeightPublisher: the trainer side of weight sync in `miles run` — publish a version (disk-delta
// under RUN_DIR/weights), bring engines to it, and check that they hold exactly the trainer's
// bytes.
//
// Why: every engine, including one restarted mid-run or one that registers late, must serve the
// current version before it takes traffic; the checksums of each published version (xxh3-128 of
// the float32 bytes, the engines' own /weight_checksums format) are kept so that an engine can be
// checked against the version it claims, not against weights the trainer is already changing.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "controller/engine_client.h"
#include "miles/run_config.h"
#include "miles/transfer_plan.h"
#include "miles/weight_sync.h"

namespace miles {
class Trainer;
}

namespace miles::controller {

class WeightPublisher {
 public:
  static Result<std::unique_ptr<WeightPublisher>> create(const WeightSyncSection& cfg,
                                                         const Trainer& trainer);
  // Publishes the trainer's current weights as `version` (> every published one); a version that
  // is already on disk with the same checksums (a resumed run) is adopted instead.
  Status publish(int64_t version, const Trainer& trainer);
  int64_t current() const;
  // Moves `engine` to the current version (pausing it first with `pause`, when given) and checks
  // its checksums when configured.
  Status bring(EngineClient& engine, const PauseMode* pause) const;
  // Removes versions newer than `version` (a resumed run's lost future).
  Status drop_newer_than(int64_t version) const;

 private:
  WeightSyncSection cfg_;
  TransferPlan plan_;
  std::unique_ptr<WeightSender> sender_;
  mutable std::mutex mu_;
  int64_t current_ = -1;
  std::map<std::string, std::string> checksums_;  // of `current_`
};

}  // namespace miles::controller
