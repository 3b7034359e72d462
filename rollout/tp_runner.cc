// Rank 0 of a tensor-parallel engine (tp_engine.h): the group that sends its followers commands and
// the ModelRunner that runs each forward on rank 0's shard in lockstep with them.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "miles/check.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/rollout/tp_engine.h"
#include "miles/tensor_parallel.h"
#include "rollout/paged_kv_cache.h"
#include "rollout/tp_wire.h"

namespace miles::rollout {

using tp_wire::Op;

// The followers, the command lock and the heartbeat. Shared by every runner of one engine (a
// weight update makes a new runner over the same group); the last one to go stops the followers.
class TpEngineGroup {
 public:
  explicit TpEngineGroup(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {
    heartbeat_ = std::thread([this] { beat(); });
  }
  ~TpEngineGroup() {
    {
      std::lock_guard<std::mutex> l(beat_mu_);
      stopping_ = true;
    }
    beat_cv_.notify_all();
    heartbeat_.join();
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_) (void)command(Op::kStop, 0, {});
  }

  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mu_); }
  Communicator& comm() const { return *comm_; }
  int size() const { return comm_->size(); }
  int64_t next_generation() { return ++generation_; }
  std::vector<tp_wire::BlockCopy>& pending_copies() { return copies_; }

  // Sends `op` to every follower (lock held). After any error the group is broken: every later
  // command fails at once with the first error.
  Status command(Op op, int64_t generation, const std::vector<uint8_t>& payload) {
    for (int r = 1; r < comm_->size(); ++r)
      MILES_RETURN_IF_ERROR(command_to(r, op, generation, payload));
    return Status::Ok();
  }
  Status command_to(int rank, Op op, int64_t generation, const std::vector<uint8_t>& payload) {
    if (broken_) return broken_status_;
    tp_wire::Header h;
    h.op = op;
    h.generation = generation;
    h.payload_bytes = static_cast<int64_t>(payload.size());
    const size_t inline_bytes = std::min(payload.size(), tp_wire::kInlineBytes);
    std::vector<uint8_t> message(tp_wire::kCommandBytes, 0);
    std::memcpy(message.data(), &h, sizeof(h));
    if (inline_bytes > 0) std::memcpy(message.data() + sizeof(h), payload.data(), inline_bytes);
    Status s = comm_->send(message.data(), message.size(), rank, tp_wire::kHeaderTag);
    if (s.ok() && payload.size() > inline_bytes)
      s = comm_->send(payload.data() + inline_bytes, payload.size() - inline_bytes, rank,
                      tp_wire::kPayloadTag);
    if (!s.ok())
      return fail(std::string(tp_wire::op_name(op)) + " to rank " + std::to_string(rank) + ": " +
                  s.message());
    last_command_ = std::chrono::steady_clock::now().time_since_epoch().count();
    return Status::Ok();
  }
  // Raw bytes after a command (a load's values).
  Status send_values(int rank, std::span<const float> values) {
    if (broken_) return broken_status_;
    if (Status s = comm_->send(values.data(), values.size_bytes(), rank, tp_wire::kPayloadTag);
        !s.ok())
      return fail("load values to rank " + std::to_string(rank) + ": " + s.message());
    return Status::Ok();
  }

  // Every rank's status of the step just done; the first error (naming its rank), or Ok.
  Status gather_status(const Status& mine, const char* what) {
    if (broken_) return broken_status_;
    const tp_wire::StatusSlot slot = tp_wire::to_slot(mine);
    std::vector<tp_wire::StatusSlot> all(comm_->size());
    if (Status s = comm_->allgather(&slot, sizeof(slot), all.data()); !s.ok())
      return fail(std::string(what) + ": " + s.message());
    for (int r = 0; r < comm_->size(); ++r)
      if (all[r].code != 0)
        return Status::Error(std::string(what) + " on tensor-parallel rank " + std::to_string(r) +
                             ": " + all[r].message);
    return Status::Ok();
  }

  // Marks the group unusable (a follower is gone or out of step) and says why.
  Status fail(const std::string& why) {
    broken_ = true;
    broken_status_ = Status::Error("tensor-parallel engine group " + comm_->name() + ": " + why);
    spdlog::error("miles serve: {}", broken_status_.message());
    return broken_status_;
  }

 private:
  // A ping after 5 s without a command, so that followers waiting (bounded by their timeout) for
  // the next one know rank 0 is alive.
  void beat() {
    using namespace std::chrono;
    std::unique_lock<std::mutex> l(beat_mu_);
    while (!beat_cv_.wait_for(l, seconds(1), [&] { return stopping_; })) {
      const auto last = steady_clock::duration(last_command_.load());
      if (steady_clock::now().time_since_epoch() - last < seconds(5)) continue;
      std::lock_guard<std::mutex> c(mu_);
      (void)command(Op::kPing, 0, {});
    }
  }

  std::unique_ptr<Communicator> comm_;
  std::mutex mu_;  // one command (with its collectives) at a time; guards the fields below
  bool broken_ = false;
  Status broken_status_;
  int64_t generation_ = 0;
  std::vector<tp_wire::BlockCopy> copies_;
  std::atomic<int64_t> last_command_{std::chrono::steady_clock::now().time_since_epoch().count()};
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

