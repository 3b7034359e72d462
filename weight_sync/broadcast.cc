// The broadcast transport: per bucket, the version, every tensor's bytes, then the per-tensor
// checksums, from the bucket's stage leader to every member of the group (weight_sync.h).
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "miles/comm.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/shard_pieces.h"
#include "weight_sync/xxh3.h"

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

namespace {

// The sender's side of one bucket: every tensor's source, checked against the plan before anything
// goes out, so that a bad source fails before the receivers see a byte of the bucket.
Result<std::vector<std::span<const float>>> bucket_sources(const Bucket& b,
                                                           const TensorSource& source,
                                                           const std::string& at) {
  if (!source) return Status::Error(at + "this rank sends it but has no tensor source");
  std::vector<std::span<const float>> out;
  for (const PlannedTensor& t : b.tensors) {
    std::span<const float> v = source(t.name);
    if (static_cast<int64_t>(v.size_bytes()) != t.bytes)
      return Status::Error(at + "the source's " + t.name + " has " +
                           std::to_string(v.size_bytes()) + " bytes, the plan " +
                           std::to_string(t.bytes));
    out.push_back(v);
  }
  return out;
}

// How a rank takes part in one bucket's broadcast.
struct BucketRole {
  int root;
  bool sending;
  bool staged;  // a receiver that keeps a shard, or nothing: one tensor at a time through `whole`
};

// The bucket's tensors as one stream (Communicator::broadcast_buffers), each straight into its
// destination (a staged receiver: one tensor at a time, its shard kept). Each tensor is hashed
// once into sums[i] unless the sender knows its sum: on its way through the transport's buffer,
// or after it.
Status broadcast_tensors(Communicator& group, const Bucket& b, const BucketRole& role,
                         const std::vector<std::span<const float>>& sources, ReceivedWeights* out,
                         const BroadcastOptions& options, std::vector<float>& whole,
                         std::vector<std::string>& sums) {
  for (size_t first = 0; first < b.tensors.size();) {
    const size_t last = role.staged ? first + 1 : b.tensors.size();
    std::vector<Communicator::Buffer> bufs;
    std::vector<weight_sync_detail::Xxh3Stream> hashes(last - first);
    for (size_t i = first; i < last; ++i) {
      const PlannedTensor& t = b.tensors[i];
      const size_t count = static_cast<size_t>(t.bytes) / sizeof(float);
      float* dst = nullptr;
      if (role.sending) {
        sums[i] = options.known_xxh3 ? options.known_xxh3(t.name) : "";
        dst = const_cast<float*>(sources[i].data());  // the root's buffer is only read
      } else if (!role.staged) {
        std::vector<float>& v = out->tensors[t.name];
        v.resize(count);
        dst = v.data();
      } else {
        whole.resize(count);
        dst = whole.data();
      }
      bufs.push_back({dst, static_cast<size_t>(t.bytes)});
    }
    const auto hash = [&](size_t j) { return sums[first + j].size() != kHex; };
    Communicator::BufferHooks hooks;
    hooks.copy = [&](size_t j, void* to, const void* from, size_t, size_t n) {
      if (hash(j)) {
        hashes[j].copy(to, from, n);
      } else {
        std::memcpy(to, from, n);
      }
    };
    hooks.arrived = [&](size_t j, size_t off, size_t n) {
      if (hash(j) && hashes[j].bytes() < off + n)
        hashes[j].update(static_cast<const char*>(bufs[j].data) + off, n);
    };
    const Status s = group.broadcast_buffers(bufs, role.root, hooks);
    for (size_t i = first; i < last; ++i)
      if (hash(i - first)) sums[i] = hashes[i - first].hex();
    MILES_RETURN_IF_ERROR(s);
    if (role.staged && out) {
      // A tensor-parallel rank keeps its shard; the whole tensor's checksum is compared after.
      const PlannedTensor& t = b.tensors[first];
      std::vector<float> shard =
          shard_pieces::shard_of(t, whole.data(), options.shard_rank, options.shard_size);
      out->checksums[t.name] = xxh3_128_hex(shard.data(), shard.size() * sizeof(float));
      out->shapes[t.name] = shard_pieces::local_shape(t, options.shard_size);
      out->tensors[t.name] = std::move(shard);
    }
    first = last;
  }
  return Status::Ok();
}

// A receiver's hashes against the sender's checksums (`table`, one per tensor); a whole-tensor
// receiver records each tensor's shape and checksum.
Status check_sums(const Bucket& b, const std::string& table, const std::vector<std::string>& sums,
                  const std::string& at, ReceivedWeights* out, const BroadcastOptions& options) {
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    const PlannedTensor& t = b.tensors[i];
    const std::string sent = table.substr(i * kHex, kHex);
    if (sums[i] != sent)
      return Status::Error(at + "checksum mismatch for " + t.name + " (got " + sums[i] +
                           ", the sender's " + sent + ")");
    if (options.shard_size == 1) {
      out->shapes[t.name] = t.shape;
      out->checksums[t.name] = sent;
    }
  }
  return Status::Ok();
}

}  // namespace

