// Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11, Random123).
//
// Why: a counter-based generator maps (key, counter) to random bits with no state, so the sampler
// can give each request position its own number (key = seed, counter = step) that no other request
// and no call order can disturb. Philox4x32-10 is the generator of cuRAND and PyTorch's CUDA RNG,
// so a GPU sampler can reproduce the same words; tests/sampler_test.cc checks Random123's
// known-answer vectors.
#pragma once

#include <array>
#include <cstdint>

namespace miles::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

}  // namespace miles::sampling
