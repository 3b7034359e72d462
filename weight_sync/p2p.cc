// The p2p transport: per bucket, trainer tensor-parallel rank k and engine tensor-parallel rank j,
// a header (the version), each piece as its own message, then a trailer (a checksum per piece),
// from trainer rank k to rank j of every engine. The sender hashes a piece just before it goes and
// the receiver as it lands, so hashing overlaps the transfer on both sides. A piece that is one run
// in the trainer's shard goes straight from it, and one that is one run in the engine rank's shard
// arrives straight into it; only strided pieces (column splits) are staged on either side
// (weight_sync.h).
#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <thread>

#include "miles/comm.h"
#include "miles/tensor_parallel.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/shard_pieces.h"
#include "weight_sync/xxh3.h"

namespace miles {

namespace {

constexpr size_t kHex = 32;
using shard_pieces::local_numel;
using shard_pieces::local_shape;
using shard_pieces::Piece;
using shard_pieces::piece_of;
using tensor_parallel::Split;

// Header and pieces of one (bucket, trainer rank) go on two tags; a pair's messages on one tag
// arrive in the order sent.
uint32_t header_tag(size_t bucket, int k) { return static_cast<uint32_t>(bucket * 1024 + k) * 2; }
uint32_t piece_tag(size_t bucket, int k) { return header_tag(bucket, k) + 1; }

// One run of floats in the shard that holds it (at `at`), or rows of it `stride` apart.
bool one_run(const Piece& p, int64_t stride) { return p.rows == 1 || stride == p.len; }

// The most a receiver stages at once for strided pieces whose receives are posted together.
constexpr size_t kStagedGroupBytes = size_t{64} << 20;

// What trainer rank k sends engine rank j for one bucket after the version: where each piece's
// bytes are (the shard itself, or `staged` for a strided piece), and the trailer (each
// piece's checksum at its tensor's index). A strided piece is hashed while it is gathered; a
// direct one by the first destination's sending thread just before it goes, so that hashing piece
// i + 1 overlaps the receiver taking piece i. The other destinations' threads wait for `hashed`
// before they send the trailer.
struct Outgoing {
  int64_t version = 0;
  std::vector<std::span<const char>> pieces;
  std::vector<size_t> tensor;    // each piece's tensor index in the bucket
  std::vector<char> needs_hash;  // each piece: hashed by the first sending thread
  std::vector<std::vector<float>> staged;
  std::vector<char> trailer;
  std::promise<void> hashed;
  std::shared_future<void> hashed_future;
};

Status prepare(const Bucket& b, int64_t version, const TensorSource& local_shards, int k, int nt,
               int j, int ne, Outgoing& o) {
  o.version = version;
  o.trailer.assign(kHex * b.tensors.size(), 0);
  o.pieces.clear();
  o.tensor.clear();
  o.needs_hash.clear();
  o.staged.clear();
  o.hashed = std::promise<void>();
  o.hashed_future = o.hashed.get_future().share();
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    const PlannedTensor& t = b.tensors[i];
    const Piece p = piece_of(t, k, nt, j, ne);
    if (p.floats() == 0) continue;
    std::span<const float> v = local_shards(t.name);
    if (static_cast<int64_t>(v.size()) != local_numel(t, nt))
      return Status::Error("p2p weight send: this rank's shard of " + t.name + " has " +
                           std::to_string(v.size_bytes()) + " bytes, expected " +
                           std::to_string(local_numel(t, nt) * sizeof(float)));
    const size_t bytes = static_cast<size_t>(p.floats()) * sizeof(float);
    const float* from = v.data() + p.src;
    const bool strided = !one_run(p, p.src_stride);
    if (strided) {  // gathered into a staging run, hashed on the way
      weight_sync_detail::Xxh3Stream hash;
      std::vector<float>& run = o.staged.emplace_back(static_cast<size_t>(p.floats()));
      for (int64_t r = 0; r < p.rows; ++r)
        hash.copy(run.data() + r * p.len, from + r * p.src_stride, p.len * sizeof(float));
      from = run.data();
      std::memcpy(o.trailer.data() + i * kHex, hash.hex().data(), kHex);
    }
    o.pieces.emplace_back(reinterpret_cast<const char*>(from), bytes);
    o.tensor.push_back(i);
    o.needs_hash.push_back(!strided);
  }
  return Status::Ok();
}

// The sends of one bucket: a thread per destination sends the version, the pieces and the trailer
// in order; the first thread of each Outgoing hashes its direct pieces on the way.
class BucketSends {
 public:
  void start(Communicator& world, Outgoing& o, int dst, size_t bucket, int k, bool hasher) {
    statuses_.push_back(std::make_unique<Status>());
    Status* status = statuses_.back().get();
    threads_.emplace_back([&world, &o, dst, bucket, k, hasher, status] {
      *status = world.send(&o.version, sizeof o.version, dst, header_tag(bucket, k));
      for (size_t i = 0; i < o.pieces.size() && status->ok(); ++i) {
        if (hasher && o.needs_hash[i]) {
          const std::string sum = xxh3_128_hex(o.pieces[i].data(), o.pieces[i].size());
          std::memcpy(o.trailer.data() + o.tensor[i] * kHex, sum.data(), kHex);
        }
        *status = world.send(o.pieces[i].data(), o.pieces[i].size(), dst, piece_tag(bucket, k));
      }
      if (hasher) {
        o.hashed.set_value();  // also after a failed send: no other thread waits forever
      } else {
        o.hashed_future.wait();
      }
      if (status->ok())
        *status = world.send(o.trailer.data(), o.trailer.size(), dst, header_tag(bucket, k));
    });
  }
  Status finish() {
    for (std::thread& t : threads_) t.join();
    Status first = Status::Ok();
    for (const auto& s : statuses_)
      if (first.ok() && !s->ok()) first = *s;
    threads_.clear();
    statuses_.clear();
    return first;
  }
  ~BucketSends() { static_cast<void>(finish()); }

