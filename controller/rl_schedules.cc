// The three schedules of RlJob (rl_job.h): sync, one-step-off, async.
#include <condition_variable>
#include <deque>
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

// Fully async: workers keep up to `cap` groups generating or waiting; the trainer takes finished
// groups in completion order, dropping (or retrying) the ones staler than the bound.
Status RlJob::run_async() {
  const RolloutSection& r = cfg_.rollout;
  const AsyncSection& a = cfg_.async;
  const int64_t over = std::max(r.over_sampling_batch_size, r.rollout_batch_size);
  const int64_t cap = a.buffer_groups > 0 ? a.buffer_groups : 2 * over;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RolloutGroup> ready;
  std::deque<int64_t> retry;
  int64_t in_flight = 0;
  bool stop = false;
  Status failure;
  std::atomic<bool> cancel{false};

  auto worker = [&] {
    while (true) {
      int64_t pos;
      const Prompt* prompt;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || static_cast<int64_t>(ready.size()) + in_flight < cap; });
        if (stop) return;
        if (!retry.empty()) {
          pos = retry.front();
          retry.pop_front();
        } else {
          pos = next_position_++;
        }
        prompt = &data_->at(pos);
        ++in_flight;
      }
      auto g = runner_->run(pos, *prompt, cancel);
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      if (g.ok()) {
        ready.push_back(std::move(g).value());
      } else if (!stop && failure.ok()) {
        failure = g.status();
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> workers;
  for (int64_t i = 0; i < cap; ++i) workers.emplace_back(worker);
  auto shutdown = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cancel = true;
    engines_->cancel_all();
    cv.notify_all();
    for (std::thread& t : workers) t.join();
  };

  const PauseMode pause = pause_mode(a.pause_mode);
  Status result;
  while (rollout_step_ < r.num_rollouts && !should_stop()) {
    StepTiming t;
    std::vector<RolloutGroup> groups;
    const auto t_wait = Clock::now();
    double gen_sum = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      while (static_cast<int64_t>(groups.size()) < r.rollout_batch_size) {
        cv.wait(lock, [&] { return !ready.empty() || !failure.ok(); });
        if (!failure.ok()) break;
        RolloutGroup g = std::move(ready.front());
        ready.pop_front();
        cv.notify_all();
        ++t.launched;
        const int64_t staleness = publisher_->current() - g.min_version();
        if (staleness > a.max_weight_staleness) {
          if (a.stale_policy == StalePolicy::kRetry) {
            retry.push_back(g.position);
            ++t.stale_retried;
          } else {
            ++t.stale_dropped;
          }
          continue;
        }
        // Dynamic sampling, bounded as GroupBatch bounds it: past 8 × the batch's groups
        // drawn for this step, groups without signal fill it (and the step says so).
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
      if (!failure.ok()) {
        result = failure;
        break;
      }
    }
    t.idle_s = seconds_since(t_wait);
    t.generate_s = gen_sum / static_cast<double>(groups.size());
    trained_position_ = next_position_;
    SyncPlan plan;
    plan.sync =
        (rollout_step_ + 1) % a.update_weights_interval == 0 || rollout_step_ + 1 == r.num_rollouts;
    plan.pause = &pause;
    result = train_step(std::move(groups), t, plan);
    if (!result.ok()) break;
  }
  shutdown();
  return result;
}

}  // namespace miles::controller
