// EnginePool (engine_pool.h): start, register, prepare, health-check, restart, dispatch.
#include "controller/engine_pool.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

namespace miles::controller {

namespace {

const char* state_name(int s) {
  static const char* kNames[] = {"starting", "syncing", "ready", "dead"};
  return kNames[s];
}

}  // namespace

EnginePool::EnginePool(EnginePoolOptions options) : options_(std::move(options)) {
  monitor_ = std::thread([this] { monitor(); });
}

EnginePool::~EnginePool() { stop(); }

void EnginePool::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

Status EnginePool::spawn(Entry& e) {
  const EngineLaunch& l = options_.launch;
  std::vector<std::string> argv = {miles_executable(),
                                   "serve",
                                   "--model",
                                   l.model,
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   "0",
                                   "--grpc-port",
                                   "0",
                                   "--threads",
                                   std::to_string(l.threads),
                                   "--num-blocks",
                                   std::to_string(l.num_blocks),
                                   "--max-batch-tokens",
                                   std::to_string(l.max_batch_tokens),
                                   "--max-running",
                                   std::to_string(l.max_running),
                                   "--controller",
                                   l.controller_address,
                                   "--engine-id",
                                   std::to_string(e.id)};
  if (!l.weights_dir.empty()) {
    argv.push_back("--weights-dir");
    argv.push_back(l.weights_dir);
  }
  if (l.device != "cpu") {
    argv.push_back("--device");
    argv.push_back(l.device);
  }
  if (l.speculative) {
    argv.insert(argv.end(), {"--speculative", "--spec-max-draft-tokens",
                             std::to_string(l.spec_max_draft_tokens)});
    if (!l.spec_adaptive) argv.push_back("--no-spec-adaptive");
    if (l.spec_draft_head) argv.push_back("--spec-draft-head");
  }
  if (l.tp > 1) {
    argv.push_back("--tp");
    argv.push_back(std::to_string(l.tp));
  }
  if (!l.tokenizer.empty()) {
    argv.push_back("--tokenizer");
    argv.push_back(l.tokenizer);
  }
  std::filesystem::create_directories(l.log_dir);
  auto p = ChildProcess::spawn(argv, l.log_dir + "/engine_" + std::to_string(e.id) + ".log");
  if (!p.ok()) return p.status();
  e.process.emplace(std::move(p).value());
  e.state = State::kStarting;
  e.client.reset();
  e.health_failures = 0;
  log("engine " + std::to_string(e.id) + " starting (pid " + std::to_string(e.process->pid()) +
      ")");
  return Status::Ok();
}

Status EnginePool::start_local(int64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < n; ++i) {
      auto e = std::make_unique<Entry>();
      e->id = static_cast<int64_t>(engines_.size());
      MILES_RETURN_IF_ERROR(spawn(*e));
      engines_.push_back(std::move(e));
    }
  }
  return wait_ready(n, options_.start_timeout_s);
}

Status EnginePool::wait_ready(int64_t n, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (true) {
    int64_t ready = 0;
    for (const auto& e : engines_) ready += e->state == State::kReady;
    if (ready >= n) return Status::Ok();
    if (!engines_.empty() && !any_recoverable()) {  // none yet: wait for registrations
      std::string why;
      for (const auto& e : engines_)
        if (!e->error.empty()) why += "; engine " + std::to_string(e->id) + ": " + e->error;
      return Status::Error("only " + std::to_string(ready) + " of " + std::to_string(n) +
                           " rollout engines came up" + why + " (logs in " +
                           options_.launch.log_dir + ")");
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout)
      return Status::Error("timed out after " + std::to_string(timeout_s) + " s waiting for " +
                           std::to_string(n) + " rollout engines (" + std::to_string(ready) +
                           " ready; logs in " + options_.launch.log_dir + ")");
  }
}

Status EnginePool::attach(const EngineAddress& address) {
  auto id = on_register(address, -1, 0);
  if (!id.ok()) return id.status();
  return Status::Ok();
}

