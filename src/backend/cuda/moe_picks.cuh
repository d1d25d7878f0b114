#pragma once
// A row's expert picks, made by one warp: the top k of the router logits (greater value first,
// equal values by lower index, as cpu::top_k_indices) and a softmax over the k picked logits.
// Shared by every routing kernel, so all of them pick and weigh alike.
#include <cstdint>

#include "backend/cuda/moe_common.cuh"
#include "backend/cuda/order_key.h"

namespace anvil::cuda::moe {

// Lane p < k holds pick p (picks in descending order) and its softmax weight.
struct WarpPick {
  int expert;
  float weight;
};

// Each lane holds the logits e = lane + 32 j, as order_key's keys, so that each pick is two
// redux.sync rather than five dependent rounds of shuffles: in a batch-1 decode step the routing
// is on the critical path (~1.9 us for the shuffle version on an H200,
// docs/perf/logs/h200/routing-one-row/). Logits are read through L2 (ld.cg): the caller may run
// on an SM whose L1 holds an earlier layer's.
// logit(e) gives expert e's logit (e < num_experts).
template <typename Logit>
__device__ __forceinline__ WarpPick pick_experts_by(Logit&& logit, int num_experts, int k) {
  constexpr int kPerLane = kMaxExperts / 32;
  const int lane = threadIdx.x % 32;
  uint32_t keys[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    keys[j] = e < num_experts ? order_key(logit(e)) : 0u;
  }
  uint32_t taken = 0;  // bit j: this lane's expert lane + 32 j is picked (or does not exist)
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j >= num_experts) taken |= 1u << j;
  uint32_t mine_key = 0, top_key = 0;
  int mine = 0;
  for (int pick = 0; pick < k; ++pick) {
    // This lane's best remaining logit; along j indices grow, so the first of equal keys stays.
    uint32_t best = 0;
    int best_j = -1;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (!((taken >> j) & 1u) && (best_j < 0 || keys[j] > best)) {
        best = keys[j];
        best_j = j;
      }
    const uint32_t top = __reduce_max_sync(0xffffffffu, best_j >= 0 ? best : 0u);
    const int index = __reduce_min_sync(0xffffffffu, best_j >= 0 && best == top ? lane + 32 * best_j : INT32_MAX);
    if (index != INT32_MAX && index % 32 == lane) taken |= 1u << (index / 32);
    if (pick == 0) top_key = top;
    if (lane == pick) {
      mine_key = top;
      mine = index;
    }
  }
  // Softmax over the picks (pick 0 is the largest), summed in pick order.
  const float e = lane < k ? expf(from_order_key(mine_key) - from_order_key(top_key)) : 0.0f;
  float sum = 0.0f;
  for (int q = 0; q < k; ++q) sum += __shfl_sync(0xffffffffu, e, q);
  return {mine, e / sum};
}

__device__ __forceinline__ WarpPick pick_experts(const float* __restrict__ row_logits, int num_experts, int k) {
  return pick_experts_by([&](int e) { return __ldcg(row_logits + e); }, num_experts, k);
}

// One row's routing tables from its warp's picks (a batch-1 decode step): its k picks are distinct
// experts, so the tables are direct (active index y = the pick with the y-th smallest id, one slot
// each) and need no counting, scan or barrier; the same tables moe_route_kernel writes for that
// row. Called by the whole warp.
__device__ __forceinline__ void write_one_row_routing(const WarpPick& mine, int num_experts, int k, const Routing& r,
                                                      int32_t* __restrict__ ids, float* __restrict__ route_weights) {
  constexpr int kPerLane = kMaxExperts / 32 + 1;  // offsets has num_experts + 1 entries
  const int lane = threadIdx.x % 32;
  int rank = 0;               // of this lane's pick among the picks, by expert id
  int before[kPerLane] = {};  // picks with an id below expert lane + 32 j
  for (int q = 0; q < k; ++q) {
    const int id = __shfl_sync(0xffffffffu, mine.expert, q);
    rank += id < mine.expert ? 1 : 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) before[j] += id < lane + 32 * j ? 1 : 0;
  }
  if (lane < k) {
    ids[lane] = mine.expert;
    route_weights[lane] = mine.weight;
    r.active[rank] = mine.expert;
    r.active_range[2 * rank] = rank;
    r.active_range[2 * rank + 1] = 1;
    r.sorted_slot[rank] = lane;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e <= num_experts) r.offsets[e] = before[j];
    if (e >= k && e < num_experts) r.active[e] = -1;
  }
  if (lane == 0) {
    r.header[kTotalSlots] = k;
    r.header[kNumTiles] = 0;
    r.header[kNumActive] = k;
  }
}

}  // namespace anvil::cuda::moe
