// Run-time choice of the kernels' instruction set. All choices give identical bits (gemm_tile.h), so the
// choice is about speed only; MILES_ISA forces one (tests and benchmarks compare them).
#include <cstdlib>
#include <cstring>

#include "miles/kernels.h"

namespace miles::kernels {

namespace {
Isa hardware_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}
}  // namespace

Isa detect_isa() {
  static const Isa isa = [] {
    const Isa hw = hardware_isa();
    const char* env = std::getenv("MILES_ISA");
    if (!env) return hw;
    Isa want = hw;
    if (!std::strcmp(env, "scalar")) want = Isa::kScalar;
    if (!std::strcmp(env, "avx2")) want = Isa::kAvx2;
    if (!std::strcmp(env, "avx512")) want = Isa::kAvx512;
    return static_cast<int>(want) <= static_cast<int>(hw) ? want : hw;  // never above the hardware
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace miles::kernels