 private:
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<Status>> statuses_;
};

}  // namespace

Status p2p_send_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                        const TensorSource& local_shards, const P2pRoles& roles) {
  const RankCoord me = roles.trainer.coord(world.rank());
  if (me.dp != 0) return Status::Ok();
  const int nt = roles.trainer.tp(), ne = roles.engine_tp;
  MILES_RETURN_IF_ERROR(shard_pieces::check_splits(plan, {nt, ne}));
  // Bucket after bucket (a pair's messages must not interleave: over shared memory they are
  // matched in order, whatever their tags): stage strided pieces, then send to every destination
  // at once, a thread each.
  std::vector<Outgoing> out(ne);  // per engine rank j (the same for every engine)
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    if (b.stage != me.pp) continue;
    for (int j = 0; j < ne; ++j)
      MILES_RETURN_IF_ERROR(prepare(b, version, local_shards, me.tp, nt, j, ne, out[j]));
    BucketSends sends;
    for (int j = 0; j < ne; ++j)
      for (int e = 0; e < roles.num_engines; ++e)
        sends.start(world, out[j], roles.engine_rank(e, j), bi, me.tp, e == 0);
    MILES_RETURN_IF_ERROR(sends.finish());
  }
  return Status::Ok();
}

namespace {

// One piece trainer rank k sends into this rank's shard: where its first float goes, whether it
// lands there directly (one run in the shard) or through a staging run, and its hash once landed.
struct Incoming {
  size_t tensor;  // index in the bucket
  Piece piece;
  float* dst;
  bool direct;
  std::string sum;
};

// The pieces trainer rank k (of nt) sends engine rank j (of ne) for bucket b, in sending order.
std::vector<Incoming> incoming_pieces(const Bucket& b, int k, int nt, int j, int ne,
                                      std::map<std::string, std::vector<float>>& shards) {
  std::vector<Incoming> pieces;
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    const Piece p = piece_of(b.tensors[i], k, nt, j, ne);
    if (p.floats() > 0)
      pieces.push_back(
          {i, p, shards[b.tensors[i].name].data() + p.dst, one_run(p, p.dst_stride), {}});
  }
  return pieces;
}

// The pieces from `src`, received in groups posted at once (Communicator::recv_buffers): straight
// into the shard when a piece is one run there, else into a staging run placed (and hashed) once
// it is in; a group stages at most kStagedGroupBytes. Each piece is hashed as it lands.
Status receive_pieces(Communicator& world, int src, uint32_t tag, std::vector<Incoming>& pieces,
                      std::vector<std::vector<float>>& staged) {
  for (size_t first = 0; first < pieces.size();) {
    size_t last = first, staged_bytes = 0;
    std::vector<Communicator::Buffer> bufs;
    staged.clear();
    for (; last < pieces.size(); ++last) {
      const Incoming& in = pieces[last];
      const size_t bytes = static_cast<size_t>(in.piece.floats()) * sizeof(float);
      if (!in.direct && last > first && staged_bytes + bytes > kStagedGroupBytes) break;
      void* to = in.dst;
      if (!in.direct) {
        to = staged.emplace_back(static_cast<size_t>(in.piece.floats())).data();
        staged_bytes += bytes;
      }
      bufs.push_back({to, bytes});
    }
    size_t next_staged = 0;
    const auto land = [&](size_t g) {
      Incoming& in = pieces[first + g];
      const Piece& p = in.piece;
      weight_sync_detail::Xxh3Stream hash;
      if (in.direct) {
        hash.update(in.dst, bufs[g].bytes);
      } else {
        const float* run = staged[next_staged++].data();
        for (int64_t r = 0; r < p.rows; ++r)
          hash.copy(in.dst + r * p.dst_stride, run + r * p.len, p.len * sizeof(float));
      }
      in.sum = hash.hex();
    };
    MILES_RETURN_IF_ERROR(world.recv_buffers(bufs, src, tag, land));
    first = last;
  }
  return Status::Ok();
}

