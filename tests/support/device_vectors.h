#pragma once
// Host vectors to and from device buffers, for the GPU suites.
#include <algorithm>
#include <vector>

#include "backend/cuda/runtime.h"

namespace anvil::test {

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