namespace {

class TpModelRunner final : public ModelRunner {
 public:
  TpModelRunner(std::shared_ptr<TpEngineGroup> group, ModelConfig full, ModelConfig local,
                ThreadPool* pool)
      : group_(std::move(group)), full_(std::move(full)), local_(std::move(local)), pool_(pool) {
    tp_.comm = &group_->comm();
    tp_.vocab_begin = 0;  // rank 0 holds the first vocabulary rows
    tp_.full_vocab = full_.vocab_size;
  }
  ~TpModelRunner() override {
    if (generation_ == 0) return;
    auto l = group_->lock();
    (void)group_->command(Op::kDrop, generation_, {});
  }

  // Slices `weights`, sends every follower its shard of a new generation, builds rank 0's.
  Status load(const TensorMap& weights);

  const ModelConfig& config() const override { return full_; }
  int64_t kv_dim() const override { return local_.kv_dim(); }
  ThreadPool* thread_pool() const override { return pool_; }
  void copied_kv_prefix(int32_t src, int32_t dst, int64_t positions) override {
    auto l = group_->lock();
    group_->pending_copies().push_back({src, dst, positions});
  }
  Result<std::unique_ptr<ModelRunner>> with_weights(const TensorMap& weights) const override {
    auto next = std::make_unique<TpModelRunner>(group_, full_, local_, pool_);
    MILES_RETURN_IF_ERROR(next->load(weights));
    return std::unique_ptr<ModelRunner>(std::move(next));
  }
  Result<ForwardOutput> forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                KvStore& kv, const ForwardOptions& options) override;

  // Takes generation `generation` (every follower holds its shard) with rank 0's shard `model`.
  void adopt(int64_t generation, std::unique_ptr<Model> model) {
    generation_ = generation;
    model_ = std::move(model);
  }
  const std::shared_ptr<TpEngineGroup>& group() const { return group_; }
  const ModelConfig& local() const { return local_; }
  ThreadPool* pool() const { return pool_; }

 private:
  std::shared_ptr<TpEngineGroup> group_;
  ModelConfig full_, local_;
  ThreadPool* pool_;
  TensorParallel tp_;
  int64_t generation_ = 0;  // 0: nothing loaded
  std::unique_ptr<Model> model_;
};

