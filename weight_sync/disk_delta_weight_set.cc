// WeightSet <-> TensorMap: the disk-delta transport moves raw bytes; models are built from TensorMaps.
#include <memory>

#include "miles/weight_sync/disk_delta.h"

namespace miles {

WeightSet weight_set_from_tensor_map(const TensorMap& map) {
  WeightSet out;
  for (const std::string& name : map.names()) {
    const Tensor* t = map.find(name);
    const auto* p = static_cast<const uint8_t*>(t->raw());
    out.push_back(NamedTensor{name, std::string(dtype_name(t->dtype())), t->shape(),
                              std::vector<uint8_t>(p, p + t->nbytes())});
  }
  return out;
}

Result<TensorMap> tensor_map_from_weight_set(WeightSet set) {
  auto owner = std::make_shared<const WeightSet>(std::move(set));
  TensorMap map;
  for (const NamedTensor& t : *owner) {
    const auto dtype = dtype_from_name(t.dtype);
    if (!dtype) return Status::Error("tensor '" + t.name + "' has dtype '" + t.dtype + "', unknown to the model");
    Tensor view = Tensor::view(*dtype, t.shape, t.bytes.data(), owner);
    if (view.nbytes() != static_cast<int64_t>(t.bytes.size()))
      return Status::Error("tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                           " bytes, its shape " + view.shape_string() + " needs " + std::to_string(view.nbytes()));
    map.insert(t.name, std::move(view), "disk-delta");
  }
  return map;
}

}  // namespace miles
