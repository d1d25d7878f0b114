#pragma once
// Batch 1's post-attention norm, router and expert picks in one launch, where the kernel table
// names it (clusters: compute capability 9.0 and later): one cluster of 8 (or 16) blocks, each
// making the logits of its share of the experts into block 0's shared memory, where one warp
// picks them and writes the routing tables.
//
// Why: at batch 1 the norm + router kernel and the one-warp routing kernel after it held ~3.1 us
// and ~3.0 us of the chain per gpt-oss layer on an H200 (docs/perf/logs/h200/session29), almost
// all of it the boundary between them (a grid's end, the next one's wait, a round trip for the
// logits). Here the logits cross over distributed shared memory under one cluster barrier, and
// each block's rows of the router (constant) are fetched by the bulk copy engine before the grid
// waits for the attention's output projection.
//
// Values as rms_norm_router_kernel's followed by moe_route_one_row_kernel's, bit for bit: each
// 128-thread group of a block repeats that kernel's block (thread t takes the 8-value pieces t,
// t + 128, ... of the row in order, sums across lanes by butterfly, then across its 4 warps in
// turn) for the sum of squares and for each of its experts' dot products, so the inverse RMS, the
// logits, the bf16 norm (the experts' input, h) and the picks are the two kernels' own.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/phase_probe.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_common.cuh"
#include "backend/cuda/moe_picks.cuh"

namespace anvil::cuda::moe {

constexpr int kRouteCluster = 8;  // blocks; the most a cluster may portably hold
// SM90's non-portable cluster size: half the router rows per block, for routers whose eighth would
// take more shared memory than fits beside the output projection's blocks (gpt-oss-120b: 92 KB).
constexpr int kRouteWideCluster = 16;
constexpr int kRouteGroupThreads = 128;
constexpr int kRouteGroups = 4;
constexpr int kRouteGroupExperts = 4;
constexpr int kRouteBlockExperts = kRouteGroups * kRouteGroupExperts;  // per block at most
constexpr int kRouteMaxDim = 4096;
constexpr int kRouteSteps = kRouteMaxDim / 8 / kRouteGroupThreads;  // 8-value pieces per thread

// Dynamic shared memory: the block's router rows (bf16), then the bulk copies' barrier.
inline size_t norm_route_smem_bytes(int block_experts, int dim) {
  return size_t(block_experts) * size_t(dim) * 2 + sizeof(uint64_t);
}

struct NormRoute {
  const float* x = nullptr;            // [dim] the residual
  const float* norm_weight = nullptr;  // [dim]
  float eps = 0.0f;
  const uint16_t* router = nullptr;    // [experts, dim] bf16
  const float* bias = nullptr;         // [experts] or null
  int dim = 0, experts = 0, k = 0;
  uint16_t* h = nullptr;               // [dim] the bf16 norm
  int32_t* ids = nullptr;              // [k]
  float* route_weights = nullptr;      // [k]
};

// This thread's shared-memory address `local` in block `rank` of its cluster.
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, uint32_t rank) {
  uint32_t remote = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
#else
  __trap();
#endif
  return remote;
}

__device__ __forceinline__ void store_cluster_f32(uint32_t address, float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(address), "f"(value) : "memory");
#else
  __trap();
#endif
}

// Every thread of the cluster arrives; `release` orders its earlier writes (shared memory of any
// block included) before the matching wait_cluster's acquire.
__device__ __forceinline__ void arrive_cluster(bool release) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (release)
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  else
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void wait_cluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}

// Each value's sum over a 128-thread group, in rms_norm_router_kernel's block_row_sum order, for
// every thread of the group. partial: [group][value][warp of group]. Called by the whole block.
template <int kValues>
__device__ __forceinline__ void group_sums(float (&values)[kValues],
                                           float (&partial)[kRouteGroups][kRouteGroupExperts][4]) {
  static_assert(kValues <= kRouteGroupExperts, "partial's room");
  const int group = threadIdx.x / kRouteGroupThreads, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int v = 0; v < kValues; ++v) {
    float s = values[v];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) partial[group][v][warp] = s;
  }
  __syncthreads();
#pragma unroll
  for (int v = 0; v < kValues; ++v) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) total += partial[group][v][w];
    values[v] = total;
  }
  __syncthreads();  // partial is free again
}

