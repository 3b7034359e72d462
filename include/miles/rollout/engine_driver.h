// EngineDriver: runs an Engine on its own thread and lets any thread talk to it.
//
// Why: the Engine is single-threaded by design (one place where its state mutates). Servers call the
// driver from many connection threads; the driver queues each call onto the engine thread, which
// interleaves them with step(). Each request's events go to its RequestStream, which the connection
// thread waits on.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "miles/rollout/engine.h"

namespace miles::rollout {

// The events of one request, filled by the engine thread, drained by a connection thread.
class RequestStream {
 public:
  void push(const SampleEvent& e);
  // Waits for the next event (or until `timeout_ms`); false on timeout.
  bool next(SampleEvent& out, int timeout_ms);
  int32_t samples_finished() const;
  // Blocks until the final events of samples 0..n-1 arrived; returns them by sample index (each final
  // event carries the sample's whole output).
  std::vector<SampleEvent> wait_finished(int32_t n);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SampleEvent> events_;
  int32_t finished_ = 0;
};

class EngineDriver {
 public:
  explicit EngineDriver(std::unique_ptr<Engine> engine);
  ~EngineDriver();  // stops the thread

  Result<uint64_t> submit(GenerateRequest request, std::shared_ptr<RequestStream> stream);
  // Runs fn on the engine thread between iterations and returns its result.
  template <typename T>
  T call(const std::function<T(Engine&)>& fn) {
    T result{};
    run_sync([&](Engine& e) { result = fn(e); });
    return result;
  }
  void run_sync(const std::function<void(Engine&)>& fn);

 private:
  void loop();
  std::unique_ptr<Engine> engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(Engine&)>> commands_;
  bool stop_ = false;
  std::thread thread_;
};

// Swaps a whole checkpoint (safetensors directory or GGUF) into the engine; the caller sets the
// version. Servers take one (ServerOptions::load_checkpoint, GrpcServer::set_checkpoint_loader) so
// that `miles serve` routes the swap through its weight lifecycle (weight_sync/engine_weights.h).
using CheckpointLoader = std::function<Status(const std::string& path)>;

// The plain loader: reads the checkpoint and swaps it in through the driver.
Status load_checkpoint_into(EngineDriver& driver, const std::string& path);

}  // namespace miles::rollout