Result<int64_t> EnginePool::on_register(const EngineAddress& address, int64_t engine_id,
                                        int64_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Status::Error("the controller is stopping");
  Entry* e = nullptr;
  if (engine_id >= 0) {
    if (engine_id >= static_cast<int64_t>(engines_.size()) ||
        engines_[engine_id]->state != State::kStarting)
      return Status::Error("engine id " + std::to_string(engine_id) +
                           " was not started by this controller (or registered already)");
    e = engines_[engine_id].get();
  } else {
    engines_.push_back(std::make_unique<Entry>());
    e = engines_.back().get();
    e->id = static_cast<int64_t>(engines_.size()) - 1;
  }
  e->client = std::make_shared<EngineClient>(address);
  e->state = State::kSyncing;
  e->error.clear();
  log("engine " + std::to_string(e->id) + " registered at " + address.http() + " (gRPC " +
      std::to_string(address.grpc_port) + (pid ? ", pid " + std::to_string(pid) : "") + ")");
  const int64_t id = e->id;
  workers_.emplace_back([this, id] { prepare_async(id); });
  return id;
}

void EnginePool::prepare_async(int64_t id) {
  std::lock_guard<std::mutex> sync(sync_mu_);
  std::shared_ptr<EngineClient> client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (engines_[id]->state != State::kSyncing) return;
    client = engines_[id]->client;
  }
  Status s = options_.prepare ? options_.prepare(*client) : Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = *engines_[id];
  if (e.state != State::kSyncing || e.client != client) return;
  if (!s.ok()) {
    mark_dead(e, "preparing it failed: " + s.message());
  } else {
    e.state = State::kReady;
    log("engine " + std::to_string(id) + " ready");
  }
  cv_.notify_all();
}

void EnginePool::mark_dead(Entry& e, const std::string& why) {
  if (e.state == State::kDead) return;
  e.state = State::kDead;
  e.error = why;
  ++counters_.failures;
  if (e.client) e.client->cancel_all();
  log("engine " + std::to_string(e.id) + " dead: " + why);
  if (e.process && !stopping_) {
    e.process->terminate();
    // The monitor thread restarts it: PR_SET_PDEATHSIG fires when the *thread* that forked exits,
    // so children are only ever forked by threads that live as long as the pool.
    e.restart_pending = e.restarts < options_.max_restarts;
  }
  cv_.notify_all();
}

void EnginePool::restart_pending() {
  for (auto& e : engines_) {
    if (!e->restart_pending || stopping_) continue;
    e->restart_pending = false;
    ++e->restarts;
    ++counters_.restarts;
    if (Status s = spawn(*e); !s.ok()) {
      e->state = State::kDead;
      e->error = "restart failed: " + s.message();
    }
  }
}

bool EnginePool::any_recoverable() const {
  for (const auto& e : engines_)
    if (e->state != State::kDead || e->restart_pending) return true;
  return false;
}

void EnginePool::monitor() {
  const auto interval =
      std::chrono::milliseconds(static_cast<int64_t>(options_.health_interval_s * 1000));
  while (!stopping_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, interval, [this] {
        if (stopping_) return true;
        for (const auto& e : engines_)
          if (e->restart_pending) return true;
        return false;
      });
      restart_pending();
    }
    if (stopping_) break;
    std::vector<std::pair<int64_t, std::shared_ptr<EngineClient>>> check;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& e : engines_) {
        if (e->state == State::kDead) continue;
        if (e->process && !e->process->alive()) {
          mark_dead(*e, "process " + e->process->exit_description());
          restart_pending();
          continue;
        }
        if (e->state == State::kReady) check.emplace_back(e->id, e->client);
      }
    }
    for (auto& [id, client] : check) {
      Status h = client->health(2.0);
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = *engines_[id];
      if (e.client != client || e.state != State::kReady) continue;
      e.health_failures = h.ok() ? 0 : e.health_failures + 1;
      if (e.health_failures >= 2) mark_dead(e, "health checks failed: " + h.message());
    }
  }
}

EnginePool::Entry* EnginePool::pick_ready() {
  Entry* best = nullptr;
  for (auto& e : engines_)
    if (e->state == State::kReady && (!best || e->in_flight < best->in_flight)) best = e.get();
  return best;
}

