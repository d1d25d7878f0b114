#pragma once
// splitmix64 (Steele, Lea and Flood, 2014): a 64-bit generator whose n-th output is a pure
// function of seed + n * gamma, so a GPU thread can jump to any draw. The dummy weights (CPU in
// models/weights.cpp, GPU in backend/cuda/dummy_fill.cu) must draw the same values, and the test
// and harness data come from it too, so there is one definition.
#include <cstdint>

#include "core/host_device.h"

namespace anvil {

inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// The output function applied to a state.
ANVIL_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Advances `state` and returns the next draw.
ANVIL_HOST_DEVICE inline uint64_t splitmix64(uint64_t& state) { return splitmix64_mix(state += kSplitMix64Gamma); }

struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() { return splitmix64(state); }
  // Uniform in [-1, 1) on a 2^-23 grid.
  float uniform() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) / float(1 << 23); }
};

}  // namespace anvil
