#pragma once
// Programmatic dependent launch (compute capability 9.0 and later, per the kernel table): a decode
// step is ~300 small kernels in a row, and with a plain launch each one starts only after its
// predecessor has drained, then pays its own launch and first-load latency. Launched with
// launch_chained, a kernel's blocks may start while the predecessor finishes; every such kernel
// calls wait_for_predecessor() before it reads anything an earlier kernel wrote and before it
// writes anything (so all ordering, transitively, is kept), and may do work that depends on
// neither (streaming constant weights) before that. On GPUs without the feature, or launched
// plainly, the wait is a no-op and the launch is a plain stream-ordered one.
#include <cstdint>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/runtime.h"

namespace anvil::cuda {

__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next chained kernel be scheduled now (its blocks then wait for this grid to finish).
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// launch_chained (below) with the grid's blocks in clusters of cluster_x along x (compute capability
// 9.0 and later; grid.x a multiple of it): a cluster's blocks run at once, on one GPC, and can read
// and write each other's shared memory.
template <typename... Params, typename... Args>
void launch_chained_cluster(void (*kernel)(Params...), dim3 grid, unsigned cluster_x, dim3 block,
                            size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2] = {};
  unsigned count = 0;
  if (chained_launch_enabled()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count++].val.clusterDim = {cluster_x, 1, 1};
  }
  config.attrs = attribute;
  config.numAttrs = count;
  ANVIL_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                    Args&&... args) {
  launch_chained_cluster(kernel, grid, 1, block, shared_bytes, stream, std::forward<Args>(args)...);
}

// Dynamic shared memory above 48 KB must be granted per kernel and device, once; callers pass the
// most any of their launches of that kernel needs. Keyed on the kernel itself (not its type: every
// instantiation of a kernel template shares one).
template <auto kKernel>
void allow_smem(size_t bytes) {
  static std::mutex mutex;
  static uint64_t done = 0;  // one bit per device index
  int device = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done & bit)) return;
  ANVIL_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done |= bit;
}

}  // namespace anvil::cuda
