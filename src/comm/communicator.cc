// Back-end independent parts of comm.h: the halving tree, the reductions built on all-gather, and
// the parallel groups of a layout.
#include <cmath>
#include <cstring>
#include <limits>

#include "miles/check.h"
#include "miles/comm.h"

namespace miles {

namespace {

// out = tree over rows [lo, hi); the same recursion as kernels::detail::chunked_sum's combine,
// applied to n columns at once (each column sees exactly the scalar tree's additions).
template <typename T>
void tree_rows(const T* rows, int64_t lo, int64_t hi, int64_t n, T* out) {
  if (hi - lo == 1) {
    std::memcpy(out, rows + lo * n, static_cast<size_t>(n) * sizeof(T));
    return;
  }
  const int64_t mid = lo + (hi - lo + 1) / 2;
  tree_rows(rows, lo, mid, n, out);
  std::vector<T> right(static_cast<size_t>(n));
  tree_rows(rows, mid, hi, n, right.data());
  for (int64_t j = 0; j < n; ++j) out[j] = out[j] + right[j];
}

template <typename T>
Status sum_deterministic(Communicator& comm, std::span<T> data) {
  if (comm.size() == 1 || data.empty()) return Status::Ok();
  std::vector<T> gathered(data.size() * static_cast<size_t>(comm.size()));
  MILES_RETURN_IF_ERROR(comm.allgather(data.data(), data.size_bytes(), gathered.data()));
  halving_tree_sum(gathered.data(), comm.size(), static_cast<int64_t>(data.size()), data.data());
  return Status::Ok();
}

}  // namespace

void halving_tree_sum(const float* rows, int64_t count, int64_t n, float* out) {
  MILES_CHECK(count >= 1 && n >= 0);
  tree_rows(rows, 0, count, n, out);
}

void halving_tree_sum(const double* rows, int64_t count, int64_t n, double* out) {
  MILES_CHECK(count >= 1 && n >= 0);
  tree_rows(rows, 0, count, n, out);
}

Status Communicator::all_reduce_sum_deterministic(std::span<float> data) {
  return sum_deterministic(*this, data);
}

Status Communicator::all_reduce_sum_deterministic(std::span<double> data) {
  return sum_deterministic(*this, data);
}

Status Communicator::all_reduce_max(std::span<float> data) {
  if (size() == 1 || data.empty()) return Status::Ok();
  const size_t n = data.size();
  std::vector<float> gathered(n * static_cast<size_t>(size()));
  MILES_RETURN_IF_ERROR(allgather(data.data(), data.size_bytes(), gathered.data()));
  for (size_t j = 0; j < n; ++j) {
    float m = gathered[j];
    for (int r = 1; r < size() && !std::isnan(m); ++r) {
      const float x = gathered[static_cast<size_t>(r) * n + j];
      if (std::isnan(x) || x > m) m = x;
    }
    data[j] = m;
  }
  return Status::Ok();
}

Status Communicator::all_reduce_sum(std::span<int64_t> data) {
  if (size() == 1 || data.empty()) return Status::Ok();
  const size_t n = data.size();
  std::vector<int64_t> gathered(n * static_cast<size_t>(size()));
  MILES_RETURN_IF_ERROR(allgather(data.data(), data.size_bytes(), gathered.data()));
  for (size_t j = 0; j < n; ++j) {
    uint64_t s = 0;  // wraps instead of overflowing into undefined behaviour
    for (int r = 0; r < size(); ++r) s += static_cast<uint64_t>(gathered[r * n + j]);
    data[j] = static_cast<int64_t>(s);
  }
  return Status::Ok();
}

Status Communicator::allgather(std::span<const float> in, std::span<float> out) {
  if (out.size() != in.size() * static_cast<size_t>(size())) {
    return Status::Error(name() + ": allgather output holds " + std::to_string(out.size()) +
                         " floats, expected " + std::to_string(size()) + " x " +
                         std::to_string(in.size()));
  }
  return allgather(in.data(), in.size_bytes(), out.data());
}

Result<ParallelGroups> make_parallel_groups(Communicator& world, const ParallelLayout& layout) {
  MILES_RETURN_IF_ERROR(layout.check_world_size(world.size()));
  ParallelGroups g;
  g.layout = layout;
  g.rank = world.rank();
  g.coord = layout.coord(g.rank);
  // Every rank creates tp, then dp, then pp: each creation waits only for that group's members, who
  // are all at the same step, so no rank waits on one that is blocked elsewhere.
  const std::vector<int> tp = layout.tp_group(g.rank);
  const std::vector<int> dp = layout.dp_group(g.rank);
  const std::vector<int> pp = layout.pp_group(g.rank);
  MILES_ASSIGN_OR_RETURN(g.tp, world.new_group(tp, "tp"));
  MILES_ASSIGN_OR_RETURN(g.dp, world.new_group(dp, "dp"));
  MILES_ASSIGN_OR_RETURN(g.pp, world.new_group(pp, "pp"));
  return g;
}

#if !defined(MILES_HAVE_CUDA)
Result<std::unique_ptr<Communicator>> connect_nccl(const CommOptions& options) {
  return Status::Error("connect_nccl (rank " + std::to_string(options.rank) +
                       "): miles was built without CUDA / NCCL (MILES_HAVE_CUDA is off)");
}
#endif

namespace {
class DoneSend final : public PendingSend {
 public:
  Status wait() override { return Status::Ok(); }
};
}  // namespace

Status Communicator::broadcast_chunks(void* data, size_t bytes, int root, const ChunkHooks& hooks) {
  MILES_RETURN_IF_ERROR(broadcast(data, bytes, root));
  if (hooks.arrived && bytes > 0) hooks.arrived(0, bytes);
  return Status::Ok();
}

Status Communicator::broadcast_buffers(std::span<const Buffer> buffers, int root,
                                       const BufferHooks& hooks) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    ChunkHooks one;
    if (hooks.copy)
      one.copy = [&](void* to, const void* from, size_t off, size_t n) {
        hooks.copy(i, to, from, off, n);
      };
    if (hooks.arrived) one.arrived = [&](size_t off, size_t n) { hooks.arrived(i, off, n); };
    MILES_RETURN_IF_ERROR(broadcast_chunks(buffers[i].data, buffers[i].bytes, root, one));
  }
  return Status::Ok();
}

Status Communicator::recv_buffers(std::span<const Buffer> buffers, int src, uint32_t tag,
                                  const std::function<void(size_t i)>& arrived) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    MILES_RETURN_IF_ERROR(recv(buffers[i].data, buffers[i].bytes, src, tag));
    if (arrived) arrived(i);
  }
  return Status::Ok();
}

Result<std::unique_ptr<PendingSend>> Communicator::isend(const void* data, size_t bytes, int dst,
                                                         uint32_t tag) {
  MILES_RETURN_IF_ERROR(send(data, bytes, dst, tag));
  return std::unique_ptr<PendingSend>(std::make_unique<DoneSend>());
}

}  // namespace miles
