// The p2p transport: per bucket, trainer tensor-parallel rank k and engine tensor-parallel rank j,
// one message (version, a checksum per piece, the pieces) from trainer rank k to rank j of every
// engine; each engine rank places the pieces straight into its own shard (weight_sync.h).
#include <algorithm>
#include <cstring>
#include <map>

#include "miles/comm.h"
#include "miles/tensor_parallel.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/shard_pieces.h"

namespace miles {

namespace {

constexpr size_t kHex = 32;
using shard_pieces::local_numel;
using shard_pieces::local_shape;
using shard_pieces::Piece;
using shard_pieces::piece_of;
using tensor_parallel::Split;

uint32_t tag_of(size_t bucket, int k) { return static_cast<uint32_t>(bucket * 1024 + k); }

struct Message {
  std::vector<char> header;  // version, then a checksum per tensor (blank when no piece)
  std::vector<char> data;    // the pieces, in bucket order, each run after run
};

// Sizes `m` for the message of bucket b from trainer rank k to engine rank j. The buffers are
// reused from bucket to bucket: every byte is written before it is sent or read after it is
// received (blank checksums are zeroed), so they are resized, never zero-filled again.
void layout_message(const Bucket& b, int k, int nt, int j, int ne, Message& m) {
  m.header.resize(sizeof(int64_t) + kHex * b.tensors.size());
  int64_t floats = 0;
  for (const PlannedTensor& t : b.tensors) floats += piece_of(t, k, nt, j, ne).floats();
  m.data.resize(static_cast<size_t>(floats) * sizeof(float));
}

// The message trainer rank k sends engine rank j for bucket b, into `m`.
Status pack(const Bucket& b, int64_t version, const TensorSource& local_shards, int k, int nt,
            int j, int ne, Message& m) {
  layout_message(b, k, nt, j, ne, m);
  std::fill(m.header.begin(), m.header.end(), 0);
  std::memcpy(m.header.data(), &version, sizeof(version));
  float* out = reinterpret_cast<float*>(m.data.data());
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    const PlannedTensor& t = b.tensors[i];
    const Piece p = piece_of(t, k, nt, j, ne);
    if (p.floats() == 0) continue;
    std::span<const float> v = local_shards(t.name);
    if (static_cast<int64_t>(v.size()) != local_numel(t, nt))
      return Status::Error("p2p weight send: this rank's shard of " + t.name + " has " +
                           std::to_string(v.size_bytes()) + " bytes, expected " +
                           std::to_string(local_numel(t, nt) * sizeof(float)));
    for (int64_t r = 0; r < p.rows; ++r)
      std::copy_n(v.data() + p.src + r * p.src_stride, p.len, out + r * p.len);
    const std::string sum = xxh3_128_hex(out, p.floats() * sizeof(float));
    std::memcpy(m.header.data() + sizeof(int64_t) + i * kHex, sum.data(), kHex);
    out += p.floats();
  }
  return Status::Ok();
}

}  // namespace

