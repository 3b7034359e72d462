// make_device_model: the backend for each Device; the device names.
#include "miles/device_model.h"

#include "device/device_backward_impl.h"
#include "device/host_backend.h"

namespace miles {

#if defined(MILES_HAVE_CUDA)
namespace device {
// device_model_cuda.cu
Status cuda_backend_available();
Result<std::unique_ptr<DeviceModel>> make_cuda_model(const ModelConfig& config,
                                                     const TensorMap& weights,
                                                     const DeviceKvGeometry& kv, ThreadPool* pool);
}  // namespace device
#endif

const char* device_name(Device d) {
  switch (d) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
    case Device::kEmulated:
      return "emulated";
  }
  return "?";
}

const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names = {
      device_name(Device::kCpu), device_name(Device::kCuda), device_name(Device::kEmulated)};
  return names;
}

Result<Device> parse_device(const std::string& name) {
  const std::vector<std::string>& names = device_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) return static_cast<Device>(i);
  return Status::Error("unknown device '" + name + "' (expected cpu, cuda or emulated)");
}

Status cuda_available() {
#if defined(MILES_HAVE_CUDA)
  return device::cuda_backend_available();
#else
  return Status::Error(
      "this build of miles has no CUDA backend (configure with -DMILES_CUDA=ON on a machine with "
      "nvcc, cuBLAS and NCCL)");
#endif
}

Status device_supports(const ModelConfig& c) {
  if (c.tensor_parallel > 1)
    return Status::Error("device forward: tensor_parallel " + std::to_string(c.tensor_parallel) +
                         ": a device model holds one rank's whole model");
  if (c.head_dim > device::kMaxHeadDim)
    return Status::Error("device forward: head_dim " + std::to_string(c.head_dim) +
                         " is past the device kernels' " + std::to_string(device::kMaxHeadDim));
  return Status::Ok();
}

Status check_device_engines(const std::string& name, const ModelConfig& config) {
  MILES_ASSIGN_OR_RETURN(Device d, parse_device(name));
  if (d == Device::kCpu) return Status::Ok();
  MILES_RETURN_IF_ERROR(device_supports(config));
  if (d == Device::kCuda) return cuda_available();
  return Status::Ok();
}

Result<std::unique_ptr<DeviceModel>> make_device_model(Device device, const ModelConfig& config,
                                                       const TensorMap& weights,
                                                       const DeviceKvGeometry& kv,
                                                       ThreadPool* host_pool) {
  switch (device) {
    case Device::kEmulated: {
      auto b = std::make_shared<device::HostBackend>(host_pool);
      MILES_ASSIGN_OR_RETURN(auto m, device::BackendModel<device::HostBackend>::create(
                                         b, config, weights, kv, host_pool));
      return std::unique_ptr<DeviceModel>(std::move(m));
    }
    case Device::kCuda:
#if defined(MILES_HAVE_CUDA)
      MILES_RETURN_IF_ERROR(cuda_available());
      return device::make_cuda_model(config, weights, kv, host_pool);
#else
      return cuda_available();
#endif
    case Device::kCpu:
      break;
  }
  return Status::Error("device 'cpu' runs the CPU Model, not a DeviceModel");
}

}  // namespace miles
