// libFuzzer target: arbitrary bytes through the in-memory llama2.c reader; accepted files have
// every tensor read in full, so a size check that lets a lying header through becomes an ASan
// report.
#include <cstddef>
#include <cstdint>

#include "checkpoint/llama2c_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = miles::parse_llama2c(data, size, "fuzz.bin", nullptr);
  if (!r.ok()) return 0;
  volatile uint32_t sink = 0;
  for (const auto& name : r->weights.names())
    for (float v : r->weights.find(name)->to_f32()) sink = sink + static_cast<uint32_t>(v == v);
  return 0;
}
