// Ranks 1..n-1 of a tensor-parallel engine (tp_engine.h): a loop over rank 0's commands, holding
// this rank's shard of each live weight generation and of every KV block.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "miles/model.h"
#include "miles/rollout/tp_engine.h"
#include "miles/tensor_parallel.h"
#include "rollout/block_pool.h"
#include "rollout/tp_wire.h"

namespace miles::rollout {

using tp_wire::Op;

namespace {

// The KV of this rank's heads, addressed through the block tables rank 0 sends with each forward.
class TableKvStore final : public KvStore {
 public:
  explicit TableKvStore(BlockPool& pool) : pool_(pool) {}
  int64_t block_tokens() const override { return pool_.block_tokens(); }
  Status reserve(int32_t slot, int64_t n_positions) override {
    auto it = tables_.find(slot);
    const int64_t have = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
    if (have * pool_.block_tokens() < n_positions)
      return Status::Error("slot " + std::to_string(slot) + ": rank 0's block table holds " +
                           std::to_string(have) + " blocks, too few for " +
                           std::to_string(n_positions) + " positions");
    return Status::Ok();
  }
  void blocks(int32_t slot, int64_t layer, std::vector<float*>& k,
              std::vector<float*>& v) override {
    k.clear();
    v.clear();
    for (int32_t b : tables_.at(slot)) {
      k.push_back(pool_.keys(b, layer));
      v.push_back(pool_.values(b, layer));
    }
  }
  // This forward's tables (only the batch's slots are ever read).
  Status set_tables(const tp_wire::ForwardCommand& c) {
    tables_.clear();
    for (size_t i = 0; i < c.seqs.size(); ++i) {
      for (int32_t b : c.tables[i])
        if (b < 0 || b >= pool_.num_blocks())
          return Status::Error("block id " + std::to_string(b) + " outside the pool of " +
                               std::to_string(pool_.num_blocks()));
      tables_[c.seqs[i].kv_slot] = c.tables[i];
    }
    return Status::Ok();
  }

 private:
  BlockPool& pool_;
  std::map<int32_t, std::vector<int32_t>> tables_;
};

class Follower {
 public:
  Follower(Communicator& comm, ThreadPool* pool, FollowerIntake* intake)
      : comm_(comm), pool_(pool), intake_(intake) {}
  ~Follower() {
    if (intake_thread_.joinable()) intake_thread_.join();
  }
  Status run();

 private:
  Status receive(tp_wire::Header& h, std::vector<uint8_t>& payload);
  Status init(const std::vector<uint8_t>& payload);
  Status load(int64_t generation, const std::vector<uint8_t>& meta);
  Status forward(int64_t generation, const std::vector<uint8_t>& payload);
  void start_intake(int64_t generation, const std::vector<uint8_t>& request);
  Status adopt(int64_t generation, const std::vector<uint8_t>& payload);
  // This rank's status into the step's all-gather; a transport error ends the loop.
  Status report(const Status& mine) {
    const tp_wire::StatusSlot slot = tp_wire::to_slot(mine);
    std::vector<tp_wire::StatusSlot> all(comm_.size());
    if (!mine.ok()) spdlog::error("miles tp rank {}: {}", comm_.rank(), mine.message());
    return comm_.allgather(&slot, sizeof(slot), all.data());
  }