// Per bucket: the version; then every tensor, straight from the sender's source into the
// receiver's tensor (no staging copy on either side), hashed piece by piece as it arrives (and
// on a sender without the checksum, as it leaves), while the next pieces are on their way; then
// the sender's checksums, which every receiver compares with its own before it keeps anything.
Status broadcast_weights(Communicator& group, const TransferPlan& plan, int64_t version,
                         const TensorSource& source, ReceivedWeights* out,
                         const BroadcastOptions& options) {
  if (out && options.shard_size > 1)
    MILES_RETURN_IF_ERROR(shard_pieces::check_splits(plan, {options.shard_size}));
  if (out) {  // the plan's tensors are overwritten in place (their buffers reused), others left
    out->version = version;
    out->verified = false;
  }
  std::vector<float> whole;  // a tensor that is not kept whole (a shard's, or no receiver's)
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    const std::string at =
        "weight version " + std::to_string(version) + ", bucket " + std::to_string(bi) + ": ";
    BucketRole role;
    role.root = options.sender_group_rank(b.sender);
    if (role.root < 0 || role.root >= group.size())
      return Status::Error(at + "sender world rank " + std::to_string(b.sender) +
                           " is not in the group");
    role.sending = group.rank() == role.root;
    role.staged = !role.sending && !(out && options.shard_size == 1);
    std::vector<std::span<const float>> sources;
    if (role.sending) {
      MILES_ASSIGN_OR_RETURN(sources, bucket_sources(b, source, at));
    }
    int64_t got_version = version;
    Status s = group.broadcast(&got_version, sizeof got_version, role.root);
    if (!s.ok()) return s.with_context(at.substr(0, at.size() - 2));
    if (got_version != version)
      return Status::Error(at + "the sender sent version " + std::to_string(got_version));
    std::vector<std::string> sums(b.tensors.size());
    s = broadcast_tensors(group, b, role, sources, out, options, whole, sums);
    std::string table(kHex * b.tensors.size(), '0');
    if (role.sending)
      for (size_t i = 0; i < sums.size(); ++i) table.replace(i * kHex, kHex, sums[i]);
    if (s.ok()) s = group.broadcast(table.data(), table.size(), role.root);
    if (!s.ok()) return s.with_context(at.substr(0, at.size() - 2));
    if (out && !role.sending) MILES_RETURN_IF_ERROR(check_sums(b, table, sums, at, out, options));
  }
  if (out) out->verified = true;
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
  // Every stage straight into `out` (its buffers of an earlier version reused); then only the
  // plan's tensors are left.
  out->checksums.clear();
  out->shapes.clear();
  for (int s = 0; s < stages; ++s) {
    BroadcastOptions bo;
    bo.sender_group_rank = [](int) { return 0; };
    bo.shard_rank = shard_rank;
    bo.shard_size = shard_size;
    MILES_RETURN_IF_ERROR(broadcast_weights(*groups[s], stage_plan(plan, s), version, {}, out, bo)
                              .with_context("stage " + std::to_string(s)));
  }
  const std::vector<std::string> names = plan.tensor_names();
  std::erase_if(out->tensors, [&](const auto& kv) {
    return std::find(names.begin(), names.end(), kv.first) == names.end();
  });
  out->version = version;
  out->verified = true;  // every stage's tensors were checked as they arrived
  return Status::Ok();
}

}  // namespace miles