// The shard layout and its description (names and shapes, the load command's payload) are the
// same for every rank: made once; one buffer holds each rank's slice in turn.
Status TpModelRunner::load(const TensorMap& weights) {
  MILES_ASSIGN_OR_RETURN(FlatTensors full, FlatTensors::from_tensor_map(
                                               ParamLayout::for_model(full_, &weights), weights));
  const TensorMap full_view = full.as_tensor_map();
  FlatTensors shard(ParamLayout::for_model(local_, &full_view));
  tp_wire::Writer w;
  w.put<int64_t>(static_cast<int64_t>(shard.layout().specs().size()));
  for (const ParamSpec& p : shard.layout().specs()) {
    w.put_string(p.name);
    w.put_array(p.shape.data(), static_cast<int64_t>(p.shape.size()));
  }
  auto l = group_->lock();
  generation_ = group_->next_generation();
  for (int r = 1; r < group_->size(); ++r) {
    tensor_parallel::slice(full, shard, r, group_->size());
    MILES_RETURN_IF_ERROR(group_->command_to(r, Op::kLoad, generation_, w.bytes()));
    MILES_RETURN_IF_ERROR(group_->send_values(r, shard.all()));
  }
  tensor_parallel::slice(full, shard, 0, group_->size());
  auto model = Model::from_weights(local_, shard.as_tensor_map());
  MILES_RETURN_IF_ERROR(
      group_->gather_status(model.ok() ? Status::Ok() : model.status(), "loading weights"));
  model_ = std::move(model).value();
  return Status::Ok();
}

Result<ForwardOutput> TpModelRunner::forward(std::span<const int32_t> tokens,
                                             std::span<const SeqSpan> seqs, KvStore& kv,
                                             const ForwardOptions& options) {
  if (!options.forced_experts.empty() || options.tape || options.layer_begin != 0 ||
      options.layer_end >= 0)
    return Status::Error("a tensor-parallel engine runs whole-model inference forwards only");
  auto* paged = dynamic_cast<PagedKvCache*>(&kv);
  MILES_CHECK(paged != nullptr, "a tensor-parallel engine runs over the engine's paged KV cache");
  auto l = group_->lock();
  tp_wire::ForwardCommand c;
  c.copies.swap(group_->pending_copies());
  c.tokens.assign(tokens.begin(), tokens.end());
  c.seqs.assign(seqs.begin(), seqs.end());
  for (const SeqSpan& q : seqs) c.tables.push_back(paged->table(q.kv_slot));
  c.all_logits = options.all_logits;
  c.last_rows.assign(options.last_rows.begin(), options.last_rows.end());
  c.return_experts = options.return_experts;
  // No status round before the forward: a follower that cannot run it (an invariant broken on its
  // side) leaves the group, and this rank's next collective fails naming it.
  MILES_RETURN_IF_ERROR(group_->command(Op::kForward, generation_, c.encode()));
  ForwardOptions o = options;
  o.tp = &tp_;
  auto out = model_->forward(tokens, seqs, kv, o, pool_);
  if (!out.ok()) return group_->fail("forward on rank 0: " + out.message());
  // Vocabulary-parallel logits: rank r holds columns [r * vl, (r + 1) * vl) of every row.
  const int n = group_->size();
  const int64_t rows = out->rows, vl = out->vocab;
  std::vector<float> all(static_cast<size_t>(n * rows * vl));
  if (Status s = group_->comm().allgather(out->logits.data(), out->logits.size() * sizeof(float),
                                          all.data());
      !s.ok())
    return group_->fail("gathering logits: " + s.message());
  std::vector<float> logits(static_cast<size_t>(rows * vl * n));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::copy_n(all.data() + (r * rows + i) * vl, vl, logits.data() + i * vl * n + r * vl);
  out->logits = std::move(logits);
  out->vocab = vl * n;
  return out;
}

}  // namespace

TensorMap ShardWeights::view() const {
  TensorMap m;
  for (const auto& [name, values] : tensors)
    m.insert(name, Tensor::view(DType::kF32, shapes.at(name), values.data(), nullptr),
             "a received shard");
  return m;
}

Result<std::shared_ptr<TpShardIntake>> TpShardIntake::of(const ModelRunner& runner) {
  const auto* tp = dynamic_cast<const TpModelRunner*>(&runner);
  if (!tp) return Status::Error("the engine is not tensor-parallel");
  return std::make_shared<TpShardIntake>(tp->group(), tp->config(), tp->local(), tp->pool());
}

int TpShardIntake::size() const { return group_->size(); }
bool TpShardIntake::followers_on_host() const { return group_->comm().shared_memory(); }

