// The NCCL back-end of Communicator (built only with MILES_HAVE_CUDA; see comm.h for the contract).
//
// Bootstrap: join_members through the TcpStore (so a missing rank is named), then group rank 0
// creates the ncclUniqueId and publishes it at "<prefix>/nccl_id"; the others read it and all call
// ncclCommInitRank. Every operation is enqueued on the communicator's stream and then polled: done
// when the stream is idle, an error when NCCL reports an asynchronous error or the timeout passes
// (then the NCCL communicator is aborted, which frees the peers' pending operations to fail too,
// and this communicator is broken).
//
// Not yet run on a GPU (the development machine has none): compiled in CI only.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "miles/comm.h"
#include "miles/tcp_store.h"
#include "rendezvous.h"
#include "socket_io.h"

namespace miles {

namespace {

using Clock = std::chrono::steady_clock;

struct NcclShared {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStoreClient> store;
  std::chrono::milliseconds timeout{60'000};
  int device = 0;
};

std::string cuda_text(cudaError_t e) { return cudaGetErrorString(e); }
std::string nccl_text(ncclResult_t r) { return ncclGetErrorString(r); }

// Creates this rank's NCCL communicator of `world_ranks.size()` members under `prefix`.
Result<ncclComm_t> nccl_join(NcclShared& shared, const std::string& prefix, int rank,
                             const std::vector<int>& world_ranks, const std::string& name) {
  TcpStoreClient& store = *shared.store;
  const int size = static_cast<int>(world_ranks.size());
  MILES_RETURN_IF_ERROR(
      comm::detail::join_members(store, prefix, rank, world_ranks, name, shared.timeout));
  const std::string where = "nccl: joining group " + name + " as rank " + std::to_string(rank) +
                            " of " + std::to_string(size);
  ncclUniqueId id;
  const std::string key = prefix + "/nccl_id";
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return Status::Error(where + ": ncclGetUniqueId: " + nccl_text(r));
    }
    MILES_RETURN_IF_ERROR(
        store.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)))
            .with_context(where));
  } else {
    auto bytes = store.get(key, shared.timeout);
    if (!bytes.ok()) return bytes.status().with_context(where);
    if (bytes->size() != sizeof(id)) return Status::Error(where + ": malformed NCCL unique id");
    std::memcpy(&id, bytes->data(), sizeof(id));
  }
  if (cudaError_t e = cudaSetDevice(shared.device); e != cudaSuccess) {
    return Status::Error(where + ": cudaSetDevice(" + std::to_string(shared.device) +
                         "): " + cuda_text(e));
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, size, id, rank); r != ncclSuccess) {
    return Status::Error(where + ": ncclCommInitRank: " + nccl_text(r));
  }
  return comm;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclShared> shared, ncclComm_t comm, int rank,
                   std::vector<int> world_ranks, std::string name, std::string prefix)
      : shared_(std::move(shared)),
        comm_(comm),
        rank_(rank),
        world_ranks_(std::move(world_ranks)),
        name_(std::move(name)),
        prefix_(std::move(prefix)) {
    cudaSetDevice(shared_->device);
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
      broken_ = "cudaStreamCreate failed";
      stream_ = nullptr;
    }
  }
  ~NcclCommunicator() override {
    cudaSetDevice(shared_->device);
    if (comm_ != nullptr) {
      if (broken_.empty()) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }

  Status barrier() override {
    MILES_RETURN_IF_ERROR(ensure_scratch(sizeof(float), "barrier"));
    return run("barrier", [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_);
    });
  }

  Status broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) return bad_rank("broadcast", "root", root);
    if (bytes == 0) return Status::Ok();
    return run("broadcast from rank " + std::to_string(root),
               [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }

  Status allgather(const void* in, size_t bytes, void* out) override {
    if (bytes == 0) return Status::Ok();
    return run("allgather",
               [&] { return ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_); });
  }

  Status send(const void* data, size_t bytes, int dst, uint32_t tag) override {
    if (dst < 0 || dst >= size() || dst == rank()) return bad_rank("send", "destination", dst);
    return run("send to rank " + std::to_string(dst),
               [&] { return ncclSend(data, bytes, ncclUint8, dst, comm_, stream_); });
  }

  Status recv(void* data, size_t bytes, int src, uint32_t tag) override {
    if (src < 0 || src >= size() || src == rank()) return bad_rank("recv", "source", src);
    return run("recv from rank " + std::to_string(src),
               [&] { return ncclRecv(data, bytes, ncclUint8, src, comm_, stream_); });
  }

  Status all_reduce_sum_deterministic(std::span<float> data) override {
    return staged("all_reduce_sum_deterministic", data, [&](const float* rows, float* out) {
      halving_tree_sum(rows, size(), static_cast<int64_t>(data.size()), out);
    });
  }
  Status all_reduce_sum_deterministic(std::span<double> data) override {
    return staged("all_reduce_sum_deterministic", data, [&](const double* rows, double* out) {
      halving_tree_sum(rows, size(), static_cast<int64_t>(data.size()), out);
    });
  }
  Status all_reduce_max(std::span<float> data) override {
    const size_t n = data.size();
    return staged("all_reduce_max", data, [&](const float* rows, float* out) {
      for (size_t j = 0; j < n; ++j) {
        float m = rows[j];
        for (int r = 1; r < size() && !std::isnan(m); ++r) {
          const float x = rows[static_cast<size_t>(r) * n + j];
          if (std::isnan(x) || x > m) m = x;
        }
        out[j] = m;
      }
    });
  }
  Status all_reduce_sum(std::span<int64_t> data) override {
    if (data.empty()) return Status::Ok();
    // Integer addition is associative: NCCL's order does not matter.
    return run("all_reduce_sum(int64)", [&] {
      return ncclAllReduce(data.data(), data.data(), data.size(), ncclInt64, ncclSum, comm_,
                           stream_);
    });
  }

  Result<std::unique_ptr<Communicator>> new_group(std::span<const int> ranks,
                                                  std::string_view label) override {
    const std::string op = "new_group " + std::string(label);
    if (!broken_.empty()) return failed_earlier(op);
    std::vector<int> members(ranks.begin(), ranks.end()), world;
    int my_index = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      const int r = members[i];
      if (r < 0 || r >= size()) return bad_rank(op.c_str(), "member", r);
      if (std::count(members.begin(), members.end(), r) > 1) {
        return Status::Error(context(op) + ": rank " + std::to_string(r) + " listed twice");
      }
      if (r == rank()) my_index = static_cast<int>(i);
      world.push_back(world_ranks_[r]);
    }
    if (my_index < 0) return Status::Error(context(op) + ": this rank is not a member");
    const std::string group_name = std::string(label) + "[" + comm::detail::ranks_text(world) + "]";
    const int n = group_creations_[group_name]++;
    const std::string prefix = prefix_ + "/group/" + group_name + "#" + std::to_string(n);
    MILES_ASSIGN_OR_RETURN(ncclComm_t comm,
                           nccl_join(*shared_, prefix, my_index, world, group_name));
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(shared_, comm, my_index, std::move(world), group_name, prefix));
  }

 private:
  std::string context(const std::string& op) const {
    return "nccl " + op + " in group " + name_ + " (rank " + std::to_string(rank_) + " of " +
           std::to_string(size()) + ")";
  }
  Status failed_earlier(const std::string& op) const {
    return Status::Error(context(op) + ": the communicator failed earlier (" + broken_ + ")");
  }
  Status bad_rank(const char* op, const char* what, int r) const {
    return Status::Error(context(op) + ": " + what + " " + std::to_string(r) +
                         " is not another rank of this group of " + std::to_string(size()));
  }
  Status fail(const std::string& op, std::string why) {
    broken_ = std::move(why);
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    return Status::Error(context(op) + ": " + broken_);
  }

  Status ensure_scratch(size_t bytes, const std::string& op) {
    if (scratch_bytes_ >= bytes) return Status::Ok();
    cudaSetDevice(shared_->device);
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    if (cudaError_t e = cudaMalloc(&scratch_, bytes); e != cudaSuccess) {
      return Status::Error(context(op) + ": cudaMalloc(" + std::to_string(bytes) +
                           "): " + cuda_text(e));
    }
    cudaMemset(scratch_, 0, bytes);
    scratch_bytes_ = bytes;
    return Status::Ok();
  }

  // Enqueues `enqueue` and waits for the stream, bounded by the timeout.
  template <typename Enqueue>
  Status run(const std::string& op, Enqueue enqueue) {
    if (!broken_.empty()) return failed_earlier(op);
    cudaSetDevice(shared_->device);
    if (ncclResult_t r = enqueue(); r != ncclSuccess) return fail(op, nccl_text(r));
    const auto deadline = Clock::now() + shared_->timeout;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) return fail(op, cuda_text(e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return fail(op, nccl_text(async));
      if (Clock::now() > deadline) {
        return fail(op, "timed out after " + std::to_string(shared_->timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // All-gathers `data` (device) into device scratch, copies it to the host, reduces it there with
  // `reduce(rows, out)` and copies the result back into `data`.
  template <typename T, typename Reduce>
  Status staged(const std::string& op, std::span<T> data, Reduce reduce) {
    if (data.empty()) return Status::Ok();
    const size_t gathered = data.size_bytes() * static_cast<size_t>(size());
    MILES_RETURN_IF_ERROR(ensure_scratch(gathered, op));
    MILES_RETURN_IF_ERROR(allgather(data.data(), data.size_bytes(), scratch_));
    std::vector<T> rows(data.size() * static_cast<size_t>(size())), out(data.size());
    if (cudaError_t e = cudaMemcpy(rows.data(), scratch_, gathered, cudaMemcpyDeviceToHost);
        e != cudaSuccess) {
      return fail(op, cuda_text(e));
    }
    reduce(rows.data(), out.data());
    if (cudaError_t e =
            cudaMemcpy(data.data(), out.data(), data.size_bytes(), cudaMemcpyHostToDevice);
        e != cudaSuccess) {
      return fail(op, cuda_text(e));
    }
    return Status::Ok();
  }

  std::shared_ptr<NcclShared> shared_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;  // device memory: the barrier's float, gathered partials
  size_t scratch_bytes_ = 0;
  int rank_ = 0;
  std::vector<int> world_ranks_;
  std::string name_;
  std::string prefix_;
  std::map<std::string, int> group_creations_;
  std::string broken_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> connect_nccl(const CommOptions& options) {
  const std::string where = "connect_nccl (rank " + std::to_string(options.rank) + " of " +
                            std::to_string(options.world_size) + ")";
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size) {
    return Status::Error(where + ": need 0 <= rank < world_size");
  }
  if (options.timeout.count() <= 0) return Status::Error(where + ": timeout must be positive");
  if (options.store_address.empty()) return Status::Error(where + ": no store address");
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    return Status::Error(where + ": no CUDA device (" + cuda_text(e) + ")");
  }
  auto shared = std::make_shared<NcclShared>();
  shared->timeout = options.timeout;
  shared->device = options.device >= 0 ? options.device : options.rank % devices;
  if (shared->device >= devices) {
    return Status::Error(where + ": CUDA device " + std::to_string(shared->device) +
                         " does not exist (" + std::to_string(devices) + " visible)");
  }
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
  std::vector<int> world(options.world_size);
  for (int r = 0; r < options.world_size; ++r) world[r] = r;
  const std::string prefix = options.prefix + "/world";
  MILES_ASSIGN_OR_RETURN(ncclComm_t comm, nccl_join(*shared, prefix, options.rank, world, "world"));
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(shared), comm, options.rank,
                                                            std::move(world), "world", prefix));
}

}  // namespace miles
