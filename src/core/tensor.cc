// Tensor storage, views and conversion to float32.
#include "miles/tensor.h"

#include <cstring>

namespace miles {

int64_t Tensor::numel() const {
  // A zero dimension anywhere makes it empty, whatever the others (whose product alone may not fit:
  // readers check the product in file order, which reaches the zero first).
  for (int64_t d : shape_)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape_) {
    MILES_CHECK(!__builtin_mul_overflow(n, d, &n), "tensor element count overflows int64");
  }
  return n;
}

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  const size_t bytes = static_cast<size_t>(t.nbytes());
  auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[bytes > 0 ? bytes : 1]());
  t.data_ = buf.get();
  t.owner_ = std::shared_ptr<const void>(buf, buf.get());
  t.mutable_ = true;
  return t;
}

Tensor Tensor::view(DType dtype, std::vector<int64_t> shape, const void* data,
                    std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::rows(int64_t r0, int64_t r1) const {
  MILES_CHECK(ndim() >= 1 && r0 >= 0 && r0 <= r1 && r1 <= dim(0), "row range inside the tensor");
  const int64_t row_bytes = dim(0) > 0 ? nbytes() / dim(0) : 0;
  std::vector<int64_t> shape = shape_;
  shape[0] = r1 - r0;
  Tensor t =
      view(dtype_, std::move(shape), static_cast<const uint8_t*>(data_) + r0 * row_bytes, owner_);
  return t;
}

Tensor Tensor::from_f32(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t = zeros(DType::kF32, std::move(shape));
  MILES_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "value count must match shape");
  if (!values.empty()) std::memcpy(t.mutable_data<float>(), values.data(), values.size() * 4);
  return t;
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out;
  to_f32(out);
  return out;
}

void Tensor::to_f32(std::vector<float>& out) const {
  const int64_t n = numel();
  out.resize(static_cast<size_t>(n));
  switch (dtype_) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), data_, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16: {
      const auto* p = data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::kF16: {
      const auto* p = data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
    default:
      MILES_CHECK(false, "to_f32 needs a floating-point tensor");
  }
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

}  // namespace miles
