// The shared-memory back-end (comm.h: connect_shm): every rank maps one POSIX shared-memory
// segment; collectives go through per-rank slots and send / recv through per-pair mailboxes, each
// step published with a release store of a counter and awaited with acquire loads (spinning
// briefly, then yielding), so a step costs a few cache-line transfers instead of Gloo's socket and
// thread wake-ups. Payloads larger than a slot or mailbox go in chunks.
//
// Segment layout: Header, then world × RankBlock (counters and pid, each on its own cache lines),
// world × slot (kSlotBytes), world × world mailboxes (Mailbox + kMailBytes): 3.5 MiB at world 2.
// Rank 0 creates it under a unique name published through the TcpStore, the others open it; once
// all have mapped it, rank 0 unlinks the name, so nothing is left in /dev/shm whatever way the
// processes end.
#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <type_traits>

#include "miles/comm.h"
#include "miles/tcp_store.h"

namespace miles {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x4D494C4553484D31ull;  // "MILESHM1"
constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr size_t kMailBytes = size_t{1} << 18;  // world² of them: 24 MiB in all at world 8

struct alignas(64) Header {
  uint64_t magic;
  int32_t world;
};

// One rank's progress through the collectives (rounds), and its pid for liveness checks.
struct alignas(64) RankBlock {
  std::atomic<uint64_t> written;           // rounds whose data this rank has put in its slot
  alignas(64) std::atomic<uint64_t> read;  // rounds this rank has finished copying out
  alignas(64) std::atomic<int32_t> pid;
};

// src → dst messages in order, in chunks through the mailbox's two halves (chunk k in half k mod
// 2, so the sender writes the next chunk while the receiver copies this one out): `posted` chunks
// written, `taken` chunks copied out.
struct alignas(64) Mailbox {
  std::atomic<uint64_t> posted;
  alignas(64) std::atomic<uint64_t> taken;
  alignas(64) uint64_t bytes[2];  // of the chunk in each half
};
constexpr size_t kMailHalf = kMailBytes / 2;

static_assert(std::atomic<uint64_t>::is_always_lock_free);

// False once `pid` has exited, including as a zombie its parent has not reaped yet (a rank's
// followers are often its children): /proc/PID/stat's state is Z or X, or the entry is gone.
bool alive(int pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');
  if (!close_paren || close_paren[1] == 0) return true;
  const char state = close_paren[2];
  return state != 'Z' && state != 'X';
}

size_t segment_bytes(int world) {
  return sizeof(Header) + world * sizeof(RankBlock) + world * kSlotBytes +
         static_cast<size_t>(world) * world * (sizeof(Mailbox) + kMailBytes);
}

// Where a group meets: the job's store, a key namespace, this process's place in the group.
struct Meeting {
  std::shared_ptr<TcpStoreClient> store;
  std::string prefix;
  int rank = 0, world = 1;
  std::vector<int> world_ranks;  // of the members, by group rank
  std::chrono::milliseconds timeout{60'000};
  std::string name;  // for messages: "shm:PREFIX" for a world, "tp[0,1]" for a subgroup
};

class ShmCommunicator;
Result<std::unique_ptr<ShmCommunicator>> join_segment(const Meeting& m);

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(Meeting meeting, void* base, size_t bytes)
      : rank_(meeting.rank),
        world_(meeting.world),
        base_(static_cast<char*>(base)),
        bytes_(bytes),
        timeout_(meeting.timeout),
        name_(meeting.name),
        world_ranks_(meeting.world_ranks),
        meeting_(std::move(meeting)) {}
  ~ShmCommunicator() override { munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }
  bool shared_memory() const override { return true; }

  RankBlock& block(int r) { return reinterpret_cast<RankBlock*>(base_ + sizeof(Header))[r]; }
  char* slot(int r) { return base_ + sizeof(Header) + world_ * sizeof(RankBlock) + r * kSlotBytes; }
  Mailbox& mailbox(int src, int dst) { return *reinterpret_cast<Mailbox*>(mail_at(src, dst)); }
  char* mail_data(int src, int dst) { return mail_at(src, dst) + sizeof(Mailbox); }

