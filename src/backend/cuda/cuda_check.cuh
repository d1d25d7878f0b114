#pragma once
// Error checking shared by the CUDA sources: every runtime call's status is checked, and a
// failure throws anvil::Error naming the call, so a bad launch never passes silently. (fmt is
// kept out of nvcc's way: the throwing happens in runtime.cpp.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace anvil::cuda {
[[noreturn]] void throw_cuda_error(const char* call, int status, const char* file, int line);
inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks of 256 threads for a grid-stride loop over `count` items, capped (one pass over the
// items per thread is not worth more blocks than a few waves).
inline unsigned grid_stride_blocks(int64_t count) {
  const int64_t blocks = ceil_div(count, 256);
  return unsigned(blocks < 8 * 1024 ? blocks : 8 * 1024);
}
}  // namespace anvil::cuda

#define ANVIL_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    const cudaError_t anvil_status_ = (call);                                                   \
    if (anvil_status_ != cudaSuccess)                                                           \
      ::anvil::cuda::throw_cuda_error(#call, int(anvil_status_), __FILE__, __LINE__);           \
  } while (0)

// After a kernel launch: reports a bad configuration at once (execution errors surface at the
// next synchronizing call).
#define ANVIL_CUDA_LAUNCHED() ANVIL_CUDA_CHECK(cudaGetLastError())
