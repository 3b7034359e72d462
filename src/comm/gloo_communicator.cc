// The Gloo back-end of Communicator: gloo's TCP transport, rendezvous through the TcpStore.
//
// Joining is two steps. First each member sets "<prefix>/joined/<rank>" and waits for all the
// others' keys, so that a rank that never starts is reported by number ("rank 2 did not join"), not
// as a gloo timeout on an address. Then gloo's connectFullMesh exchanges pair addresses under
// "<prefix>/gloo/". Subgroups reuse the transport device and the store connection of their world,
// under their own prefix
// "<world prefix>/group/<label>[<world ranks>]#<n>" (n counts creations of the same group, so a
// group can be made again).
//
// Gloo reports failures by exceptions (IoException for a broken or silent peer, EnforceNotMet for
// misuse); each call catches them at this boundary and returns a Status. Every collective gets a
// fresh tag (all members issue collectives in the same order, so the counters agree) and the
// communicator's timeout.
#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "miles/comm.h"
#include "miles/tcp_store.h"
#include "rendezvous.h"
#include "socket_io.h"

namespace miles {

namespace {

constexpr uint8_t kSendRecvSlotPrefix = 0x40;  // above gloo's collective prefixes (0x01..0x08)
constexpr uint8_t kChunkSlotPrefix = 0x41;     // broadcast_chunks' pieces
constexpr size_t kChunkBytes = size_t{4} << 20;

// gloo's Store interface over a TcpStoreClient; errors become gloo::IoException, which
// connectFullMesh lets through to our catch.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(TcpStoreClient& client, std::string prefix, std::chrono::milliseconds timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    check(client_.set(prefix_ + key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = client_.get(prefix_ + key, timeout_);
    check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    check(client_.wait(full, timeout));
  }

 private:
  static void check(const Status& s) {
    if (!s.ok()) throw gloo::IoException(s.message());
  }
  TcpStoreClient& client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// What a world and its subgroups share. Members are destroyed bottom-up: the device, then the store
// connection, then (rank 0 with host_store) the store server.
struct GlooShared {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStoreClient> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::chrono::milliseconds timeout{60'000};
};

class GlooCommunicator;

class GlooPendingSend final : public PendingSend {
 public:
  GlooPendingSend(GlooCommunicator* comm, std::unique_ptr<gloo::transport::UnboundBuffer> buf,
                  std::string op)
      : comm_(comm), buf_(std::move(buf)), op_(std::move(op)) {}
  Status wait() override;

 private:
  GlooCommunicator* comm_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  std::string op_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<GlooShared> shared, std::shared_ptr<gloo::Context> ctx,
                   std::vector<int> world_ranks, std::string name, std::string prefix)
      : shared_(std::move(shared)),
        ctx_(std::move(ctx)),
        world_ranks_(std::move(world_ranks)),
        name_(std::move(name)),
        prefix_(std::move(prefix)) {}

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }

  Status barrier() override {
    if (size() == 1) return Status::Ok();
    return guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::barrier(opts);
    });
  }

  Status broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) return bad_rank("broadcast", "root", root);
    if (size() == 1 || bytes == 0) return Status::Ok();
    return guarded("broadcast from rank " + std::to_string(root), [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<char*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::broadcast(opts);
    });
  }

  // Over the pairs, in pieces: the root posts every piece to every other rank at once; a receiver
  // posts every piece's receive at once and hands each over as it completes, so the transport's
  // threads fill the next pieces while the caller hashes this one (gloo::broadcast returns only
  // with the whole buffer).
  Status broadcast_chunks(void* data, size_t bytes, int root, const ChunkHooks& hooks) override {
    const Buffer one{data, bytes};
    BufferHooks h;
    if (hooks.arrived) h.arrived = [&](size_t, size_t off, size_t n) { hooks.arrived(off, n); };
    return broadcast_buffers({&one, 1}, root, h);  // Gloo copies nothing itself: `copy` unused
  }

  // Every piece of every buffer posted at once (a receiver's receives, the root's sends), then
  // handed over in order as each completes: a buffer's first pieces are already asked for while
  // the one before it arrives, so the stream does not stop for a round trip between buffers.
  Status broadcast_buffers(std::span<const Buffer> buffers, int root,
                           const BufferHooks& hooks) override {
    if (root < 0 || root >= size()) return bad_rank("broadcast", "root", root);
    struct Piece {
      size_t buffer, offset, n;
    };
    std::vector<Piece> pieces;
    for (size_t b = 0; b < buffers.size(); ++b)
      for (size_t off = 0; off < buffers[b].bytes; off += kChunkBytes)
        pieces.push_back({b, off, std::min(kChunkBytes, buffers[b].bytes - off)});
    if (size() == 1) {
      if (hooks.arrived)
        for (const Piece& q : pieces) hooks.arrived(q.buffer, q.offset, q.n);
      return Status::Ok();
    }
    const uint32_t first_tag = tag_;
    tag_ += static_cast<uint32_t>(pieces.size());  // every rank takes the same tags
    const bool sending = rank() == root;
    return guarded("broadcast from rank " + std::to_string(root), [&] {
      std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Piece& q = pieces[i];
        bufs.push_back(
            ctx_->createUnboundBuffer(static_cast<char*>(buffers[q.buffer].data) + q.offset, q.n));
        const uint64_t slot =
            gloo::Slot::build(kChunkSlotPrefix, first_tag + static_cast<uint32_t>(i));
        if (sending) {
          for (int r = 0; r < size(); ++r)
            if (r != root) bufs.back()->send(r, slot);
        } else {
          bufs.back()->recv(root, slot);
        }
      }
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!sending && !bufs[i]->waitRecv(shared_->timeout))
          throw gloo::IoException("broadcast piece receive aborted");
        if (hooks.arrived) hooks.arrived(pieces[i].buffer, pieces[i].offset, pieces[i].n);
      }
      if (sending)
        for (auto& b : bufs)
          for (int r = 1; r < size(); ++r)
            if (!b->waitSend(shared_->timeout)) throw gloo::IoException("broadcast piece aborted");
    });
  }

  Status allgather(const void* in, size_t bytes, void* out) override {
    if (size() == 1 || bytes == 0) {
      if (bytes > 0 && in != out) std::memmove(out, in, bytes);
      return Status::Ok();
    }
    return guarded("allgather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
      opts.setOutput(static_cast<char*>(out), bytes * static_cast<size_t>(size()));
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::allgather(opts);
    });
  }

  Status send(const void* data, size_t bytes, int dst, uint32_t tag) override {
    if (dst < 0 || dst >= size() || dst == rank()) return bad_rank("send", "destination", dst);
    return guarded("send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")",
                   [&] {
                     auto buf = ctx_->createUnboundBuffer(const_cast<void*>(data), bytes);
                     buf->send(dst, gloo::Slot::build(kSendRecvSlotPrefix, tag));
                     if (!buf->waitSend(shared_->timeout)) throw gloo::IoException("send aborted");
                   });
  }

  Result<std::unique_ptr<PendingSend>> isend(const void* data, size_t bytes, int dst,
                                             uint32_t tag) override {
    if (dst < 0 || dst >= size() || dst == rank()) return bad_rank("send", "destination", dst);
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    const std::string op =
        "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
    MILES_RETURN_IF_ERROR(guarded(op, [&] {
      buf = ctx_->createUnboundBuffer(const_cast<void*>(data), bytes);
      buf->send(dst, gloo::Slot::build(kSendRecvSlotPrefix, tag));
    }));
    return std::unique_ptr<PendingSend>(
        std::make_unique<GlooPendingSend>(this, std::move(buf), op));
  }

  // Completes an isend (GlooPendingSend::wait).
  Status wait_send(gloo::transport::UnboundBuffer& buf, const std::string& op) {
    return guarded(op, [&] {
      if (!buf.waitSend(shared_->timeout)) throw gloo::IoException("send aborted");
    });
  }

  Status recv(void* data, size_t bytes, int src, uint32_t tag) override {
    if (src < 0 || src >= size() || src == rank()) return bad_rank("recv", "source", src);
    return guarded("recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")",
                   [&] {
                     auto buf = ctx_->createUnboundBuffer(data, bytes);
                     buf->recv(src, gloo::Slot::build(kSendRecvSlotPrefix, tag));
                     if (!buf->waitRecv(shared_->timeout)) throw gloo::IoException("recv aborted");
                   });
  }

  // Every receive posted at once (one slot: gloo matches a slot's receives in the order posted,
  // and a pair's messages arrive in the order sent), then waited for in order.
  Status recv_buffers(std::span<const Buffer> buffers, int src, uint32_t tag,
                      const std::function<void(size_t i)>& arrived) override {
    if (src < 0 || src >= size() || src == rank()) return bad_rank("recv", "source", src);
    return guarded("recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")",
                   [&] {
                     std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
                     for (const Buffer& b : buffers) {
                       bufs.push_back(ctx_->createUnboundBuffer(b.data, b.bytes));
                       bufs.back()->recv(src, gloo::Slot::build(kSendRecvSlotPrefix, tag));
                     }
                     for (size_t i = 0; i < bufs.size(); ++i) {
                       if (!bufs[i]->waitRecv(shared_->timeout))
                         throw gloo::IoException("recv aborted");
                       if (arrived) arrived(i);
                     }
                   });
  }

  Result<std::unique_ptr<Communicator>> new_group(std::span<const int> ranks,
                                                  std::string_view label) override;

  // Rendezvous of `rank` of `world_ranks.size()` members under `prefix`, then gloo's full mesh.
  static Result<std::shared_ptr<gloo::Context>> join(GlooShared& shared, const std::string& prefix,
                                                     int rank, const std::vector<int>& world_ranks,
                                                     const std::string& name);

 private:
  uint32_t next_tag() { return tag_++; }

  Status bad_rank(const char* op, const char* what, int r) const {
    return Status::Error(context(op) + ": " + what + " " + std::to_string(r) +
                         " is not another rank of this group of " + std::to_string(size()));
  }

  std::string context(const std::string& op) const {
    return "gloo " + op + " in group " + name_ + " (rank " + std::to_string(rank()) + " of " +
           std::to_string(size()) + ")";
  }

  template <typename Fn>
  Status guarded(const std::string& op, Fn fn) {
    if (!broken_.empty()) {
      return Status::Error(context(op) + ": the communicator failed earlier (" + broken_ + ")");
    }
    try {
      fn();
      return Status::Ok();
    } catch (const std::exception& e) {
      broken_ = e.what();
      return Status::Error(context(op) + ": " + broken_ + " (timeout " +
                           std::to_string(shared_->timeout.count()) + " ms)");
    }
  }

  std::shared_ptr<GlooShared> shared_;
  std::shared_ptr<gloo::Context> ctx_;
  std::vector<int> world_ranks_;
  std::string name_;
  std::string prefix_;
  uint32_t tag_ = 0;
  std::map<std::string, int> group_creations_;
  std::string broken_;  // the first transport error; non-empty means every later call fails
};