  Status barrier() override { return round(nullptr, 0, -1, nullptr); }

  Status broadcast(void* data, size_t bytes, int root) override {
    return broadcast_chunks(data, bytes, root, {});
  }

  // A pipelined broadcast: chunk i is round r = first + i and goes in slot r mod world (every
  // rank's slot is free during a broadcast), so the root writes up to `world` chunks ahead of the
  // slowest reader instead of waiting for every reader after each chunk. Slot s may take round r
  // once every rank has read the round that last used it: r − world inside this broadcast, and
  // the round before it (any slot) before. Non-roots publish `written` too, so that a later
  // collective round sees every rank at r.
  Status broadcast_chunks(void* data, size_t bytes, int root, const ChunkHooks& hooks) override {
    if (root < 0 || root >= world_) return error("broadcast", "root " + std::to_string(root));
    char* p = static_cast<char*>(data);
    const auto copy = [&](void* to, const void* from, size_t off, size_t n) {
      if (hooks.copy) {
        hooks.copy(to, from, off, n);
      } else {
        std::memcpy(to, from, n);
      }
    };
    const uint64_t first = round_ + 1;
    const size_t chunks = bytes == 0 ? 1 : (bytes + kSlotBytes - 1) / kSlotBytes;
    for (size_t i = 0; i < chunks; ++i) {
      const uint64_t r = first + i;
      const size_t off = i * kSlotBytes, n = std::min(kSlotBytes, bytes - off);
      char* s = slot(static_cast<int>(r % static_cast<uint64_t>(world_)));
      round_ = r;
      if (rank_ == root) {
        const uint64_t w = static_cast<uint64_t>(world_);
        const uint64_t freed = std::max<uint64_t>(first - 1, r > w ? r - w : 0);
        MILES_RETURN_IF_ERROR(wait("broadcast", -1, [&] {
          for (int k = 0; k < world_; ++k)
            if (block(k).read.load(std::memory_order_acquire) < freed) return false;
          return true;
        }));
        if (n > 0) copy(s, p + off, off, n);
        block(rank_).written.store(r, std::memory_order_release);
      } else {
        MILES_RETURN_IF_ERROR(wait("broadcast", root, [&] {
          return block(root).written.load(std::memory_order_acquire) >= r;
        }));
        if (n > 0) copy(p + off, s, off, n);
        block(rank_).written.store(r, std::memory_order_release);
      }
      block(rank_).read.store(r, std::memory_order_release);
      if (hooks.arrived && n > 0) hooks.arrived(off, n);
    }
    return Status::Ok();
  }

  Status allgather(const void* in, size_t bytes, void* out) override {
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t n = std::min(kSlotBytes, bytes - off);
      MILES_RETURN_IF_ERROR(round(const_cast<char*>(src + off), n, -2, [&](int r, const char* s) {
        std::memcpy(dst + r * bytes + off, s, n);
      }));
    }
    return Status::Ok();
  }

  Status send(const void* data, size_t bytes, int dst, uint32_t) override {
    if (dst < 0 || dst >= world_ || dst == rank_) return error("send", "to " + std::to_string(dst));
    return send_in_turn(data, bytes, dst, tickets_[dst]++);
  }

  // A thread does the send (a pipeline stage receives a gradient while its activation is still on
  // the way); sends to one destination still go in issue order (tickets).
  Result<std::unique_ptr<PendingSend>> isend(const void* data, size_t bytes, int dst,
                                             uint32_t tag) override {
    if (dst < 0 || dst >= world_ || dst == rank_)
      return error("isend", "to " + std::to_string(dst));
    class Pending final : public PendingSend {
     public:
      explicit Pending(std::thread t, std::shared_ptr<Status> s) : t_(std::move(t)), s_(s) {}
      ~Pending() override {
        if (t_.joinable()) t_.join();
      }
      Status wait() override {
        if (t_.joinable()) t_.join();
        return *s_;
      }

     private:
      std::thread t_;
      std::shared_ptr<Status> s_;
    };
    auto status = std::make_shared<Status>();
    const uint64_t ticket = tickets_[dst]++;
    std::thread t([this, data, bytes, dst, ticket, status] {
      *status = send_in_turn(data, bytes, dst, ticket);
    });
    return std::unique_ptr<PendingSend>(new Pending(std::move(t), status));
  }