// Launched as one cluster of kBlocks blocks of kRouteGroups x 128 threads (moe_routes_in_one_launch
// says for which shapes). Block b takes experts [b E/kBlocks, (b + 1) E/kBlocks), group g of it
// the g-th quarter of those.
template <int kBlocks>
__global__ void __launch_bounds__(kRouteGroups* kRouteGroupThreads)
    moe_norm_route_one_row_kernel(NormRoute a, Routing r) {
  extern __shared__ __align__(128) uint8_t route_smem[];
  __shared__ float logits[kMaxExperts];  // block 0's receives every block's
  __shared__ float partial[kRouteGroups][kRouteGroupExperts][4];
  const int block_experts = a.experts / kBlocks;
  const int group_experts = (block_experts + kRouteGroups - 1) / kRouteGroups;
  const uint32_t rank = cluster_rank();
  const int group = threadIdx.x / kRouteGroupThreads, t = threadIdx.x % kRouteGroupThreads;
  const int first_expert = int(rank) * block_experts + group * group_experts;
  const int my_experts = max(0, min(group_experts, block_experts - group * group_experts));
  const uint16_t* const rows = reinterpret_cast<const uint16_t*>(route_smem);
  uint64_t* const landed = reinterpret_cast<uint64_t*>(route_smem + size_t(block_experts) * a.dim * 2);
  const int pieces = a.dim / 8;
  probe::mark(probe::kRouting, 0);

  // Constants before the wait: the block's router rows (bulk copies), this thread's norm weights,
  // its experts' biases.
  if (threadIdx.x == 0) {
    const uint32_t row_bytes = uint32_t(a.dim) * 2;
    bulk::barrier_init(landed, 1);
    bulk::barrier_expect_bytes(landed, row_bytes * uint32_t(block_experts));
    for (int e = 0; e < block_experts; ++e)
      bulk::copy_to_shared(route_smem + size_t(e) * row_bytes,
                           a.router + (int64_t(rank) * block_experts + e) * a.dim, row_bytes, landed);
  }
  float4 scale[kRouteSteps][2];
#pragma unroll
  for (int s = 0; s < kRouteSteps; ++s) {
    const int i8 = t + s * kRouteGroupThreads;
    if (i8 < pieces) {
      scale[s][0] = __ldg(reinterpret_cast<const float4*>(a.norm_weight) + 2 * i8);
      scale[s][1] = __ldg(reinterpret_cast<const float4*>(a.norm_weight) + 2 * i8 + 1);
    }
  }
  float bias[kRouteGroupExperts];
#pragma unroll
  for (int q = 0; q < kRouteGroupExperts; ++q)
    bias[q] = q < my_experts && a.bias != nullptr ? __ldg(a.bias + first_expert + q) : 0.0f;
  // Every block of the cluster has started before any writes into block 0's shared memory.
  arrive_cluster(false);

  wait_for_predecessor();
  release_dependents();
  probe::mark(probe::kRouting, 1);
  // The residual, through L2: this SM's L1 may hold an earlier layer's.
  float x[kRouteSteps][8];
#pragma unroll
  for (int s = 0; s < kRouteSteps; ++s) {
    const int i8 = t + s * kRouteGroupThreads;
    if (i8 < pieces) {
      const float4 lo = __ldcg(reinterpret_cast<const float4*>(a.x) + 2 * i8);
      const float4 hi = __ldcg(reinterpret_cast<const float4*>(a.x) + 2 * i8 + 1);
      x[s][0] = lo.x, x[s][1] = lo.y, x[s][2] = lo.z, x[s][3] = lo.w;
      x[s][4] = hi.x, x[s][5] = hi.y, x[s][6] = hi.z, x[s][7] = hi.w;
    }
  }
  float squares[1] = {0.0f};
#pragma unroll
  for (int s = 0; s < kRouteSteps; ++s)
    if (t + s * kRouteGroupThreads < pieces)
#pragma unroll
      for (int j = 0; j < 8; ++j) squares[0] = fmaf(x[s][j], x[s][j], squares[0]);
  group_sums(squares, partial);
  const float inv = rsqrtf(squares[0] / float(a.dim) + a.eps);
  probe::mark(probe::kRouting, 2);

  // This block's share of h (group 0 holds every piece, as every group does).
  const int share = (pieces + kBlocks - 1) / kBlocks;
  if (group == 0) {
#pragma unroll
    for (int s = 0; s < kRouteSteps; ++s) {
      const int i8 = t + s * kRouteGroupThreads;
      if (i8 < pieces && i8 / share == int(rank)) {
        const float w[8] = {scale[s][0].x, scale[s][0].y, scale[s][0].z, scale[s][0].w,
                            scale[s][1].x, scale[s][1].y, scale[s][1].z, scale[s][1].w};
        uint32_t words[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          words[j] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[s][2 * j] * inv * w[2 * j]))) |
                     uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[s][2 * j + 1] * inv * w[2 * j + 1]))) << 16;
        reinterpret_cast<uint4*>(a.h)[i8] = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
  }

  bulk::barrier_wait(landed, 0);
  probe::mark(probe::kRouting, 3);
  float sum[kRouteGroupExperts] = {};
#pragma unroll
  for (int s = 0; s < kRouteSteps; ++s) {
    const int i8 = t + s * kRouteGroupThreads;
    if (i8 >= pieces) continue;
    const float w[8] = {scale[s][0].x, scale[s][0].y, scale[s][0].z, scale[s][0].w,
                        scale[s][1].x, scale[s][1].y, scale[s][1].z, scale[s][1].w};
#pragma unroll
    for (int q = 0; q < kRouteGroupExperts; ++q) {
      if (q >= my_experts) continue;
      const uint4 packed =
          *reinterpret_cast<const uint4*>(rows + size_t(group * group_experts + q) * a.dim + size_t(i8) * 8);
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float wf = __uint_as_float(j % 2 == 0 ? words[j / 2] << 16 : words[j / 2] & 0xffff0000u);
        sum[q] = fmaf(x[s][j] * inv * w[j], wf, sum[q]);
      }
    }
  }
  group_sums(sum, partial);
  probe::mark(probe::kRouting, 4);

  wait_cluster();  // every block has started
  if (t < my_experts)
#pragma unroll
    for (int q = 0; q < kRouteGroupExperts; ++q)
      if (q == t) store_cluster_f32(cluster_address(gemm::smem_u32(&logits[first_expert + q]), 0), sum[q] + bias[q]);
  arrive_cluster(true);
  wait_cluster();
  probe::mark(probe::kRouting, 5);
  if (rank != 0 || threadIdx.x >= 32) {
    probe::mark(probe::kRouting, probe::kProbeEnd);
    return;
  }
  write_one_row_routing(pick_experts_by([&](int e) { return logits[e]; }, a.experts, a.k), a.experts, a.k, r, a.ids,
                        a.route_weights);
  probe::mark(probe::kRouting, probe::kProbeEnd);
}

}  // namespace anvil::cuda::moe