Status p2p_send_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                        const TensorSource& local_shards, const P2pRoles& roles) {
  const RankCoord me = roles.trainer.coord(world.rank());
  if (me.dp != 0) return Status::Ok();
  const int nt = roles.trainer.tp(), ne = roles.engine_tp;
  MILES_RETURN_IF_ERROR(shard_pieces::check_splits(plan, {nt, ne}));
  std::vector<Message> messages(ne);  // reused by every bucket (each waits for its sends)
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    if (b.stage != me.pp) continue;
    // One message per engine rank j (the same for every engine), all in flight at once.
    std::vector<std::unique_ptr<PendingSend>> pending;
    for (int j = 0; j < ne; ++j) {
      MILES_RETURN_IF_ERROR(pack(b, version, local_shards, me.tp, nt, j, ne, messages[j]));
      for (int e = 0; e < roles.num_engines; ++e) {
        const int dst = roles.engine_rank(e, j);
        for (const std::vector<char>* part : {&messages[j].header, &messages[j].data}) {
          if (part->empty()) continue;
          const bool data = part == &messages[j].data;
          MILES_ASSIGN_OR_RETURN(
              auto p, world.isend(part->data(), part->size(), dst, tag_of(bi, me.tp) * 2 + data));
          pending.push_back(std::move(p));
        }
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
  out->verified = false;  // until every bucket has arrived
  const int nt = roles.trainer.tp(), ne = roles.engine_tp;
  const int offset = world.rank() - roles.trainer.world_size();
  if (offset < 0 || offset >= roles.num_engines * ne)
    return Status::Error("p2p weight receive: rank " + std::to_string(world.rank()) +
                         " is not an engine rank");
  const int j = offset % ne;
  MILES_RETURN_IF_ERROR(shard_pieces::check_splits(plan, {nt, ne}));
  Message m;  // reused by every bucket and trainer rank
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    const std::string at =
        "weight version " + std::to_string(version) + ", bucket " + std::to_string(bi);
    std::map<std::string, std::string> whole;  // tensors that arrived as one verified piece
    for (const PlannedTensor& t : b.tensors) {
      out->tensors[t.name].assign(static_cast<size_t>(local_numel(t, ne)), 0.0f);
      out->shapes[t.name] = local_shape(t, ne);
    }
    for (int k = 0; k < nt; ++k) {
      const int src = roles.trainer.rank_of({0, b.stage, k});
      layout_message(b, k, nt, j, ne, m);
      Status s = world.recv(m.header.data(), m.header.size(), src, tag_of(bi, k) * 2);
      if (s.ok() && !m.data.empty())
        s = world.recv(m.data.data(), m.data.size(), src, tag_of(bi, k) * 2 + 1);
      if (!s.ok()) return s.with_context(at + ", from trainer rank " + std::to_string(src));
      int64_t got = 0;
      std::memcpy(&got, m.header.data(), sizeof(got));
      if (got != version)
        return Status::Error(at + ": trainer rank " + std::to_string(src) + " sent version " +
                             std::to_string(got));
      const float* in = reinterpret_cast<const float*>(m.data.data());
      for (size_t i = 0; i < b.tensors.size(); ++i) {
        const PlannedTensor& t = b.tensors[i];
        const Piece p = piece_of(t, k, nt, j, ne);
        if (p.floats() == 0) continue;
        const std::string want(m.header.data() + sizeof(int64_t) + i * kHex, kHex);
        if (xxh3_128_hex(in, p.floats() * sizeof(float)) != want)
          return Status::Error(at + ": checksum mismatch for " + t.name + " (piece from trainer " +
                               "rank " + std::to_string(src) + ")");
        float* dst = out->tensors[t.name].data();
        for (int64_t r = 0; r < p.rows; ++r)
          std::copy_n(in + r * p.len, p.len, dst + p.dst + r * p.dst_stride);
        in += p.floats();
        // A piece that is the whole shard, in order: its verified checksum is the shard's.
        if (p.dst == 0 && (p.rows == 1 || p.dst_stride == p.len) &&
            p.floats() == local_numel(t, ne))
          whole[t.name] = want;
      }
    }
    for (const PlannedTensor& t : b.tensors) {
      const std::vector<float>& v = out->tensors[t.name];
      const auto w = whole.find(t.name);
      out->checksums[t.name] =
          w != whole.end() ? w->second : xxh3_128_hex(v.data(), v.size() * sizeof(float));
    }
  }
  // Every piece was checked against the sender's checksum as it arrived, and each shard's checksum
  // was computed from its assembled bytes (or is its one piece's): nothing to hash again.
  out->verified = true;
  return Status::Ok();
}

std::string sharded_checksum(const std::string& name, std::span<const std::string> shard_sums) {
  if (shard_sums.size() == 1 || tensor_parallel::split_of(name) == Split::kReplicated)
    return shard_sums.empty() ? std::string() : shard_sums[0];
  std::string all;
  for (const std::string& s : shard_sums) all += s;
  return "tp" + std::to_string(shard_sums.size()) + ":" + xxh3_128_hex(all.data(), all.size());
}

std::string sharded_checksum_of(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const float> full, int engine_tp) {
  if (engine_tp <= 1 || tensor_parallel::split_of(name) == Split::kReplicated)
    return xxh3_128_hex(full.data(), full.size_bytes());
  const PlannedTensor t{name, shape, 0, static_cast<int64_t>(full.size_bytes())};
  std::vector<std::string> sums;
  for (int j = 0; j < engine_tp; ++j) {
    const std::vector<float> shard = shard_pieces::shard_of(t, full.data(), j, engine_tp);
    sums.push_back(xxh3_128_hex(shard.data(), shard.size() * sizeof(float)));
  }
  return sharded_checksum(name, sums);
}

}  // namespace miles
