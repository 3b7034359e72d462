// The broadcast transport: per bucket, a header (version, per-tensor checksums) then the bytes,
// from the bucket's stage leader to every member of the group (weight_sync.h).
#include <cstring>

#include "miles/comm.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/shard_pieces.h"

namespace miles {

namespace {
constexpr size_t kHex = 32;  // xxh3-128 as hex
}

std::string transfer_plan_digest(const TransferPlan& plan) {
  std::string text;
  for (const Bucket& b : plan.buckets) {
    text += "bucket " + std::to_string(b.stage) + " " + std::to_string(b.sender) + " " +
            std::to_string(b.expert) + " " + std::to_string(b.bytes) + "\n";
    for (const PlannedTensor& t : b.tensors) {
      text += t.name;
      for (int64_t d : t.shape) text += " " + std::to_string(d);
      text += " @" + std::to_string(t.offset) + "+" + std::to_string(t.bytes) + "\n";
    }
  }
  return xxh3_128_hex(text.data(), text.size());
}

Status broadcast_weights(Communicator& group, const TransferPlan& plan, int64_t version,
                         const TensorSource& source, ReceivedWeights* out,
                         const BroadcastOptions& options) {
  if (out && options.shard_size > 1)
    MILES_RETURN_IF_ERROR(shard_pieces::check_splits(plan, {options.shard_size}));
  if (out) {
    out->version = version;
    out->tensors.clear();
    out->checksums.clear();
    out->shapes.clear();
  }
  std::vector<char> header, data;
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    const int root = options.sender_group_rank(b.sender);
    const std::string at =
        "weight version " + std::to_string(version) + ", bucket " + std::to_string(bi) + ": ";
    if (root < 0 || root >= group.size())
      return Status::Error(at + "sender world rank " + std::to_string(b.sender) +
                           " is not in the group");
    const bool sending = group.rank() == root;
    header.assign(sizeof(int64_t) + kHex * b.tensors.size(), 0);
    data.assign(static_cast<size_t>(b.bytes), 0);
    if (sending) {
      if (!source) return Status::Error(at + "this rank sends it but has no tensor source");
      std::memcpy(header.data(), &version, sizeof(version));
      for (size_t i = 0; i < b.tensors.size(); ++i) {
        const PlannedTensor& t = b.tensors[i];
        std::span<const float> v = source(t.name);
        if (static_cast<int64_t>(v.size_bytes()) != t.bytes)
          return Status::Error(at + "the source's " + t.name + " has " +
                               std::to_string(v.size_bytes()) + " bytes, the plan " +
                               std::to_string(t.bytes));
        std::memcpy(data.data() + t.offset, v.data(), t.bytes);
        std::string sum = options.known_xxh3 ? options.known_xxh3(t.name) : "";
        if (sum.size() != kHex) sum = xxh3_128_hex(v.data(), t.bytes);
        std::memcpy(header.data() + sizeof(int64_t) + i * kHex, sum.data(), kHex);
      }
    }
    Status s = group.broadcast(header.data(), header.size(), root);
    if (s.ok() && !data.empty()) s = group.broadcast(data.data(), data.size(), root);
    if (!s.ok()) return s.with_context(at.substr(0, at.size() - 2));
    int64_t got_version = 0;
    std::memcpy(&got_version, header.data(), sizeof(got_version));
    if (got_version != version)
      return Status::Error(at + "the sender sent version " + std::to_string(got_version));
    if (!out || sending) continue;
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      const PlannedTensor& t = b.tensors[i];
      const std::string sum(header.data() + sizeof(int64_t) + i * kHex, kHex);
      if (options.shard_size > 1) {  // check the whole tensor now: only the shard is kept
        const float* full = reinterpret_cast<const float*>(data.data() + t.offset);
        if (xxh3_128_hex(full, t.bytes) != sum)
          return Status::Error(at + "checksum mismatch for " + t.name);
        std::vector<float> shard =
            shard_pieces::shard_of(t, full, options.shard_rank, options.shard_size);
        out->checksums[t.name] = xxh3_128_hex(shard.data(), shard.size() * sizeof(float));
        out->shapes[t.name] = shard_pieces::local_shape(t, options.shard_size);
        out->tensors[t.name] = std::move(shard);
        continue;
      }
      std::vector<float>& dst = out->tensors[t.name];
      dst.resize(static_cast<size_t>(t.bytes / sizeof(float)));
      std::memcpy(dst.data(), data.data() + t.offset, t.bytes);
      out->shapes[t.name] = t.shape;
      out->checksums[t.name] = sum;
    }
  }
  return Status::Ok();
}

Status send_stage_weights(Communicator& group, const TransferPlan& plan, int stage, int64_t version,
                          const TensorSource& source,
                          std::function<std::string(const std::string&)> known_xxh3) {
  if (group.rank() != 0)
    return Status::Error("stage " + std::to_string(stage) + ": the sender is rank 0 of its group");
  BroadcastOptions bo;
  bo.sender_group_rank = [](int) { return 0; };
  bo.known_xxh3 = std::move(known_xxh3);
  return broadcast_weights(group, stage_plan(plan, stage), version, source, nullptr, bo)
      .with_context("stage " + std::to_string(stage));
}

Status receive_stage_weights(std::span<Communicator* const> groups, const TransferPlan& plan,
                             int64_t version, ReceivedWeights* out, int shard_rank,
                             int shard_size) {
  const int stages = plan_stages(plan);
  if (static_cast<int>(groups.size()) != stages)
    return Status::Error("the plan has " + std::to_string(stages) + " pipeline stages, " +
                         std::to_string(groups.size()) + " groups were given");
  out->version = version;
  out->tensors.clear();
  out->checksums.clear();
  out->shapes.clear();
  for (int s = 0; s < stages; ++s) {
    ReceivedWeights part;
    BroadcastOptions bo;
    bo.sender_group_rank = [](int) { return 0; };
    bo.shard_rank = shard_rank;
    bo.shard_size = shard_size;
    MILES_RETURN_IF_ERROR(broadcast_weights(*groups[s], stage_plan(plan, s), version, {}, &part, bo)
                              .with_context("stage " + std::to_string(s)));
    for (auto& [name, t] : part.tensors) out->tensors[name] = std::move(t);
    for (auto& [name, shape] : part.shapes) out->shapes[name] = std::move(shape);
    for (auto& [name, sum] : part.checksums) out->checksums[name] = std::move(sum);
  }
  return Status::Ok();
}

}  // namespace miles