  Status send_in_turn(const void* data, size_t bytes, int dst, uint64_t ticket) {
    std::atomic<uint64_t>& turn = serving_[dst];
    MILES_RETURN_IF_ERROR(wait("send to rank " + std::to_string(dst), dst,
                               [&] { return turn.load(std::memory_order_acquire) == ticket; }));
    const Status s = write_mailbox(data, bytes, dst);
    turn.store(ticket + 1, std::memory_order_release);
    return s;
  }

  Status write_mailbox(const void* data, size_t bytes, int dst) {
    Mailbox& m = mailbox(rank_, dst);
    const char* p = static_cast<const char*>(data);
    for (size_t off = 0; off < bytes || off == 0; off += kMailHalf) {
      const uint64_t k = m.posted.load(std::memory_order_relaxed);
      MILES_RETURN_IF_ERROR(wait("send to rank " + std::to_string(dst), dst, [&] {
        return m.taken.load(std::memory_order_acquire) + 2 > k;  // chunk k − 2 is out of its half
      }));
      const size_t n = std::min(kMailHalf, bytes - off);
      if (n > 0) std::memcpy(mail_data(rank_, dst) + (k % 2) * kMailHalf, p + off, n);
      m.bytes[k % 2] = n;
      m.posted.store(k + 1, std::memory_order_release);
      if (bytes == 0) break;
    }
    return Status::Ok();
  }

