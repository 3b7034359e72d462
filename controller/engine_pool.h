// EnginePool: the rollout engines of a run — started by the controller or attached — with health
// checks, restarts, and dispatch of groups to the least-loaded ready engine.
//
// Why: an RL run lasts hours and engines die (OOM, a bad node, a kill). The pool notices (the
// process exited, or two failed health checks), cancels the dead engine's calls so that their
// groups are re-dispatched whole to another engine (a group's samples are kept only when all of
// them finished: none lost, none duplicated), restarts the engine when it started it, and lets it
// take traffic only after `prepare` brought it to the current weights. Weight updates (update_all)
// and an engine becoming ready exclude each other, so no engine can miss a version.
//
// Engine states: starting → syncing → ready → dead (→ starting again on a restart).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "controller/engine_client.h"
#include "miles/controller/child_process.h"

namespace miles::controller {

// How the pool starts a local engine (`miles serve` with these options).
struct EngineLaunch {
  std::string model, tokenizer;
  int64_t threads = 1, num_blocks = 4096, max_batch_tokens = 2048, max_running = 256;
  bool speculative = false;  // `miles serve --speculative`, with these two
  int64_t spec_max_draft_tokens = 4;
  bool spec_adaptive = true;
  bool spec_draft_head = false;    // --spec-draft-head: the co-trained head of each version
  int64_t tp = 1;                  // `miles serve --tp`
  std::string device = "cpu";      // `miles serve --device`
  std::string log_dir;             // engine_K.log
  std::string controller_address;  // HOST:PORT the engine registers with
  std::string weights_dir;         // `miles serve --weights-dir`: the disk-delta directory
};

struct EnginePoolOptions {
  EngineLaunch launch;
  double health_interval_s = 1.0;
  double start_timeout_s = 60;
  int64_t max_restarts = 3;  // per engine
  // Brings an engine to the current weights before it takes traffic (called under the sync lock).
  std::function<Status(EngineClient&)> prepare;
  // Told about every state change ("engine 1 dead: exited with status 9"), for the run's log.
  std::function<void(const std::string&)> log;
};

struct EngineInfo {
  int64_t id = 0;
  std::string address, state;
  int64_t pid = 0, restarts = 0, in_flight = 0;
};

struct PoolCounters {
  int64_t restarts = 0;      // engines restarted
  int64_t redispatched = 0;  // groups sent again after their engine failed
  int64_t failures = 0;      // engines found dead
};

class EnginePool {
 public:
  explicit EnginePool(EnginePoolOptions options);
  ~EnginePool();

  // Where local engines register (the controller service listens only after the pool exists).
  void set_controller_address(const std::string& address) {
    options_.launch.controller_address = address;
  }
  // Starts `n` local engines and waits until every one is ready (registered and prepared).
  Status start_local(int64_t n);
  // An engine at a known address (not started by the pool): prepared, then ready.
  Status attach(const EngineAddress& address);
  // The RegisterEngine call of an engine (engine_id >= 0: one this pool started). Returns its id.
  Result<int64_t> on_register(const EngineAddress& address, int64_t engine_id, int64_t pid);
  // Waits until at least `n` engines are ready.
  Status wait_ready(int64_t n, double timeout_s);

  // Generates one group on a ready engine; when that engine fails, again on another, until it
  // succeeds, `cancel` is set, or no engine can come back. Aborted samples come back as such.
  Result<std::vector<GeneratedSample>> generate(const GroupRequest& request,
                                                const std::atomic<bool>& cancel);
  // Runs `fn` on every ready engine (weight updates); no engine becomes ready meanwhile.
  Status update_all(const std::function<Status(EngineClient&)>& fn);
  // The same for a transport that updates every ready engine at once (a broadcast): `fn` gets them
  // all and returns one status per engine, in order; an engine with an error is marked dead.
  using GroupUpdate =
      std::function<std::vector<Status>(const std::vector<std::shared_ptr<EngineClient>>&)>;
  Status update_all_group(const GroupUpdate& fn);
  // Cancels every generate() in flight (their callers see `cancel` and return).
  void cancel_all();

  std::vector<EngineInfo> snapshot() const;
  PoolCounters counters() const;
  // The ready engines' speculative-decoding counters, summed (an engine that does not answer
  // counts nothing).
  SpecCounters spec_counters() const;
  // Kills the local engines' processes by pid (tests use it to simulate a crash).
  void stop();

 private:
  enum class State { kStarting, kSyncing, kReady, kDead };
  struct Entry {
    int64_t id = 0;
    State state = State::kStarting;
    std::shared_ptr<EngineClient> client;
    std::optional<ChildProcess> process;  // when started by the pool
    int64_t restarts = 0;
    int health_failures = 0;
    int64_t in_flight = 0;
    bool restart_pending = false;  // dead; the monitor thread starts it again
    std::string error;
  };

  Status spawn(Entry& e);                            // under mu_
  void prepare_async(int64_t id);                    // syncing → ready (or dead)
  void mark_dead(Entry& e, const std::string& why);  // under mu_
  void monitor();                                    // the health-check thread
  void restart_pending();                            // under mu_, on the monitor thread
  Entry* pick_ready();                               // under mu_
  std::vector<std::pair<int64_t, std::shared_ptr<EngineClient>>> ready_clients() const;
  void update_failed(int64_t id, const std::shared_ptr<EngineClient>& client, const Status& s);
  bool any_recoverable() const;  // under mu_
  void log(const std::string& line) const;

  EnginePoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Entry>> engines_;  // by id
  PoolCounters counters_;
  std::mutex sync_mu_;  // weight updates vs engines becoming ready
  std::atomic<bool> stopping_{false};
  std::thread monitor_;
  std::vector<std::thread> workers_;  // prepare / restart threads
};

}  // namespace miles::controller
