// Private to weight_sync: one step per tensor of a version, on the machine's cores.
//
// Why: the disk-delta writer compresses and the reader decompresses every tensor of a version on
// its own; one thread left the other cores idle while a whole step waited for the weights. Each
// tensor's result depends on that tensor alone, so the bytes are the same on any number of
// threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "miles/status.h"

namespace miles::weight_sync_detail {

// fn(i) for every i in [0, n), tensors taken in index order by up to 8 threads (the machine's
// cores); the error of the lowest failing index, every other index still run.
inline Status for_each_tensor(size_t n, const std::function<Status(size_t)>& fn) {
  std::vector<Status> status(n, Status::Ok());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) status[i] = fn(i);
  };
  const size_t threads =
      std::min<size_t>({n, 8, std::max<size_t>(1, std::thread::hardware_concurrency())});
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& h : helpers) h.join();
  for (Status& s : status)
    if (!s.ok()) return s;
  return Status::Ok();
}

}  // namespace miles::weight_sync_detail
