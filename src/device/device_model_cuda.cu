// The CUDA backend of DeviceModel: device memory from cudaMalloc, each launch a 1-D grid with one
// thread per work item of a device_kernels.h functor, all on the default stream (launches run in
// order; the logits' copy back waits for them). Built with --fmad=false and IEEE division and
// square root, so the kernels keep the CPU's bits (device_math.h).
#include <cuda_runtime.h>

#include <string>

#include "device/device_backward_impl.h"

namespace miles::device {

namespace {

template <class K>
__global__ void run_items(K k, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) k(i);
}

// A block kernel's phases with a barrier after each (device_tiled_gemm.h).
template <class K>
__global__ void __launch_bounds__(K::kThreads) run_blocks(K k) {
  __shared__ typename K::Shared sh;
  typename K::State st;
  const int phases = k.phases();
  for (int p = 0; p < phases; ++p) {
    k.run(p, blockIdx.x, static_cast<int>(threadIdx.x), st, sh);
    __syncthreads();
  }
}

Status cuda_error(const char* what, cudaError_t e) {
  return Status::Error(std::string("CUDA ") + what + ": " + cudaGetErrorName(e) + " (" +
                       cudaGetErrorString(e) + ")");
}

class CudaBackend {
 public:
  Device device() const { return Device::kCuda; }
  Status alloc(size_t bytes, void** p) {
    if (cudaError_t e = cudaMalloc(p, bytes); e != cudaSuccess)
      return cuda_error(("allocating " + std::to_string(bytes) + " bytes").c_str(), e);
    if (cudaError_t e = cudaMemset(*p, 0, bytes); e != cudaSuccess)
      return cuda_error("clearing an allocation", e);
    return Status::Ok();
  }
  void release(void* p) { (void)cudaFree(p); }
  Status upload(void* dst, const void* src, size_t bytes) {
    if (cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice); e != cudaSuccess)
      return cuda_error("copying to the device", e);
    return Status::Ok();
  }
  Status download(void* dst, const void* src, size_t bytes) {
    if (cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess)
      return cuda_error("copying from the device", e);
    return Status::Ok();
  }
  template <class K>
  void launch(int64_t n, const K& k) {
    if (n <= 0) return;
    constexpr int kThreads = 128;
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    run_items<<<static_cast<unsigned>(blocks), kThreads>>>(k, n);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess && first_.ok())
      (void)(first_ = cuda_error("launching a kernel", e));
  }
  template <class K>
  void launch_blocks(int64_t blocks, const K& k) {
    if (blocks <= 0) return;
    run_blocks<<<static_cast<unsigned>(blocks), K::kThreads>>>(k);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess && first_.ok())
      (void)(first_ = cuda_error("launching a block kernel", e));
  }
  Status sync() {
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess && first_.ok())
      (void)(first_ = cuda_error("running the kernels", e));
    return first_;
  }

 private:
  Status first_ = Status::Ok();
};

}  // namespace

Status cuda_backend_available() {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess)
    return cuda_error("finding a GPU", e);
  if (n == 0) return Status::Error("CUDA: no GPU is visible");
  return Status::Ok();
}

Result<std::unique_ptr<DeviceModel>> make_cuda_model(const ModelConfig& config,
                                                     const TensorMap& weights,
                                                     const DeviceKvGeometry& kv, ThreadPool* pool) {
  auto b = std::make_shared<CudaBackend>();
  MILES_ASSIGN_OR_RETURN(auto m, BackendModel<CudaBackend>::create(b, config, weights, kv, pool));
  return std::unique_ptr<DeviceModel>(std::move(m));
}

}  // namespace miles::device