Result<std::vector<GeneratedSample>> EnginePool::generate(const GroupRequest& request,
                                                          const std::atomic<bool>& cancel) {
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<EngineClient> client;
    int64_t id = -1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        if (cancel || stopping_) return Status::Error("cancelled");
        if (Entry* e = pick_ready()) {
          ++e->in_flight;
          client = e->client;
          id = e->id;
          break;
        }
        if (!any_recoverable()) return Status::Error("no rollout engine is left");
        cv_.wait_for(lock, std::chrono::milliseconds(200));
      }
    }
    if (attempt > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.redispatched;
    }
    auto r = client->generate(request);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --engines_[id]->in_flight;
    }
    if (r.ok()) return r;
    if (cancel || stopping_) return Status::Error("cancelled");
    // The engine failed or was cancelled as dead: is it still healthy? Then the request itself was
    // bad (not worth sending again).
    if (client->health(2.0).ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (engines_[id]->client == client && engines_[id]->state == State::kReady) return r;
    }
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = *engines_[id];
    if (e.client == client) mark_dead(e, r.message());
  }
}

std::vector<std::pair<int64_t, std::shared_ptr<EngineClient>>> EnginePool::ready_clients() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, std::shared_ptr<EngineClient>>> ready;
  for (const auto& e : engines_)
    if (e->state == State::kReady) ready.emplace_back(e->id, e->client);
  return ready;
}

void EnginePool::update_failed(int64_t id, const std::shared_ptr<EngineClient>& client,
                               const Status& s) {
  if (s.ok()) return;
  // An engine that cannot take the update must not serve the old weights: mark it dead
  // (restarted and prepared, when the pool started it).
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = *engines_[id];
  if (e.client == client) mark_dead(e, "weight update failed: " + s.message());
}

Status EnginePool::update_all(const std::function<Status(EngineClient&)>& fn) {
  std::lock_guard<std::mutex> sync(sync_mu_);
  for (auto& [id, client] : ready_clients()) update_failed(id, client, fn(*client));
  return Status::Ok();
}

Status EnginePool::update_all_group(const GroupUpdate& fn) {
  std::lock_guard<std::mutex> sync(sync_mu_);
  const auto ready = ready_clients();
  if (ready.empty()) return Status::Ok();
  std::vector<std::shared_ptr<EngineClient>> clients;
  for (const auto& r : ready) clients.push_back(r.second);
  const std::vector<Status> st = fn(clients);
  if (st.size() != ready.size())
    return Status::Error("a group weight update returned " + std::to_string(st.size()) +
                         " statuses for " + std::to_string(ready.size()) + " engines");
  for (size_t i = 0; i < ready.size(); ++i) update_failed(ready[i].first, ready[i].second, st[i]);
  return Status::Ok();
}

void EnginePool::cancel_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : engines_)
    if (e->client) e->client->cancel_all();
  cv_.notify_all();
}

std::vector<EngineInfo> EnginePool::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<EngineInfo> out;
  for (const auto& e : engines_) {
    EngineInfo i;
    i.id = e->id;
    i.address = e->client ? e->client->address().http() : "";
    i.state = state_name(static_cast<int>(e->state));
    i.pid = e->process ? e->process->pid() : 0;
    i.restarts = e->restarts;
    i.in_flight = e->in_flight;
    out.push_back(std::move(i));
  }
  return out;
}

PoolCounters EnginePool::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

SpecCounters EnginePool::spec_counters() const {
  SpecCounters sum;
  for (const auto& [id, client] : ready_clients()) {
    auto c = client->spec_counters();
    if (!c.ok()) continue;
    sum.verifies += c->verifies;
    sum.draft_tokens += c->draft_tokens;
    sum.accepted_tokens += c->accepted_tokens;
    sum.emitted_tokens += c->emitted_tokens;
  }
  return sum;
}

void EnginePool::stop() {
  if (stopping_.exchange(true)) return;
  cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  cancel_all();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : engines_)
    if (e->process) e->process->terminate();
}

}  // namespace miles::controller
