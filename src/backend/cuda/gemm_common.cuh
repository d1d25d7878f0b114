#pragma once
// Building blocks shared by the matrix kernels (linear_dense.cu, moe_quantized.cu): asynchronous
// copies, ldmatrix, the bf16 tensor-core product and the shared-memory swizzle. Everything here is
// plain sm_80 PTX, so the same kernels run from Ampere to SM120 (which has no wgmma).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace anvil::cuda::gemm {

__device__ __forceinline__ uint32_t smem_u32(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte global -> shared copy that bypasses L1. With valid == false nothing is read and the
// destination is zero-filled (the source must still be a mapped address, so callers pass a base
// pointer for out-of-range rows).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// The same for 8 bytes (through L1: the .cg form takes 16 bytes only).
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// Asks L2 for the line holding `address`; nothing lands in registers or shared memory.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lane l supplies the row address of row (l % 8) of matrix (l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t address, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}

// d += a · b for one m16n8k16 tile, bf16 inputs, fp32 accumulators. Fragment layout (PTX ISA,
// "mma.m16n8k16"): with g = lane / 4 and t = lane % 4,
//   a = {A[g][2t..2t+1], A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9]}
//   b = {B[2t..2t+1][g], B[2t+8..2t+9][g]}
//   d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}
// The reduction over k does not care which physical k each logical k is, as long as A and B
// agree; the kernels use that freedom to make their loads contiguous.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with fp16 operands (MXFP4's batch-1 decode, moe_decode_f16.cuh). Not volatile: a pure
// function of its inputs, so the compiler may schedule it among the decode's ALU work.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Guarded 16-byte loads: zeros when `valid` is false, and then no memory is touched. The guard
// lives inside the PTX (a predicated ld): as plain C++ (valid ? load : 0) the compiler may hoist
// the load above the test, reading past the end of the last row.
//
// Weights are read exactly once per call: keep them out of L1 so the activations, which are
// re-read, stay there.
__device__ __forceinline__ uint4 load_stream_16(const void* pointer, bool valid) {
  uint4 v;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(pointer), "r"(int(valid)));
  return v;
}

// Activations: read-only for the kernel's lifetime and re-read by other warps, so cached in L1.
__device__ __forceinline__ uint4 load_cached_16(const void* pointer, bool valid) {
  uint4 v;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(pointer), "r"(int(valid)));
  return v;
}

__device__ __forceinline__ uint32_t load_cached_u8(const uint8_t* pointer, bool valid) {
  uint32_t v;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %2, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  @p ld.global.nc.u8 %0, [%1];\n"
      "}\n"
      : "=r"(v)
      : "l"(pointer), "r"(int(valid)));
  return v;
}

// Shared-memory tiles hold rows of kChunks 16-byte chunks. ldmatrix reads one chunk from each of
// 8 consecutive rows; XOR-ing the chunk index with bits of the row spreads those 8 reads over all
// 32 banks (and the cp.async writes of whole rows stay conflict-free too).
template <int kChunks>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kChunks == 4 || kChunks == 8, "rows of 64 or 128 bytes");
  if constexpr (kChunks == 8)
    return chunk ^ (row & 7);
  else
    return chunk ^ ((row >> 1) & 3);
}

}  // namespace anvil::cuda::gemm