  Communicator& comm_;
  ThreadPool* pool_;
  ModelConfig full_, local_;
  std::unique_ptr<BlockPool> blocks_;
  std::unique_ptr<TableKvStore> kv_;
  std::map<int64_t, std::unique_ptr<Model>> models_;  // by weight generation
  TensorParallel tp_;
  // Direct intake: the receive of `intake_generation_` runs on `intake_thread_` into
  // `intake_result_` while the loop goes on serving forwards; adopt() joins it.
  FollowerIntake* intake_;
  std::thread intake_thread_;
  int64_t intake_generation_ = 0;
  Result<ShardWeights> intake_result_ = Status::Error("no weight intake was started");
};

Status Follower::receive(tp_wire::Header& h, std::vector<uint8_t>& payload) {
  std::vector<uint8_t> message(tp_wire::kCommandBytes);
  MILES_RETURN_IF_ERROR(comm_.recv(message.data(), message.size(), 0, tp_wire::kHeaderTag));
  std::memcpy(&h, message.data(), sizeof(h));
  if (h.magic != tp_wire::Header{}.magic || h.payload_bytes < 0 || h.payload_bytes > (1ll << 34))
    return Status::Error("garbled command header from rank 0");
  payload.resize(static_cast<size_t>(h.payload_bytes));
  const size_t inline_bytes = std::min(payload.size(), tp_wire::kInlineBytes);
  if (inline_bytes > 0) std::memcpy(payload.data(), message.data() + sizeof(h), inline_bytes);
  if (payload.size() > inline_bytes)
    MILES_RETURN_IF_ERROR(comm_.recv(payload.data() + inline_bytes, payload.size() - inline_bytes,
                                     0, tp_wire::kPayloadTag));
  return Status::Ok();
}

Status Follower::run() {
  for (;;) {
    tp_wire::Header h;
    std::vector<uint8_t> payload;
    MILES_RETURN_IF_ERROR(receive(h, payload));
    Status s;
    switch (h.op) {
      case Op::kInit:
        s = report(init(payload));
        break;
      case Op::kLoad:
        s = load(h.generation, payload);
        break;
      case Op::kForward:
        s = forward(h.generation, payload);
        break;
      case Op::kDrop:
        models_.erase(h.generation);
        break;
      case Op::kJoinIntake:
        if (intake_ && kv_) intake_->join(payload, comm_.rank(), full_);
        break;
      case Op::kIntake:
        start_intake(h.generation, payload);
        break;
      case Op::kAdopt:
        s = adopt(h.generation, payload);
        break;
      case Op::kPing:
        break;
      case Op::kStop:
        return Status::Ok();
      default:
        return Status::Error("unknown command from rank 0");
    }
    if (!s.ok()) return Status::Error(std::string(tp_wire::op_name(h.op)) + ": " + s.message());
  }
}

Status Follower::init(const std::vector<uint8_t>& payload) {
  tp_wire::Reader r(payload);
  std::string json;
  int64_t num_blocks = 0, block_tokens = 0;
  MILES_RETURN_IF_ERROR(r.get_string(json));
  MILES_RETURN_IF_ERROR(r.get(num_blocks));
  MILES_RETURN_IF_ERROR(r.get(block_tokens));
  MILES_ASSIGN_OR_RETURN(full_, parse_model_config(json, "rank 0's model config"));
  MILES_ASSIGN_OR_RETURN(local_, tensor_parallel::local_config(full_, comm_.size()));
  if (num_blocks <= 0 || block_tokens <= 0) return Status::Error("bad KV geometry from rank 0");
  blocks_ =
      std::make_unique<BlockPool>(num_blocks, block_tokens, local_.num_layers, local_.kv_dim());
  kv_ = std::make_unique<TableKvStore>(*blocks_);
  tp_ = TensorParallel{&comm_, comm_.rank() * local_.vocab_size, full_.vocab_size};
  return Status::Ok();
}

Status Follower::load(int64_t generation, const std::vector<uint8_t>& meta) {
  // The values follow the command whatever happens, so read them before anything can fail.
  tp_wire::Reader r(meta);
  int64_t n = 0;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  int64_t total = 0;
  Status parsed = r.get(n);
  for (int64_t i = 0; parsed.ok() && i < n; ++i) {
    names.emplace_back();
    shapes.emplace_back();
    parsed = r.get_string(names.back());
    if (parsed.ok()) parsed = r.get_array(shapes.back());
    int64_t numel = 1;
    for (int64_t d : shapes.back()) numel *= d;
    total += numel;
  }
  if (!parsed.ok()) return parsed;  // the stream is out of step: end the loop
  std::vector<float> values(static_cast<size_t>(total));
  MILES_RETURN_IF_ERROR(
      comm_.recv(values.data(), values.size() * sizeof(float), 0, tp_wire::kPayloadTag));
  Status built = kv_ ? Status::Ok() : Status::Error("load before init");
  if (built.ok()) {
    TensorMap map;
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      int64_t numel = 1;
      for (int64_t d : shapes[i]) numel *= d;
      map.insert(names[i], Tensor::view(DType::kF32, shapes[i], values.data() + at, nullptr),
                 "rank 0's shard");
      at += numel;
    }
    auto model = Model::from_weights(local_, map);
    if (model.ok()) models_[generation] = std::move(model).value();
    built = model.status();
  }
  return report(built);
}

void Follower::start_intake(int64_t generation, const std::vector<uint8_t>& request) {
  if (intake_thread_.joinable()) intake_thread_.join();  // a receive never adopted: dropped
  intake_generation_ = generation;
  if (!intake_ || !kv_) {
    intake_result_ = Status::Error(kv_ ? "this follower was started without a weight intake"
                                       : "weight intake before init");
    return;
  }
  intake_thread_ =
      std::thread([this, request] { intake_result_ = intake_->receive(request, comm_.rank()); });
}

// Builds the received shard as `generation`, then two all-gathers: every rank's status, and every
// rank's checksums (payload: how many tensors; each rank's in name order, blank when it has none).
Status Follower::adopt(int64_t generation, const std::vector<uint8_t>& payload) {
  if (intake_thread_.joinable()) intake_thread_.join();
  tp_wire::Reader r(payload);
  int64_t count = 0;
  MILES_RETURN_IF_ERROR(r.get(count));
  if (count < 0 || count > (1 << 20)) return Status::Error("garbled adopt command");
  Status built = intake_result_.status();
  if (built.ok() && generation != intake_generation_)
    built = Status::Error("adopt of generation " + std::to_string(generation) +
                          " after an intake of " + std::to_string(intake_generation_));
  if (built.ok() && static_cast<int64_t>(intake_result_->checksums.size()) != count)
    built = Status::Error("received " + std::to_string(intake_result_->checksums.size()) +
                          " tensors, rank 0 expects " + std::to_string(count));
  if (built.ok()) {
    auto model = Model::from_weights(local_, intake_result_->view());
    if (model.ok()) models_[generation] = std::move(model).value();
    built = model.status();
  }
  const std::vector<char> mine = tp_wire::checksum_slots(
      built.ok() ? intake_result_->checksums : std::map<std::string, std::string>{}, count);
  intake_result_ = Status::Error("no weight intake was started");  // the shard is built or gone
  MILES_RETURN_IF_ERROR(report(built));
  std::vector<char> all(mine.size() * comm_.size());
  return comm_.allgather(mine.data(), mine.size(), all.data());
}

Status Follower::forward(int64_t generation, const std::vector<uint8_t>& payload) {
  auto c = tp_wire::ForwardCommand::decode(payload);
  auto it = models_.find(generation);
  Status ready = c.status();
  if (ready.ok() && it == models_.end())
    ready = Status::Error("no weights of generation " + std::to_string(generation));
  if (ready.ok()) {
    for (const tp_wire::BlockCopy& b : c->copies) {
      if (b.src < 0 || b.dst < 0 || b.src >= blocks_->num_blocks() ||
          b.dst >= blocks_->num_blocks() || b.positions < 0 ||
          b.positions > blocks_->block_tokens()) {
        ready = Status::Error("a block copy outside the pool");
        break;
      }
      blocks_->copy_prefix(b.src, b.dst, b.positions);
    }
    if (ready.ok()) ready = kv_->set_tables(*c);
  }
  if (!ready.ok())
    return ready;  // out of step with rank 0: leave the group (rank 0's next
                   // collective fails)
  ForwardOptions o;
  o.all_logits = c->all_logits;
  o.last_rows = c->last_rows;
  o.return_experts = c->return_experts;
  o.tp = &tp_;
  auto out = it->second->forward(c->tokens, c->seqs, *kv_, o, pool_);
  if (!out.ok()) return out.status();  // out of step with rank 0's collectives: end the loop
  std::vector<float> all(static_cast<size_t>(comm_.size()) * out->logits.size());
  return comm_.allgather(out->logits.data(), out->logits.size() * sizeof(float), all.data());
}

}  // namespace

Status run_tp_engine_follower(Communicator& comm, ThreadPool* pool, FollowerIntake* intake) {
  if (comm.rank() == 0) return Status::Error("rank 0 runs the engine, not the follower loop");
  return Follower(comm, pool, intake).run();
}

}  // namespace miles::rollout
