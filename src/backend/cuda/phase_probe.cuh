#pragma once
// Measurement only: a build with -DANVIL_PHASE_PROBE=ON (CMake) stamps %globaltimer at points of
// batch 1's decode kernels (thread 0 of each block, with its SM), keeps each kernel's last launch
// (the last layer's) and prints, at exit, each point's percentiles against gate_up's last block
// end, and each kernel's last end per SM grouped by the SM's block count. Without the option every
// mark is empty. Session 34 found down's ~2.5 us of token staging with it, session 35 timed the
// rest of the layer (docs/perf/logs/h200/).
#include <cstdint>

#ifdef ANVIL_PHASE_PROBE
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>
#endif

namespace anvil::cuda::probe {

constexpr int kProbeKernels = 7, kProbeBlocks = 1024, kProbePhases = 8;  // the last holds the block's SM
constexpr int kProbeEnd = 6;
// Kernel ids of mark(): the MoE pair, then the rest of a layer.
enum ProbeKernel : int { kGateUp = 0, kDown = 1, kAttention = 2, kRouting = 3, kQkv = 4, kOutProj = 5, kRope = 6 };

#ifdef ANVIL_PHASE_PROBE
__device__ unsigned long long g_phase[kProbeKernels][kProbeBlocks][kProbePhases];

// Phases per kernel: the names in dump(); 0 is the block's start and 6 its end.
__device__ __forceinline__ void mark(int kernel, int phase) {
  if (threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const int block = blockIdx.x + (blockIdx.y + blockIdx.z * gridDim.y) * gridDim.x;
  if (block >= kProbeBlocks) return;
  g_phase[kernel][block][phase] = t;
  if (phase == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_phase[kernel][block][kProbePhases - 1] = sm;
  }
}

using ProbeTable = unsigned long long[kProbeKernels][kProbeBlocks][kProbePhases];

// Without relocatable device code every translation unit has its own g_phase, so each one that
// marks (dump_at_exit) merges its copy into this host table at exit, and the last one prints.
inline ProbeTable& merged_table() {
  static ProbeTable table = {};
  return table;
}
inline int& units_pending() {
  static int pending = 0;
  return pending;
}

inline void print(const ProbeTable& host) {
  unsigned long long gate_end = 0, gate_first = ~0ull;
  for (int b = 0; b < kProbeBlocks; ++b)
    if (host[kGateUp][b][kProbeEnd] != 0)
      gate_end = std::max(gate_end, host[kGateUp][b][kProbeEnd]), gate_first = std::min(gate_first, host[kGateUp][b][0]);
  if (gate_end == 0) return;
  const char* kernels[kProbeKernels] = {"gate_up", "down", "attention", "routing", "qkv", "o_proj", "rope"};
  const char* names[kProbeKernels][7] = {
      {"start", "waited", "routing", "prologue", "loop", "token", "end"},
      {"start", "waited", "landed", "largest", "tokens", "loop", "end"},
      {"start", "waited", "newest", "q", "loop", "merged", "end"},
      {"start", "waited", "norm", "landed", "logits", "crossed", "end"},
      {"start", "waited", "token", "first", "loop", "-", "end"},
      {"start", "waited", "token", "first", "loop", "-", "end"},
      {"start", "waited", "-", "-", "-", "-", "end"}};
  // The last layer's launches: a layer is ~50-70 us, so an earlier layer's leftovers (grids of
  // other sizes) start before this window.
  const unsigned long long window_lo = gate_first - std::min<unsigned long long>(gate_first, 80000);
  auto in_window = [&](int kernel, int b) { return host[kernel][b][0] >= window_lo && host[kernel][b][0] <= gate_end + 40000; };
  auto us = [&](unsigned long long t) { return (double(t) - double(gate_end)) * 1e-3; };
  for (int kernel = 0; kernel < kProbeKernels; ++kernel) {
    std::fprintf(stderr, "PROBE %s (us from gate_up's last end; gate_up's first start at %.2f)\n", kernels[kernel],
                 us(gate_first));
    for (int phase = 0; phase <= kProbeEnd; ++phase) {
      std::vector<double> t;
      for (int b = 0; b < kProbeBlocks; ++b)
        if (host[kernel][b][phase] != 0 && in_window(kernel, b)) t.push_back(us(host[kernel][b][phase]));
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      auto q = [&](double f) { return t[std::min(t.size() - 1, size_t(f * double(t.size())))]; };
      std::fprintf(stderr, "PROBE   %-9s n=%4zu min %7.2f p10 %7.2f p50 %7.2f p90 %7.2f max %7.2f\n", names[kernel][phase],
                   t.size(), t.front(), q(0.1), q(0.5), q(0.9), t.back());
    }
    // Per SM: its blocks of this kernel and its last block's end; grouped by the block count.
    std::map<unsigned long long, std::pair<int, double>> per_sm;
    for (int b = 0; b < kProbeBlocks; ++b)
      if (host[kernel][b][kProbeEnd] != 0 && in_window(kernel, b)) {
        auto& [blocks, end] = per_sm.try_emplace(host[kernel][b][kProbePhases - 1], 0, -1e9).first->second;
        ++blocks;
        end = std::max(end, us(host[kernel][b][kProbeEnd]));
      }
    std::map<int, std::vector<double>> by_count;
    for (const auto& [sm, v] : per_sm) by_count[v.first].push_back(v.second);
    for (auto& [count, ends] : by_count) {
      std::sort(ends.begin(), ends.end());
      double mean = 0;
      for (double e : ends) mean += e / double(ends.size());
      std::fprintf(stderr, "PROBE   SMs with %d blocks: %3zu, last end min %7.2f mean %7.2f max %7.2f\n", count,
                   ends.size(), ends.front(), mean, ends.back());
    }
  }
}

namespace {  // one copy per translation unit, as g_phase
inline void merge_this_unit() {
  cudaDeviceSynchronize();
  static ProbeTable host;
  if (cudaMemcpyFromSymbol(host, g_phase, sizeof(host)) == cudaSuccess) {
    ProbeTable& all = merged_table();
    for (int k = 0; k < kProbeKernels; ++k)
      for (int b = 0; b < kProbeBlocks; ++b)
        for (int p = 0; p < kProbePhases; ++p) all[k][b][p] = std::max(all[k][b][p], host[k][b][p]);
  }
  if (--units_pending() == 0) print(merged_table());
}

inline void dump_at_exit() {
  static const bool registered = (++units_pending(), std::atexit(merge_this_unit), true);
  (void)registered;
}
}  // namespace
#else
__device__ __forceinline__ void mark(int, int) {}
inline void dump_at_exit() {}
#endif

}  // namespace anvil::cuda::probe