  Status recv(void* data, size_t bytes, int src, uint32_t) override {
    if (src < 0 || src >= world_ || src == rank_)
      return error("recv", "from " + std::to_string(src));
    Mailbox& m = mailbox(src, rank_);
    char* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes || off == 0; off += kMailHalf) {
      const uint64_t k = m.taken.load(std::memory_order_relaxed);
      MILES_RETURN_IF_ERROR(wait("recv from rank " + std::to_string(src), src,
                                 [&] { return m.posted.load(std::memory_order_acquire) > k; }));
      const size_t n = std::min(kMailHalf, bytes - off);
      if (m.bytes[k % 2] != n)
        return error("recv from rank " + std::to_string(src),
                     "the sender's message has another size (" + std::to_string(m.bytes[k % 2]) +
                         " bytes in this chunk, expected " + std::to_string(n) + ")");
      if (n > 0) std::memcpy(p + off, mail_data(src, rank_) + (k % 2) * kMailHalf, n);
      m.taken.store(k + 1, std::memory_order_release);
      if (bytes == 0) break;
    }
    return Status::Ok();
  }

  // A segment of its own for the members, met under a key made of the label, the members and how
  // many times this same group was made before (every member calls in the same order).
  Result<std::unique_ptr<Communicator>> new_group(std::span<const int> ranks,
                                                  std::string_view label) override {
    Meeting m = meeting_;
    m.world = static_cast<int>(ranks.size());
    m.world_ranks.clear();
    m.rank = -1;
    std::string members, world_members;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      if (r < 0 || r >= world_ || std::count(ranks.begin(), ranks.end(), r) != 1)
        return Status::Error("new_group of " + name_ + ": ranks must be distinct members");
      if (r == rank_) m.rank = static_cast<int>(i);
      m.world_ranks.push_back(world_ranks_[r]);
      members += (i ? "," : "") + std::to_string(r);
      world_members += (i ? "," : "") + std::to_string(world_ranks_[r]);
    }
    if (m.rank < 0) return Status::Error("new_group of " + name_ + ": this rank is not a member");
    const std::string key = std::string(label) + "[" + members + "]";
    m.prefix = meeting_.prefix + "/" + key + "#" + std::to_string(groups_made_[key]++);
    m.name = std::string(label) + "[" + world_members + "]";
    MILES_ASSIGN_OR_RETURN(std::unique_ptr<ShmCommunicator> g, join_segment(m));
    return std::unique_ptr<Communicator>(std::move(g));
  }

 private:
  char* mail_at(int src, int dst) {
    return base_ + sizeof(Header) + world_ * sizeof(RankBlock) + world_ * kSlotBytes +
           (static_cast<size_t>(src) * world_ + dst) * (sizeof(Mailbox) + kMailBytes);
  }

  Status error(const std::string& op, const std::string& why) {
    broken_ = true;
    return Status::Error(op + " in shared-memory group " + name_ + " (rank " +
                         std::to_string(rank_) + " of " + std::to_string(world_) + "): " + why);
  }

  // Spins briefly, then yields for up to 2 ms, then sleeps 100 µs at a time (an idle follower
  // waiting for its next command costs no core), until ready(); an error when `peer` (or, for -1,
  // any rank) has exited or the timeout passes.
  template <typename Ready>
  Status wait(const std::string& op, int peer, Ready ready) {
    if (broken_) return Status::Error(op + " in shared-memory group " + name_ + ": broken earlier");
    for (int i = 0; i < 2000; ++i) {
      if (ready()) return Status::Ok();
      _mm_pause();
    }
    const auto start = Clock::now(), deadline = start + timeout_;
    auto next_check = start;
    for (;;) {
      if (ready()) return Status::Ok();
      const auto now = Clock::now();
      if (now >= next_check) {
        next_check = now + std::chrono::milliseconds(1);
        for (int r = 0; r < world_; ++r) {
          if (r == rank_ || (peer >= 0 && r != peer)) continue;
          const int pid = block(r).pid.load(std::memory_order_relaxed);
          // A peer may publish what we wait for and exit between our ready() and this check (the
          // last barrier of a job): its stores precede its exit, so ask ready() once more.
          if (pid > 0 && !alive(pid) && !ready())
            return error(
                op, "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") has exited");
        }
        if (now >= deadline)
          return error(op, "timed out after " + std::to_string(timeout_.count()) + " ms");
      }
      if (now - start < std::chrono::milliseconds(2)) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  // One collective round: waits until every rank has read the previous round's slots, writes
  // `data` (n bytes) into this rank's slot when it is `root` or when root is -2 (all), publishes,
  // waits for every rank's data, then copies: root >= 0 → root's slot into data (non-roots); root
  // -2 → each rank's slot to take(r, slot). root -1: a barrier.
  template <typename Take = std::nullptr_t>
  Status round(char* data, size_t n, int root, Take take) {
    const uint64_t r = ++round_;
    MILES_RETURN_IF_ERROR(wait("collective", -1, [&] {
      for (int k = 0; k < world_; ++k)
        if (block(k).read.load(std::memory_order_acquire) < r - 1) return false;
      return true;
    }));
    if (n > 0 && (root == -2 || root == rank_)) std::memcpy(slot(rank_), data, n);
    block(rank_).written.store(r, std::memory_order_release);
    MILES_RETURN_IF_ERROR(wait("collective", -1, [&] {
      for (int k = 0; k < world_; ++k)
        if (block(k).written.load(std::memory_order_acquire) < r) return false;
      return true;
    }));
    if constexpr (!std::is_same_v<Take, std::nullptr_t>) {
      for (int k = 0; k < world_; ++k) take(k, slot(k));
    } else if (root >= 0 && root != rank_ && n > 0) {
      std::memcpy(data, slot(root), n);
    }
    block(rank_).read.store(r, std::memory_order_release);
    return Status::Ok();
  }

  int rank_, world_;
  char* base_;
  size_t bytes_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  std::vector<int> world_ranks_;
  Meeting meeting_;
  std::map<std::string, int> groups_made_;
  uint64_t round_ = 0;
  std::atomic<bool> broken_{false};
  // Per destination: the next send's ticket (issued by the caller's thread) and the ticket whose
  // turn it is to write the mailbox.
  std::vector<uint64_t> tickets_ = std::vector<uint64_t>(world_, 0);
  std::unique_ptr<std::atomic<uint64_t>[]> serving_ { new std::atomic<uint64_t>[ world_ ]() };
};

// Rank 0 creates and sizes the segment and publishes its name under the meeting's prefix; the
// others open it; once every member has mapped it, rank 0 unlinks the name.
Result<std::unique_ptr<ShmCommunicator>> join_segment(const Meeting& m) {
  const std::string where = "shared-memory group " + m.prefix + " (rank " + std::to_string(m.rank) +
                            " of " + std::to_string(m.world) + ")";
  TcpStoreClient& store = *m.store;
  const std::string key = m.prefix + "/shm/name";
  const size_t bytes = segment_bytes(m.world);
  std::string name;
  int fd = -1;
  if (m.rank == 0) {
    std::random_device rd;
    name = "/miles-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return Status::Error(where + ": shm_open " + name + ": " + std::strerror(errno));
    // Allocated now, so that a /dev/shm too small for it (a container's 64 MB) is this error, not
    // a SIGBUS at the first touch of a missing page.
    if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      const std::string e = std::strerror(err);
      close(fd);
      shm_unlink(name.c_str());
      return Status::Error(where + ": sizing " + name + " to " + std::to_string(bytes) +
                           " bytes: " + e);
    }
  } else {
    MILES_ASSIGN_OR_RETURN(name, store.get(key, m.timeout));
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) return Status::Error(where + ": shm_open " + name + ": " + std::strerror(errno));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    if (m.rank == 0) shm_unlink(name.c_str());
    return Status::Error(where + ": mmap: " + std::strerror(errno));
  }
  auto comm = std::make_unique<ShmCommunicator>(m, base, bytes);
  if (m.rank == 0) {  // a fresh segment is zero-filled: every counter starts at 0
    auto* h = static_cast<Header*>(base);
    h->magic = kMagic;
    h->world = m.world;
  }
  comm->block(m.rank).pid.store(getpid(), std::memory_order_release);
  if (m.rank == 0) MILES_RETURN_IF_ERROR(store.set(key, name));
  MILES_RETURN_IF_ERROR(store.add(m.prefix + "/shm/mapped", 1).status());
  if (m.rank == 0) {
    Status all = Status::Ok();
    for (auto deadline = Clock::now() + m.timeout;;) {
      auto n = store.get(m.prefix + "/shm/mapped", m.timeout);
      if (n.ok() && std::stoll(*n) >= m.world) break;
      if (Clock::now() >= deadline) {
        all = Status::Error(where + ": not every rank mapped " + name + " within the timeout");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    shm_unlink(name.c_str());
    MILES_RETURN_IF_ERROR(all);
  } else if (static_cast<Header*>(base)->magic != kMagic ||
             static_cast<Header*>(base)->world != m.world) {
    return Status::Error(where + ": " + name + " is not a miles segment of " +
                         std::to_string(m.world) + " ranks");
  }
  MILES_RETURN_IF_ERROR(comm->barrier());
  return comm;
}

}  // namespace

Result<std::unique_ptr<Communicator>> connect_shm(const CommOptions& o) {
  if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size)
    return Status::Error("connect_shm (rank " + std::to_string(o.rank) + " of " +
                         std::to_string(o.world_size) + "): need 0 <= rank < world_size");
  Meeting m;
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreClient> store,
                         TcpStoreClient::connect({o.store_address, o.timeout}));
  m.store = std::move(store);
  m.prefix = o.prefix;
  m.rank = o.rank;
  m.world = o.world_size;
  for (int r = 0; r < o.world_size; ++r) m.world_ranks.push_back(r);
  m.timeout = o.timeout;
  m.name = "shm:" + o.prefix;
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<ShmCommunicator> comm, join_segment(m));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace miles
