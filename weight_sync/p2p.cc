// The p2p transport: per bucket and tensor-parallel rank, one message (version, shard checksums,
// shard bytes) from that trainer rank to every engine; engines assemble full tensors
// (weight_sync.h).
#include <cstring>

#include "miles/comm.h"
#include "miles/tensor_parallel.h"
#include "miles/weight_sync.h"

namespace miles {

namespace {

constexpr size_t kHex = 32;
using tensor_parallel::Split;

// Bytes of tensor t that tensor-parallel rank k of `tp` ranks sends.
int64_t shard_bytes(const PlannedTensor& t, int k, int tp) {
  if (tensor_parallel::split_of(t.name) == Split::kReplicated) return k == 0 ? t.bytes : 0;
  return t.bytes / tp;
}

uint32_t tag_of(size_t bucket, int k) { return static_cast<uint32_t>(bucket * 1024 + k); }

struct Message {
  std::vector<char> header;  // version, then a checksum per tensor (blank when not sent)
  std::vector<char> data;    // the shards, in bucket order
};

Message layout_message(const Bucket& b, int k, int tp) {
  Message m;
  m.header.assign(sizeof(int64_t) + kHex * b.tensors.size(), 0);
  int64_t bytes = 0;
  for (const PlannedTensor& t : b.tensors) bytes += shard_bytes(t, k, tp);
  m.data.assign(static_cast<size_t>(bytes), 0);
  return m;
}

}  // namespace

Status p2p_send_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                        const TensorSource& local_shards, const P2pRoles& roles) {
  const RankCoord me = roles.trainer.coord(world.rank());
  if (me.dp != 0) return Status::Ok();
  const int tp = roles.trainer.tp();
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    if (b.stage != me.pp) continue;
    Message m = layout_message(b, me.tp, tp);
    std::memcpy(m.header.data(), &version, sizeof(version));
    int64_t off = 0;
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      const PlannedTensor& t = b.tensors[i];
      const int64_t n = shard_bytes(t, me.tp, tp);
      if (n == 0) continue;
      std::span<const float> v = local_shards(t.name);
      if (static_cast<int64_t>(v.size_bytes()) != n)
        return Status::Error("p2p weight send: this rank's shard of " + t.name + " has " +
                             std::to_string(v.size_bytes()) + " bytes, expected " +
                             std::to_string(n));
      std::memcpy(m.data.data() + off, v.data(), n);
      const std::string sum = xxh3_128_hex(v.data(), n);
      std::memcpy(m.header.data() + sizeof(int64_t) + i * kHex, sum.data(), kHex);
      off += n;
    }
    std::vector<std::unique_ptr<PendingSend>> pending;
    for (int e = 0; e < roles.num_engines; ++e) {
      const int dst = roles.engine_rank(e);
      for (const std::vector<char>* part : {&m.header, &m.data}) {
        if (part->empty()) continue;
        MILES_ASSIGN_OR_RETURN(auto p, world.isend(part->data(), part->size(), dst,
                                                   tag_of(bi, me.tp) * 2 + (part == &m.data)));
        pending.push_back(std::move(p));
      }
    }
    for (auto& p : pending) MILES_RETURN_IF_ERROR(p->wait());
  }
  return Status::Ok();
}

Status p2p_receive_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                           const P2pRoles& roles, ReceivedWeights* out) {
  out->version = version;
  out->tensors.clear();
  out->shapes.clear();
  out->checksums.clear();
  const int tp = roles.trainer.tp();
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    const std::string at =
        "weight version " + std::to_string(version) + ", bucket " + std::to_string(bi);
    // gathered[t]: the tp shards of tensor t in rank order (tensor_parallel::assemble's input).
    std::vector<std::vector<float>> gathered(b.tensors.size());
    for (int k = 0; k < tp; ++k) {
      const int src = roles.trainer.rank_of({0, b.stage, k});
      Message m = layout_message(b, k, tp);
      Status s = world.recv(m.header.data(), m.header.size(), src, tag_of(bi, k) * 2);
      if (s.ok() && !m.data.empty())
        s = world.recv(m.data.data(), m.data.size(), src, tag_of(bi, k) * 2 + 1);
      if (!s.ok()) return s.with_context(at + ", from trainer rank " + std::to_string(src));
      int64_t got = 0;
      std::memcpy(&got, m.header.data(), sizeof(got));
      if (got != version)
        return Status::Error(at + ": trainer rank " + std::to_string(src) + " sent version " +
                             std::to_string(got));
      int64_t off = 0;
      for (size_t i = 0; i < b.tensors.size(); ++i) {
        const PlannedTensor& t = b.tensors[i];
        const int64_t n = shard_bytes(t, k, tp);
        if (n == 0) continue;
        const std::string want(m.header.data() + sizeof(int64_t) + i * kHex, kHex);
        if (xxh3_128_hex(m.data.data() + off, n) != want)
          return Status::Error(at + ": checksum mismatch for " + t.name + " shard " +
                               std::to_string(k) + " from trainer rank " + std::to_string(src));
        const size_t before = gathered[i].size();
        gathered[i].resize(before + n / sizeof(float));
        std::memcpy(gathered[i].data() + before, m.data.data() + off, n);
        off += n;
      }
    }
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      const PlannedTensor& t = b.tensors[i];
      std::vector<float>& full = out->tensors[t.name];
      full.resize(static_cast<size_t>(t.bytes / sizeof(float)));
      const bool replicated = tensor_parallel::split_of(t.name) == Split::kReplicated;
      tensor_parallel::assemble(t.name, t.shape, gathered[i], replicated ? 1 : tp, full);
      out->shapes[t.name] = t.shape;
      out->checksums[t.name] = xxh3_128_hex(full.data(), t.bytes);
    }
  }
  return Status::Ok();
}

}  // namespace miles