// The sender's checksums (the trailer, one per tensor of the bucket) against the pieces' hashes;
// a mismatch leaves the set unverified (never swapped in). A piece that is the whole shard, in
// order, gives the shard its checksum (`whole`).
Status check_trailer(const std::vector<char>& trailer, const Bucket& b,
                     const std::vector<Incoming>& pieces, int ne, const std::string& at, int src,
                     std::map<std::string, std::string>& whole) {
  for (const Incoming& in : pieces) {
    const PlannedTensor& t = b.tensors[in.tensor];
    const std::string want(trailer.data() + in.tensor * kHex, kHex);
    if (in.sum != want)
      return Status::Error(at + ": checksum mismatch for " + t.name + " (piece from trainer " +
                           "rank " + std::to_string(src) + ")");
    if (in.piece.dst == 0 && in.direct && in.piece.floats() == local_numel(t, ne))
      whole[t.name] = want;
  }
  return Status::Ok();
}

// Bucket bi's pieces from trainer rank k (at world rank src): the version header, the pieces, the
// trailer.
Status receive_from_trainer_rank(Communicator& world, const Bucket& b, size_t bi, int k, int src,
                                 int64_t version, int nt, int j, int ne, const std::string& at,
                                 ReceivedWeights* out, std::vector<std::vector<float>>& staged,
                                 std::map<std::string, std::string>& whole) {
  const std::string from = at + ", from trainer rank " + std::to_string(src);
  int64_t got = 0;
  if (Status s = world.recv(&got, sizeof got, src, header_tag(bi, k)); !s.ok())
    return s.with_context(from);
  if (got != version)
    return Status::Error(at + ": trainer rank " + std::to_string(src) + " sent version " +
                         std::to_string(got));
  std::vector<Incoming> pieces = incoming_pieces(b, k, nt, j, ne, out->tensors);
  if (Status s = receive_pieces(world, src, piece_tag(bi, k), pieces, staged); !s.ok())
    return s.with_context(from);
  std::vector<char> trailer(kHex * b.tensors.size());
  if (Status s = world.recv(trailer.data(), trailer.size(), src, header_tag(bi, k)); !s.ok())
    return s.with_context(from + ", checksums");
  return check_trailer(trailer, b, pieces, ne, at, src, whole);
}

}  // namespace

Status p2p_receive_weights(Communicator& world, const TransferPlan& plan, int64_t version,
                           const P2pRoles& roles, ReceivedWeights* out) {
  out->version = version;
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
  std::vector<std::vector<float>> staged;  // strided pieces, before they are placed
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    const std::string at =
        "weight version " + std::to_string(version) + ", bucket " + std::to_string(bi);
    // The buffers of an earlier version are reused (fresh pages cost a fault each 4 KiB): the
    // pieces from the trainer ranks cover each shard, so every float is written.
    for (const PlannedTensor& t : b.tensors) {
      out->tensors[t.name].resize(static_cast<size_t>(local_numel(t, ne)));
      out->shapes[t.name] = local_shape(t, ne);
    }
    std::map<std::string, std::string> whole;  // tensors that arrived as one verified piece
    for (int k = 0; k < nt; ++k)
      MILES_RETURN_IF_ERROR(receive_from_trainer_rank(world, b, bi, k,
                                                      roles.trainer.rank_of({0, b.stage, k}),
                                                      version, nt, j, ne, at, out, staged, whole));
    for (const PlannedTensor& t : b.tensors) {
      const std::vector<float>& v = out->tensors[t.name];
      const auto w = whole.find(t.name);
      out->checksums[t.name] =
          w != whole.end() ? w->second : xxh3_128_hex(v.data(), v.size() * sizeof(float));
    }
  }
  // Every piece was checked against the sender's checksum as it arrived, and each shard's checksum
  // was computed from its assembled bytes (or is its one piece's): nothing to hash again.
  const std::vector<std::string> names = plan.tensor_names();
  std::erase_if(out->tensors, [&](const auto& kv) {
    return std::find(names.begin(), names.end(), kv.first) == names.end();
  });
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
