// The three schedules of RlJob (rl_job.h): sync, one-step-off, async.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "controller/rl_job_internal.h"
#include "miles/check.h"

namespace miles::controller {

namespace {

void record(StepTiming& t, const BatchOutcome& o) {
  t.generate_s = o.seconds;
  t.launched = o.launched;
  t.filtered = o.filtered;
  t.cancelled = o.cancelled;
  t.filled_with_filtered = o.filled_with_filtered;
  t.without_signal = o.without_signal;
}

// async.pause_mode as the engine's pause mode (every enumerator has one; none is a default).
PauseMode pause_mode(SyncPause p) {
  switch (p) {
    case SyncPause::kRetract:
      return PauseMode::kRetract;
    case SyncPause::kInPlace:
      return PauseMode::kInPlace;
    case SyncPause::kAbort:
      return PauseMode::kAbort;
  }
  MILES_CHECK(false, "async.pause_mode: an enumerator without a pause mode");
}

}  // namespace

std::unique_ptr<GroupBatch> RlJob::launch_batch() {
  const RolloutSection& r = cfg_.rollout;
  return std::make_unique<GroupBatch>(*runner_, *data_, next_position_, r.rollout_batch_size,
                                      r.over_sampling_batch_size, r.filter_zero_variance);
}

Status RlJob::run_sync() {
  while (rollout_step_ < cfg_.rollout.num_rollouts && !should_stop()) {
    auto batch = launch_batch();
    MILES_ASSIGN_OR_RETURN(BatchOutcome out, batch->wait());
    batch.reset();
    next_position_ = trained_position_ = out.next_position;
    StepTiming t;
    record(t, out);
    MILES_RETURN_IF_ERROR(train_step(std::move(out.groups), t, SyncPlan{}));
  }
  return Status::Ok();
}

Status RlJob::run_one_step_off() {
  auto first = launch_batch();
  MILES_ASSIGN_OR_RETURN(BatchOutcome cur, first->wait());
  first.reset();
  next_position_ = cur.next_position;
  while (rollout_step_ < cfg_.rollout.num_rollouts && !should_stop()) {
    trained_position_ = cur.next_position;
    // Step k + 1 generates with the weights of step k while step k trains.
    std::unique_ptr<GroupBatch> next;
    if (rollout_step_ + 1 < cfg_.rollout.num_rollouts) next = launch_batch();
    BatchOutcome following;
    StepTiming t;
    record(t, cur);
    SyncPlan plan;
    plan.before_sync = [&]() -> Status {
      if (!next) return Status::Ok();
      const auto t_wait = Clock::now();
      MILES_ASSIGN_OR_RETURN(following, next->wait());
      t.idle_s = seconds_since(t_wait);
      next.reset();
      next_position_ = following.next_position;
      return Status::Ok();
    };
    MILES_RETURN_IF_ERROR(train_step(std::move(cur.groups), t, plan));
    cur = std::move(following);
  }
  return Status::Ok();
}

namespace {

// The async schedule's producers: `cap` workers, each generating one group at a time, keep up to
// `cap` groups generating or finished and not yet taken. A position handed back (retry) is
// generated again before new ones. Stopping cancels what is generating and joins the workers.
class GroupProducers {
 public:
  using Run = std::function<Result<RolloutGroup>(int64_t position, const Prompt& prompt,
                                                 std::atomic<bool>& cancel)>;
  // prompt_at runs under the producers' lock (PromptData::at caches an epoch's order).
  GroupProducers(int64_t cap, int64_t next_position,
                 std::function<const Prompt&(int64_t)> prompt_at, Run run,
                 std::function<void()> cancel_all)
      : cap_(cap),
        next_position_(next_position),
        prompt_at_(std::move(prompt_at)),
        run_(std::move(run)),
        cancel_all_(std::move(cancel_all)) {
    for (int64_t i = 0; i < cap_; ++i) workers_.emplace_back([this] { work(); });
  }
  ~GroupProducers() { stop(); }

