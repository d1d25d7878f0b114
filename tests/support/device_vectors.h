#pragma once
// What the GPU suites share: host vectors to and from device buffers, a seeded generator for
// their random data, and the skip when no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/runtime.h"
#include "core/splitmix64.h"

// Skips the calling test, saying why, where no CUDA GPU can be used.
#define ANVIL_REQUIRE_GPU()                                                                              \
  do {                                                                                                   \
    if (::anvil::cuda::devices().empty()) GTEST_SKIP() << "no CUDA GPU: " << ::anvil::cuda::unavailable_reason(); \
  } while (0)

namespace anvil::test {

// Fast enough to fill a 1 GB weight on the host.
using Rng = SplitMix64;

// A device copy of `host` (a zero-length vector still gets a valid one-byte buffer).
template <typename T>
cuda::DeviceBuffer to_device(const std::vector<T>& host) {
  cuda::DeviceBuffer buffer(std::max<size_t>(1, host.size() * sizeof(T)));
  cuda::copy_to_device(buffer.get(), host.data(), host.size() * sizeof(T));
  return buffer;
}

// The first n elements of `buffer`, after every queued kernel has finished.
template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  cuda::copy_to_host(host.data(), buffer.get(), n * sizeof(T));
  cuda::synchronize();
  return host;
}

}  // namespace anvil::test
