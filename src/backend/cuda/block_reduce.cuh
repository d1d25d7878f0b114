#pragma once
// Block-wide reductions for the load-time quantizers, which scan a row per block.
#include <cuda_runtime.h>

namespace anvil::cuda {

// The largest of every thread's amax and whether any thread saw a bad value, returned to every
// thread of a kThreads-thread block. Contains a barrier: all threads must call it.
template <int kThreads>
__device__ __forceinline__ void block_max_and_any(float& amax, bool& bad) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  __shared__ float warp_max[kThreads / 32];
  __shared__ int warp_bad[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    bad |= __shfl_xor_sync(0xffffffffu, int(bad), offset) != 0;
  }
  if (threadIdx.x % 32 == 0) {
    warp_max[threadIdx.x / 32] = amax;
    warp_bad[threadIdx.x / 32] = bad;
  }
  __syncthreads();
  amax = 0.0f;
  bad = false;
  for (int w = 0; w < kThreads / 32; ++w) {
    amax = fmaxf(amax, warp_max[w]);
    bad |= warp_bad[w] != 0;
  }
}

}  // namespace anvil::cuda
