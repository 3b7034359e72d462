// Run-time choice of the kernels' instruction set. All choices give identical bits (gemm_tile.h), so the
// choice is about speed only; MILES_ISA forces one (tests and benchmarks compare them).
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

#include "miles/check.h"
#include "miles/kernels.h"

namespace miles::kernels {

namespace {
Isa hardware_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}

// MILES_ISA's value: one of the three names; anything else is refused (a benchmark run under a
// misspelt ISA must not report the hardware's best as if it were the one asked for).
Isa isa_from_env(const char* env) {
  if (!std::strcmp(env, "scalar")) return Isa::kScalar;
  if (!std::strcmp(env, "avx2")) return Isa::kAvx2;
  if (!std::strcmp(env, "avx512")) return Isa::kAvx512;
  spdlog::critical("MILES_ISA must be scalar, avx2 or avx512, got '{}'", env);
  MILES_CHECK(false, "MILES_ISA is scalar, avx2 or avx512");
  return Isa::kScalar;
}
}  // namespace

Isa detect_isa() {
  static const Isa isa = [] {
    const Isa hw = hardware_isa();
    const char* env = std::getenv("MILES_ISA");
    if (!env) return hw;
    const Isa want = isa_from_env(env);
    if (static_cast<int>(want) <= static_cast<int>(hw)) return want;
    // Never above the hardware, and never silently: the run reports the ISA it got.
    spdlog::warn("MILES_ISA={} but this CPU supports up to {}: running that", env, isa_name(hw));
    return hw;
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
