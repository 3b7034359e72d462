// Communicator: a process group and its collectives, with a deterministic sum.
//
// Why: tensor, pipeline and data parallelism need the same few operations (all-gather, broadcast,
// send/recv, sums, a barrier) over groups of ranks, on CPU (Gloo over TCP) and later on GPU (NCCL).
// The trainer programs against this interface; the back-end is chosen once at start-up.
//
// Determinism (docs/contracts.md §6): a ring all-reduce adds partials in an order that depends on
// the rank count and on the ring position, so results differ between layouts and even between
// ranks. Here every sum is an all-gather of the partials followed, on every rank, by the same
// balanced halving tree over rank index as the kernels' chunk tree (kernels.h: split [lo, hi) at lo
// + ceil((hi - lo) / 2)). So:
//  * every rank gets bitwise the same result, whatever the arrival order;
//  * a row-parallel dot split over a power-of-two tp on chunk boundaries reproduces the
//  single-process
//    chunk tree exactly (tests/comm_test.cc proves it against kernels::detail::chunked_sum).
// The cost is world_size x the buffer in memory and traffic; fine for TP activations and metrics,
// and the price of reproducible DP gradients.
//
// Errors: every operation returns a Status; a peer that is gone or silent gives an error within
// CommOptions::timeout naming the group, the rank and the operation, never a hang. After a
// transport error a communicator is broken: later calls fail at once (make a new one).
//
// Threading: a communicator is used by one thread at a time, and every member of a group must issue
// the same collectives in the same order (as with MPI / NCCL).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "miles/parallel_layout.h"
#include "miles/status.h"

namespace miles {

// A send in flight (Communicator::isend): the buffer must stay alive and unchanged until wait().
class PendingSend {
 public:
  virtual ~PendingSend() = default;
  virtual Status wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The world rank of each member, indexed by group rank (identity for the world communicator).
  virtual const std::vector<int>& world_ranks() const = 0;
  // A label for messages, e.g. "world" or "tp[0,1]".
  virtual const std::string& name() const = 0;
  // Whether the members meet in one shared-memory segment (connect_shm): all on one host.
  virtual bool shared_memory() const { return false; }

  virtual Status barrier() = 0;
  // Root's `bytes` bytes at `data` are copied to `data` on every rank.
  virtual Status broadcast(void* data, size_t bytes, int root) = 0;
  // broadcast, handing each piece over as it is done, in order, so that a receiver checks what
  // came while the rest is on its way.
  struct ChunkHooks {
    // Where the transport copies piece [offset, offset + n) through memory it owns (the root: from
    // `data` into a staging buffer; the others: from one into `data`), it calls this instead of
    // memcpy when set: a caller that hashes the bytes does it on the way, one pass over memory.
    std::function<void(void* to, const void* from, size_t offset, size_t n)> copy;
    // Runs once bytes [offset, offset + n) of `data` are final on this rank (root: handed to the
    // transport; the others: arrived), after `copy` if it moved them.
    std::function<void(size_t offset, size_t n)> arrived;
  };
  // The default: one broadcast, then `arrived` for the whole buffer.
  virtual Status broadcast_chunks(void* data, size_t bytes, int root, const ChunkHooks& hooks);
  // Several buffers broadcast one after the other as one stream (a bucket's tensors), each as
  // broadcast_chunks would, the hooks told which buffer (its index) a piece belongs to. A
  // transport whose receiver must post a receive before the sender's bytes move (Gloo) posts every
  // buffer's at once, so that no round trip between two buffers stalls the stream. The default:
  // broadcast_chunks for each buffer in turn.
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  struct BufferHooks {
    std::function<void(size_t buffer, void* to, const void* from, size_t offset, size_t n)> copy;
    std::function<void(size_t buffer, size_t offset, size_t n)> arrived;
  };
  virtual Status broadcast_buffers(std::span<const Buffer> buffers, int root,
                                   const BufferHooks& hooks);
  // out[r * bytes, (r + 1) * bytes) = rank r's `in`, for every r (out holds size() * bytes bytes;
  // rank order).
  virtual Status allgather(const void* in, size_t bytes, void* out) = 0;
  // Point-to-point (pipeline activations). Blocks until the buffer is handed over / filled. Sender
  // and receiver must agree on `bytes` and `tag`. Gloo matches messages by tag; the shared-memory
  // communicator delivers one pair's messages in the order they were sent and does not read tags:
  // a receiver must take a pair's messages in their sending order (the pipeline schedule and its
  // tap channel do).
  virtual Status send(const void* data, size_t bytes, int dst, uint32_t tag) = 0;
  // A send that returns at once; the transfer completes while the caller goes on (e.g. a pipeline
  // stage receiving a gradient while its activation is still on the way). The default sends
  // synchronously and returns a completed handle.
  virtual Result<std::unique_ptr<PendingSend>> isend(const void* data, size_t bytes, int dst,
                                                     uint32_t tag);
  virtual Status recv(void* data, size_t bytes, int src, uint32_t tag) = 0;
  // Several messages from `src` on one tag, into the buffers in order (each as recv would take
  // it), `arrived(i)` called once buffer i is filled, in order. A transport whose sender waits
  // for the receive to be posted (Gloo) posts every receive at once, so that the sender streams
  // the messages back to back instead of waiting a round trip for each. The default: recv for
  // each buffer in turn.
  virtual Status recv_buffers(std::span<const Buffer> buffers, int src, uint32_t tag,
                              const std::function<void(size_t i)>& arrived);

