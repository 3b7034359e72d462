// GroupBatch: the groups of one rollout step, generated concurrently — with over-sampling and
// zero-variance filtering — and returned in prompt-stream order.
//
// Why: synchronous and one-step-off runs must be reproducible: which groups a step trains on may
// not depend on which engine was faster. The batch launches `launch_size` groups at consecutive
// stream positions, keeps those that pass the filter in position order, launches more when too
// few pass, and cancels the surplus (their requests are aborted engine-side) once the first `need`
// passing groups are known. If a run keeps producing groups without signal (all rewards equal) it
// does not stall: after 8 × need launches, filtered groups fill the batch in position order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "controller/group_runner.h"

namespace miles::controller {

struct BatchOutcome {
  std::vector<RolloutGroup> groups;  // `need` of them, position order
  int64_t next_position = 0;         // the stream position after the last launched group
  int64_t launched = 0, filtered = 0, cancelled = 0;
  bool filled_with_filtered = false;
  int64_t without_signal = 0;  // groups of `groups` that failed the filter (filled ones)
  double seconds = 0;  // first launch → last needed group done
};

class GroupBatch {
 public:
  // PromptData::at is called only from the thread that calls the constructor and wait().
  GroupBatch(GroupRunner& runner, const PromptData& data, int64_t first_position, int64_t need,
             int64_t launch_size, bool filter_zero_variance);
  ~GroupBatch();  // cancels and joins what is still running
  Result<BatchOutcome> wait();

 private:
  struct Slot {
    int64_t position = 0;
    std::optional<Result<RolloutGroup>> result;
    std::thread thread;
  };
  void launch(int64_t count);
  GroupRunner& runner_;
  const PromptData& data_;
  int64_t next_position_, need_, launch_size_;
  bool filter_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace miles::controller
