// libFuzzer target: arbitrary bytes through parse_safetensors; accepted files have every byte of
// every tensor read (to_f32 for float types), so a bounds check that lets a bad offset through
// becomes an ASan report.
#include <cstddef>
#include <cstdint>

#include "miles/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = miles::parse_safetensors(data, size, "fuzz.safetensors", nullptr);
  if (!r.ok()) return 0;
  volatile uint32_t sink = 0;
  for (const auto& name : r->names()) {
    const miles::Tensor* t = r->find(name);
    const miles::DType d = t->dtype();
    if (d == miles::DType::kF32 || d == miles::DType::kBF16 || d == miles::DType::kF16) {
      for (float v : t->to_f32()) sink = sink + static_cast<uint32_t>(v == v);
    } else {
      const auto* p = static_cast<const uint8_t*>(t->raw());
      for (int64_t i = 0; i < t->nbytes(); ++i) sink = sink + p[i];
    }
  }
  return 0;
}
