// Uniform [-1, 1) floats from a seeded mt19937: the kernels' tests' inputs.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace miles::test {

inline std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace miles::test