  // The next finished group in completion order (blocks); the first worker's error once one
  // failed.
  Result<RolloutGroup> take() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty() || !failure_.ok(); });
    if (!failure_.ok()) return failure_;
    RolloutGroup g = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return g;
  }
  void retry(int64_t position) {
    std::lock_guard<std::mutex> lock(mu_);
    retry_.push_back(position);
    cv_.notify_all();
  }
  // The next prompt stream position a worker would launch.
  int64_t next_position() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_position_;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cancel_ = true;
    cancel_all_();
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

 private:
  void work() {
    while (true) {
      int64_t pos;
      const Prompt* prompt;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock,
                 [&] { return stop_ || static_cast<int64_t>(ready_.size()) + in_flight_ < cap_; });
        if (stop_) return;
        if (!retry_.empty()) {
          pos = retry_.front();
          retry_.pop_front();
        } else {
          pos = next_position_++;
        }
        prompt = &prompt_at_(pos);
        ++in_flight_;
      }
      auto g = run_(pos, *prompt, cancel_);
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
      if (g.ok())
        ready_.push_back(std::move(g).value());
      else if (!stop_ && failure_.ok())
        failure_ = g.status();
      cv_.notify_all();
    }
  }

  const int64_t cap_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RolloutGroup> ready_;
  std::deque<int64_t> retry_;
  int64_t next_position_;
  int64_t in_flight_ = 0;
  bool stop_ = false;
  Status failure_;
  std::atomic<bool> cancel_{false};
  std::function<const Prompt&(int64_t)> prompt_at_;
  Run run_;
  std::function<void()> cancel_all_;
  std::vector<std::thread> workers_;
};

// One step's groups from the producers: a group staler than async.max_weight_staleness is dropped
// or retried (async.stale_policy); with rollout.filter_zero_variance, groups without signal are
// skipped until 8 x the batch's groups were drawn, then fill it (and the step says so).
Result<std::vector<RolloutGroup>> take_step_groups(GroupProducers& producers,
                                                   const RolloutSection& r, const AsyncSection& a,
                                                   int64_t current_version, StepTiming& t) {
  std::vector<RolloutGroup> groups;
  double gen_sum = 0;
  while (static_cast<int64_t>(groups.size()) < r.rollout_batch_size) {
    MILES_ASSIGN_OR_RETURN(RolloutGroup g, producers.take());
    ++t.launched;
    if (current_version - g.min_version() > a.max_weight_staleness) {
      if (a.stale_policy == StalePolicy::kRetry) {
        producers.retry(g.position);
        ++t.stale_retried;
      } else {
        ++t.stale_dropped;
      }
      continue;
    }
    if (r.filter_zero_variance && g.zero_variance()) {
      if (t.launched < 8 * r.rollout_batch_size) {
        ++t.filtered;
        continue;
      }
      t.filled_with_filtered = true;
      ++t.without_signal;
    }
    gen_sum += g.seconds;
    groups.push_back(std::move(g));
  }
  t.generate_s = gen_sum / static_cast<double>(groups.size());
  return groups;
}

}  // namespace

// Fully async: workers keep up to `cap` groups generating or waiting; the trainer takes finished
// groups in completion order, dropping (or retrying) the ones staler than the bound.
Status RlJob::run_async() {
  const RolloutSection& r = cfg_.rollout;
  const AsyncSection& a = cfg_.async;
  const int64_t over = std::max(r.over_sampling_batch_size, r.rollout_batch_size);
  GroupProducers producers(
      a.buffer_groups > 0 ? a.buffer_groups : 2 * over, next_position_,
      [this](int64_t pos) -> const Prompt& { return data_->at(pos); },
      [this](int64_t pos, const Prompt& prompt, std::atomic<bool>& cancel) {
        return runner_->run(pos, prompt, cancel);
      },
      [this] { engines_->cancel_all(); });
  const PauseMode pause = pause_mode(a.pause_mode);
  Status result;
  while (rollout_step_ < r.num_rollouts && !should_stop()) {
    StepTiming t;
    const auto t_wait = Clock::now();
    auto groups = take_step_groups(producers, r, a, publisher_->current(), t);
    if (!groups.ok()) {
      result = groups.status();
      break;
    }
    t.idle_s = seconds_since(t_wait);
    trained_position_ = next_position_ = producers.next_position();
    SyncPlan plan;
    plan.sync =
        (rollout_step_ + 1) % a.update_weights_interval == 0 || rollout_step_ + 1 == r.num_rollouts;
    plan.pause = &pause;
    result = train_step(std::move(groups).value(), t, plan);
    if (!result.ok()) break;
  }
  producers.stop();
  return result;
}

}  // namespace miles::controller
