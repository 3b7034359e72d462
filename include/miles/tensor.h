// Tensor: a typed, shaped view of bytes, owning them or keeping their owner (a mapped file) alive.
//
// Why: checkpoint readers hand out views into memory-mapped files without copying, and the model converts
// them once into packed float32 kernels' layouts. Row-major, contiguous; shape outermost first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "miles/check.h"
#include "miles/dtype.h"

namespace miles {

class Tensor {
 public:
  Tensor() = default;
  // New zero-filled tensor that owns its storage.
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);
  // View of `data` (not copied); `owner` keeps it alive (may be null for static data).
  static Tensor view(DType dtype, std::vector<int64_t> shape, const void* data,
                     std::shared_ptr<const void> owner);
  // Owning float32 tensor from values.
  static Tensor from_f32(std::vector<int64_t> shape, const std::vector<float>& values);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  const void* raw() const { return data_; }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  // Mutable access; only for tensors created by zeros() / from_f32().
  template <typename T>
  T* mutable_data() {
    MILES_CHECK(mutable_, "tensor is a read-only view");
    return static_cast<T*>(const_cast<void*>(data_));
  }

  // Rows [r0, r1) of a tensor of rank >= 1, as a read-only view sharing its storage and owner.
  Tensor rows(int64_t r0, int64_t r1) const;

  // Float32 copy of the values (bf16 / f16 / f32 sources; other dtypes are an invariant violation).
  std::vector<float> to_f32() const;
  // The same into `out`, reusing its storage (no allocation when it is large enough already).
  void to_f32(std::vector<float>& out) const;
  std::string shape_string() const;  // "[4, 64]"

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  const void* data_ = nullptr;
  bool mutable_ = false;
  std::shared_ptr<const void> owner_;
};

}  // namespace miles