Status TpShardIntake::join_followers(const std::vector<uint8_t>& request) {
  auto l = group_->lock();
  return group_->command(Op::kJoinIntake, 0, request);
}

Result<TpShardIntake::Received> TpShardIntake::receive(
    const std::vector<uint8_t>& request,
    const std::function<Result<ShardWeights>()>& receive_mine) {
  int64_t generation = 0;
  {
    auto l = group_->lock();
    generation = group_->next_generation();
    MILES_RETURN_IF_ERROR(group_->command(Op::kIntake, generation, request));
  }
  // Forwards go on (under the lock, command by command) while every rank receives.
  Result<ShardWeights> mine = receive_mine();
  auto l = group_->lock();
  const int64_t count = static_cast<int64_t>(ParamLayout::for_model(local_)->specs().size());
  tp_wire::Writer w;
  w.put<int64_t>(count);
  MILES_RETURN_IF_ERROR(group_->command(Op::kAdopt, generation, w.bytes()));
  Status built = mine.status();
  if (built.ok() && static_cast<int64_t>(mine->checksums.size()) != count)
    built = Status::Error("rank 0 received " + std::to_string(mine->checksums.size()) +
                          " tensors of " + std::to_string(count));
  std::unique_ptr<Model> model;
  if (built.ok()) {
    auto m = Model::from_weights(local_, mine->view());
    built = m.status();
    if (m.ok()) model = std::move(m).value();
  }
  const Status all = group_->gather_status(built, "receiving weights");
  // The checksum all-gather follows the status round whatever it said (every follower takes part).
  const size_t per_rank = static_cast<size_t>(count) * tp_wire::kChecksumBytes;
  std::vector<char> sums = tp_wire::checksum_slots(
      built.ok() ? mine->checksums : std::map<std::string, std::string>{}, count);
  std::vector<char> gathered(per_rank * group_->size());
  if (Status s = group_->comm().allgather(sums.data(), sums.size(), gathered.data()); !s.ok())
    return group_->fail("gathering weight checksums: " + s.message());
  if (!all.ok()) {
    (void)group_->command(Op::kDrop, generation, {});  // followers that built it let it go
    return all;
  }
  Received out;
  size_t i = 0;
  for (const auto& [name, sum] : mine->checksums) {
    std::vector<std::string>& per = out.shard_checksums[name];
    for (int r = 0; r < group_->size(); ++r)
      per.emplace_back(gathered.data() + r * per_rank + tp_wire::kChecksumBytes * i,
                       tp_wire::kChecksumBytes);
    ++i;
  }
  auto runner = std::make_unique<TpModelRunner>(group_, full_, local_, pool_);
  runner->adopt(generation, std::move(model));
  out.runner = std::move(runner);
  return out;
}

Result<std::unique_ptr<ModelRunner>> make_tp_model_runner(std::unique_ptr<Communicator> comm,
                                                          const ModelConfig& full,
                                                          const TensorMap& weights,
                                                          const EngineOptions& kv_geometry,
                                                          ThreadPool* pool) {
  MILES_CHECK(comm && comm->rank() == 0, "make_tp_model_runner runs on rank 0");
  if (comm->size() < 2) return Status::Error("a tensor-parallel engine needs at least 2 ranks");
  MILES_ASSIGN_OR_RETURN(ModelConfig local, tensor_parallel::local_config(full, comm->size()));
  auto group = std::make_shared<TpEngineGroup>(std::move(comm));
  {
    auto l = group->lock();
    tp_wire::Writer w;
    w.put_string(model_config_to_hf_json(full));
    w.put<int64_t>(kv_geometry.num_blocks);
    w.put<int64_t>(kv_geometry.block_tokens);
    MILES_RETURN_IF_ERROR(group->command(Op::kInit, 0, w.bytes()));
    MILES_RETURN_IF_ERROR(group->gather_status(Status::Ok(), "init"));
  }
  auto runner = std::make_unique<TpModelRunner>(group, full, local, pool);
  MILES_RETURN_IF_ERROR(runner->load(weights));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace miles::rollout