Result<std::shared_ptr<gloo::Context>> GlooCommunicator::join(GlooShared& shared,
                                                              const std::string& prefix, int rank,
                                                              const std::vector<int>& world_ranks,
                                                              const std::string& name) {
  TcpStoreClient& store = *shared.store;
  const int size = static_cast<int>(world_ranks.size());
  MILES_RETURN_IF_ERROR(
      comm::detail::join_members(store, prefix, rank, world_ranks, name, shared.timeout));
  const std::string where = "joining group " + name + " as rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + " (store " + store.address() + ")";
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(shared.timeout);
  try {
    GlooStore gloo_store(store, prefix + "/gloo/", shared.timeout);
    ctx->connectFullMesh(gloo_store, shared.device);
  } catch (const std::exception& e) {
    return Status::Error(where + ": connecting the gloo mesh: " + e.what());
  }
  return std::shared_ptr<gloo::Context>(std::move(ctx));
}

Status GlooPendingSend::wait() {
  if (!buf_) return Status::Ok();
  Status s = comm_->wait_send(*buf_, op_);
  buf_.reset();
  return s;
}

Result<std::unique_ptr<Communicator>> GlooCommunicator::new_group(std::span<const int> ranks,
                                                                  std::string_view label) {
  const std::string op = "new_group " + std::string(label);
  if (!broken_.empty()) {
    return Status::Error(context(op) + ": the communicator failed earlier (" + broken_ + ")");
  }
  std::vector<int> members(ranks.begin(), ranks.end());
  int my_index = -1;
  std::vector<int> world;
  for (size_t i = 0; i < members.size(); ++i) {
    const int r = members[i];
    if (r < 0 || r >= size()) return bad_rank(op.c_str(), "member", r);
    if (std::count(members.begin(), members.end(), r) > 1) {
      return Status::Error(context(op) + ": rank " + std::to_string(r) + " listed twice");
    }
    if (r == rank()) my_index = static_cast<int>(i);
    world.push_back(world_ranks_[r]);
  }
  if (my_index < 0) {
    return Status::Error(context(op) + ": this rank is not in [" +
                         comm::detail::ranks_text(members) + "]");
  }
  const std::string group_name = std::string(label) + "[" + comm::detail::ranks_text(world) + "]";
  const int n = group_creations_[group_name]++;
  const std::string prefix = prefix_ + "/group/" + group_name + "#" + std::to_string(n);
  MILES_ASSIGN_OR_RETURN(auto ctx, join(*shared_, prefix, my_index, world, group_name));
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(shared_, std::move(ctx), std::move(world), group_name, prefix));
}

