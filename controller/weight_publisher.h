// WeightPublisher: the trainer side of weight sync in `miles run` — publish a version (disk-delta
// under RUN_DIR/weights), bring engines to it (one by one over disk-delta, or all at once over the
// broadcast group: weight_group.h), and check that they hold exactly the trainer's bytes.
//
// Why: every engine, including one restarted mid-run or one that registers late, must serve the
// current version before it takes traffic; the checksums of each published version (xxh3-128 of
// the float32 bytes, the engines' own /weight_checksums format) are kept so that an engine can be
// checked against the version it claims, not against weights the trainer is already changing.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/engine_client.h"
#include "controller/weight_group.h"
#include "miles/controller/run_config.h"
#include "miles/flat_params.h"
#include "miles/weight_sync/transfer_plan.h"
#include "miles/weight_sync/weight_sync.h"

namespace miles {
class Trainer;
}

namespace miles::controller {

class WeightPublisher {
 public:
  // With transport broadcast, the weight group's store and Gloo transport bind `host` (the
  // controller's address); `log` hears about group changes and fallbacks. `layout`: the trainer's
  // — broadcast forms one group per pipeline stage, p2p one group of all its ranks; the other
  // ranks' part is `senders`' (weight_group.h).
  static Result<std::unique_ptr<WeightPublisher>> create(
      const WeightSyncSection& cfg, const Trainer& trainer, const std::string& host = "127.0.0.1",
      std::function<void(const std::string&)> log = nullptr, const ParallelLayout& layout = {},
      StageSenders senders = {}, int engine_tp = 1);
  // Publishes the trainer's current weights as `version` (> every published one); a version that
  // is already on disk with the same checksums (a resumed run) is adopted instead. Over a weight
  // group the engines get the version from the group, so its disk copy (for engines that start
  // or fall back later) is written in the background from a copy of the weights: anything that
  // reads the directory waits for it first (bring, a broadcast's fallback, the next publish,
  // drop_newer_than, the destructor), and its error surfaces there.
  Status publish(int64_t version, const Trainer& trainer);
  ~WeightPublisher();
  int64_t current() const;
  // Moves `engine` to the current version (pausing it first with `pause`, when given) and checks
  // its checksums when configured.
  Status bring(EngineClient& engine, const PauseMode* pause) const;
  // Whether syncs go over a weight group (transport broadcast or p2p) rather than bring().
  bool broadcasts() const { return group_ != nullptr; }
  // Broadcast transport: moves every engine of `engines` to the current version at once over the
  // weight group — the trainer's bytes, sent by this process — pausing them first with `pause`
  // when given. An engine the group could not reach is brought over disk-delta instead (every
  // version is published there too: late joiners catch up that way). Checksums are compared when
  // configured. One status per engine, in order.
  std::vector<Status> broadcast(const std::vector<std::shared_ptr<EngineClient>>& engines,
                                const Trainer& trainer, const PauseMode* pause);
  // Removes versions newer than `version` (a resumed run's lost future).
  Status drop_newer_than(int64_t version) const;
  // Waits for the background disk write of the last version (publish); its status.
  Status disk_written() const;

 private:
  // weight_sync.keep_versions, before `version` is published.
  Status prune(int64_t version) const;

  WeightSyncSection cfg_;
  TransferPlan plan_;
  std::unique_ptr<WeightSender> sender_;
  std::unique_ptr<WeightGroup> group_;  // transport broadcast
  std::function<void(const std::string&)> log_;
  mutable std::mutex mu_;
  int64_t current_ = -1;
  std::map<std::string, std::string> checksums_;  // of `current_`
  // Weight groups into tensor-parallel engines (engine_tp_ > 1): the checksums of `current_` as
  // such an engine reports them after a direct transfer (sharded_checksum_of); empty otherwise.
  int engine_tp_ = 1;
  std::map<std::string, std::string> sharded_;
  // The version being written to disk: its checksums (the writer's known_xxh3), a copy of its
  // weights (kept for the next version: no fresh pages) and the write, in the background over a
  // weight group.
  std::map<std::string, std::string> disk_sums_;
  FlatTensors disk_copy_;
  mutable std::mutex disk_mu_;
  mutable std::future<Status> disk_;
  mutable Status disk_status_ = Status::Ok();
};

}  // namespace miles::controller
