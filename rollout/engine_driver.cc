// EngineDriver: a command queue drained between engine iterations; the thread sleeps when idle.
#include "miles/rollout/engine_driver.h"

#include <future>

#include "miles/model.h"

namespace miles::rollout {

void RequestStream::push(const SampleEvent& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
    if (e.finished) ++finished_;
  }
  cv_.notify_all();
}

bool RequestStream::next(SampleEvent& out, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); }))
    return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

std::vector<SampleEvent> RequestStream::wait_finished(int32_t n) {
  std::vector<SampleEvent> finals(static_cast<size_t>(n));
  int32_t done = 0;
  SampleEvent ev;
  while (done < n) {
    if (!next(ev, 1000)) continue;
    if (ev.finished) {
      finals[ev.sample_index] = std::move(ev);
      ++done;
    }
  }
  return finals;
}

int32_t RequestStream::samples_finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

EngineDriver::EngineDriver(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)), thread_([this] { loop(); }) {}

EngineDriver::~EngineDriver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EngineDriver::run_sync(const std::function<void(Engine&)>& fn) {
  std::promise<void> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back([&](Engine& e) {
      fn(e);
      done.set_value();
    });
  }
  cv_.notify_all();
  done.get_future().wait();
}

Result<uint64_t> EngineDriver::submit(GenerateRequest request,
                                      std::shared_ptr<RequestStream> stream) {
  Result<uint64_t> out = Status::Error("not run");
  run_sync([&](Engine& e) {
    out = e.submit(std::move(request), [stream](const SampleEvent& ev) { stream->push(ev); });
  });
  return out;
}

void EngineDriver::loop() {
  for (;;) {
    std::deque<std::function<void(Engine&)>> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool busy = !engine_->idle() && !engine_->stats().paused;
      if (!busy) cv_.wait(lock, [&] { return stop_ || !commands_.empty(); });
      if (stop_) return;
      batch.swap(commands_);
    }
    for (auto& fn : batch) fn(*engine_);
    engine_->step();
  }
}

Status load_checkpoint_into(EngineDriver& driver, const std::string& path) {
  MILES_ASSIGN_OR_RETURN(ModelFiles files, load_model_files(path));
  Status st;
  driver.run_sync([&](Engine& e) { st = e.update_weights(files.weights); });
  return st;
}

}  // namespace miles::rollout