// gloo writes to its sockets with writev, so a write to a peer that just died raises SIGPIPE, whose
// default action kills the process. Make it an EPIPE error instead (as Python does at start-up),
// unless the program installed its own handler.
void ignore_sigpipe_if_default() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

Result<std::unique_ptr<Communicator>> connect_gloo(const CommOptions& options) {
  const std::string where = "connect_gloo (rank " + std::to_string(options.rank) + " of " +
                            std::to_string(options.world_size) + ")";
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size) {
    return Status::Error(where + ": need 0 <= rank < world_size");
  }
  if (options.timeout.count() <= 0) return Status::Error(where + ": timeout must be positive");
  if (options.store_address.empty()) return Status::Error(where + ": no store address");
  ignore_sigpipe_if_default();
  auto shared = std::make_shared<GlooShared>();
  shared->timeout = options.timeout;
  if (options.host_store && options.rank == 0) {
    auto hp = comm::detail::parse_host_port(options.store_address);
    if (!hp.ok()) return hp.status().with_context(where);
    TcpStoreServerOptions so;
    so.host = hp->host;
    so.port = hp->port;
    auto server = TcpStoreServer::start(so);
    if (!server.ok()) return server.status().with_context(where + ": hosting the store");
    shared->server = std::move(server).value();
  }
  auto store = TcpStoreClient::connect({options.store_address, options.timeout});
  if (!store.ok()) return store.status().with_context(where);
  shared->store = std::move(store).value();
  try {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) {
      attr.iface = options.iface;
    } else {
      attr.hostname = options.host;
    }
    shared->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return Status::Error(where + ": creating the TCP device on " +
                         (options.iface.empty() ? options.host : "interface " + options.iface) +
                         ": " + e.what());
  }
  std::vector<int> world(options.world_size);
  for (int r = 0; r < options.world_size; ++r) world[r] = r;
  const std::string prefix = options.prefix + "/world";
  MILES_ASSIGN_OR_RETURN(auto ctx,
                         GlooCommunicator::join(*shared, prefix, options.rank, world, "world"));
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(std::move(shared), std::move(ctx), std::move(world), "world", prefix));
}

}  // namespace miles
