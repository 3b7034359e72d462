// The host emulation backend: device memory is host memory and a launch runs k(i) for every i as
// host code, spread over a thread pool (items are independent, so any split gives the same bits).
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "miles/device_model.h"
#include "miles/thread_pool.h"

namespace miles::device {

class HostBackend {
 public:
  explicit HostBackend(ThreadPool* pool) : pool_(pool) {}
  Device device() const { return Device::kEmulated; }
  Status alloc(size_t bytes, void** p) {
    *p = std::calloc(bytes, 1);
    if (*p == nullptr)
      return Status::Error("emulated device: cannot allocate " + std::to_string(bytes) + " bytes");
    return Status::Ok();
  }
  void release(void* p) { std::free(p); }
  Status upload(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status download(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  template <class K>
  void launch(int64_t n, const K& k) {
    parallel_ranges(pool_, n, 64, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) k(i);
    });
  }
  // A block kernel (device_tiled_gemm.h): per block, its phases in order, each phase run by every
  // thread of the block before the next starts; blocks spread over the pool.
  template <class K>
  void launch_blocks(int64_t blocks, const K& k) {
    parallel_for(pool_, blocks, [&](int64_t b) {
      thread_local std::unique_ptr<typename K::Shared> sh;
      thread_local std::vector<typename K::State> st;
      if (!sh) sh = std::make_unique<typename K::Shared>();
      st.resize(K::kThreads);
      const int phases = k.phases();
      for (int p = 0; p < phases; ++p)
        for (int t = 0; t < K::kThreads; ++t) k.run(p, b, t, st[t], *sh);
    });
  }
  Status sync() { return Status::Ok(); }

 private:
  ThreadPool* pool_;
};

}  // namespace miles::device