  // A communicator over `ranks` (this group's numbering, distinct; the new group rank of ranks[i]
  // is i). Only the members call it, each with the same `ranks` and `label`; it blocks until all of
  // them have. `label` only has to tell apart different groups over the same ranks (e.g. "tp" and
  // "dp" when they coincide). note: call only if rank() is in `ranks`.
  virtual Result<std::unique_ptr<Communicator>> new_group(std::span<const int> ranks,
                                                          std::string_view label) = 0;

  // Element-wise sum over ranks, bitwise identical on all ranks: all-gather, then the halving tree
  // over rank index (halving_tree_sum). `data` holds this rank's partials on entry and the sums on
  // return.
  virtual Status all_reduce_sum_deterministic(std::span<float> data);
  virtual Status all_reduce_sum_deterministic(std::span<double> data);
  // Element-wise max over ranks (exact; NaN if any rank has NaN).
  virtual Status all_reduce_max(std::span<float> data);
  // Metrics (losses, token counts): the deterministic sum in double / exact in int64.
  Status all_reduce_sum(std::span<double> data) { return all_reduce_sum_deterministic(data); }
  virtual Status all_reduce_sum(std::span<int64_t> data);

  // Typed conveniences.
  Status broadcast(std::span<float> data, int root) {
    return broadcast(data.data(), data.size_bytes(), root);
  }
  Status allgather(std::span<const float> in,
                   std::span<float> out);  // out.size() == size() * in.size()
  Status send(std::span<const float> data, int dst, uint32_t tag) {
    return send(data.data(), data.size_bytes(), dst, tag);
  }
  Status recv(std::span<float> data, int src, uint32_t tag) {
    return recv(data.data(), data.size_bytes(), src, tag);
  }
};

// out[j] = the balanced halving tree over r of rows[r * n + j], r in [0, count): the combine order
// of kernels.h (split [lo, hi) at lo + ceil((hi - lo) / 2), left + right). count >= 1; out may not
// alias rows.
void halving_tree_sum(const float* rows, int64_t count, int64_t n, float* out);
void halving_tree_sum(const double* rows, int64_t count, int64_t n, double* out);

struct CommOptions {
  int rank = 0;
  int world_size = 1;
  // "host:port" of a TcpStoreServer (tcp_store.h) shared by the job.
  std::string store_address;
  // Rank 0 starts the store server itself, bound to store_address (the communicator owns it; keep
  // rank 0's communicator alive until the others are done with the store, e.g. end with a barrier).
  bool host_store = false;
  // The address this rank's transport binds to and advertises to its peers. Loopback by default
  // (one host); set to this host's address on the cluster network for multi-host jobs.
  std::string host = "127.0.0.1";
  // Alternatively a network interface ("eth0"); overrides `host` when set.
  std::string iface;
  // Bound on every wait: joining, each collective, each send / recv.
  std::chrono::milliseconds timeout{60'000};
  // Store key namespace: several jobs (or several worlds of one test) can share a store.
  std::string prefix = "miles";
  // NCCL only: the CUDA device of this rank; -1 picks rank % (number of visible devices).
  int device = -1;
};

// The CPU back-end: Gloo's TCP transport, rendezvous through the TcpStore. Blocks until all
// world_size ranks have joined; an error names the ranks that did not show up within the timeout
// and the store.
Result<std::unique_ptr<Communicator>> connect_gloo(const CommOptions& options);

// Ranks on one host: one POSIX shared-memory segment (named through the TcpStore, unlinked once
// everyone has mapped it). Same semantics as connect_gloo for barrier, broadcast, allgather and the
// sums; send / recv ignore `tag` (messages between a pair arrive in issue order, as with NCCL);
// new_group makes a segment per subgroup. Waits spin, then yield, then sleep; a rank that has
// exited is an error at once, a silent one after `timeout`. For latency-bound groups on one host (the tensor-parallel engine's
// per-layer all-reduces), where Gloo's loopback TCP costs ~0.2 ms a collective (docs/benchmarks.md).
Result<std::unique_ptr<Communicator>> connect_shm(const CommOptions& options);

// The GPU back-end (built when MILES_HAVE_CUDA; otherwise it returns an error saying so). Same
// interface, but every data pointer / span is CUDA device memory on CommOptions::device. Operations
// are enqueued on the communicator's own stream and waited for (polling, bounded by the timeout; on
// timeout the NCCL communicator is aborted) before they return. The NCCL unique id travels through
// the TcpStore. The deterministic sum and the max stage the gathered partials through host memory
// and apply the same halving_tree_sum as the CPU back-end, so CPU and GPU results agree bit for bit
// (a device-side tree is a later optimisation). send / recv ignore `tag`: NCCL orders messages
// between a pair by issue order.
Result<std::unique_ptr<Communicator>> connect_nccl(const CommOptions& options);

// This rank's tensor-, data- and pipeline-parallel groups (group rank = coordinate in that
// dimension).
struct ParallelGroups {
  ParallelLayout layout;
  int rank = 0;  // world rank
  RankCoord coord;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> pp;
};

// Every world rank calls it with the same layout (world.size() must equal layout.world_size()).
Result<ParallelGroups> make_parallel_groups(Communicator& world, const ParallelLayout& layout);

}  // namespace miles
