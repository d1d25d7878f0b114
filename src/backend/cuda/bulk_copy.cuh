#pragma once
// The bulk copy engine (cp.async.bulk, compute capability 9.0 and later) and the shared-memory
// barriers that count its bytes in. One thread asks for kilobytes with one instruction and the
// data lands in shared memory without registers or per-lane address arithmetic, so a block can
// have far more bytes in flight than a register ring holds. Compiled for older targets, every
// helper traps: the host launches kernels built on these only where the kernel table says so.
#include <cstdint>

#include "backend/cuda/gemm_common.cuh"

namespace anvil::cuda::bulk {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ANVIL_BULK_COPY 1
#else
#define ANVIL_BULK_COPY 0
#endif

__device__ __forceinline__ void barrier_init(uint64_t* barrier, uint32_t arrivals) {
#if ANVIL_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(gemm::smem_u32(barrier)), "r"(arrivals) : "memory");
  // Makes the initialized barrier visible to the copy engine.
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}

// The calling thread's arrival, announcing `bytes` more that copies will complete on the barrier.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
#if ANVIL_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(gemm::smem_u32(barrier)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// Waits until the barrier's phase `parity` (0, 1, 0, ... for its successive uses) has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity) {
#if ANVIL_BULK_COPY
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(gemm::smem_u32(barrier)), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// completing on `barrier`.
__device__ __forceinline__ void copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
#if ANVIL_BULK_COPY
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   gemm::smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(gemm::smem_u32(barrier))
               : "memory");
#else
  __trap();
#endif
}

}  // namespace anvil::cuda::bulk
