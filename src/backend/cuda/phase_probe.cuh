#pragma once
// Measurement only: a build with -DANVIL_PHASE_PROBE=ON (CMake) stamps %globaltimer at points of
// batch 1's gate_up and down kernels (thread 0 of each block, with its SM), keeps the last launch's
// stamps and prints, at exit, each point's percentiles against gate_up's last block end, and each
// kernel's last end per SM grouped by the SM's block count. Without the option every mark is
// empty. Session 34 found down's ~2.5 us of token staging with it (docs/perf/logs/h200/session34).
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

constexpr int kProbeBlocks = 1024, kProbePhases = 8;  // the last holds the block's SM
constexpr int kProbeEnd = 6;

#ifdef ANVIL_PHASE_PROBE
__device__ unsigned long long g_phase[2][kProbeBlocks][kProbePhases];

// kernel 0: gate_up (0 start, 1 waited, 2 routing read, 5 token staged, 3 prologue, 4 loop, 6 end);
// kernel 1: down (0 start, 1 waited, 2 tokens landed, 3 largest magnitudes, 4 tokens staged, 5 loop,
// 6 end).
__device__ __forceinline__ void mark(int kernel, int phase) {
  if (threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const int block = blockIdx.x + blockIdx.y * gridDim.x;
  if (block >= kProbeBlocks) return;
  g_phase[kernel][block][phase] = t;
  if (phase == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_phase[kernel][block][kProbePhases - 1] = sm;
  }
}

inline void dump() {
  cudaDeviceSynchronize();
  static unsigned long long host[2][kProbeBlocks][kProbePhases];
  if (cudaMemcpyFromSymbol(host, g_phase, sizeof(host)) != cudaSuccess) return;
  unsigned long long gate_end = 0, gate_first = ~0ull;
  for (int b = 0; b < kProbeBlocks; ++b)
    if (host[0][b][kProbeEnd] != 0) gate_end = std::max(gate_end, host[0][b][kProbeEnd]), gate_first = std::min(gate_first, host[0][b][0]);
  const char* names[2][7] = {{"start", "waited", "routing", "prologue", "loop", "token", "end"},
                             {"start", "waited", "landed", "largest", "tokens", "loop", "end"}};
  for (int kernel = 0; kernel < 2; ++kernel) {
    std::fprintf(stderr, "PROBE %s (us from gate_up's last end; gate_up's first start at %.2f)\n",
                 kernel == 0 ? "gate_up" : "down", (double(gate_first) - double(gate_end)) * 1e-3);
    for (int phase = 0; phase <= kProbeEnd; ++phase) {
      std::vector<double> t;
      for (int b = 0; b < kProbeBlocks; ++b)
        if (host[kernel][b][phase] != 0 && host[kernel][b][0] >= gate_first)
          t.push_back((double(host[kernel][b][phase]) - double(gate_end)) * 1e-3);
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      auto q = [&](double f) { return t[std::min(t.size() - 1, size_t(f * double(t.size())))]; };
      std::fprintf(stderr, "PROBE   %-9s n=%4zu min %7.2f p10 %7.2f p50 %7.2f p90 %7.2f max %7.2f\n", names[kernel][phase],
                   t.size(), t.front(), q(0.1), q(0.5), q(0.9), t.back());
    }
    // Per SM: its blocks of this kernel and its last block's end; grouped by the block count.
    std::map<unsigned long long, std::pair<int, double>> per_sm;
    for (int b = 0; b < kProbeBlocks; ++b)
      if (host[kernel][b][kProbeEnd] != 0 && host[kernel][b][0] >= gate_first) {
        auto& [blocks, end] = per_sm.try_emplace(host[kernel][b][kProbePhases - 1], 0, -1e9).first->second;
        ++blocks;
        end = std::max(end, (double(host[kernel][b][kProbeEnd]) - double(gate_end)) * 1e-3);
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

inline void dump_at_exit() {
  static const bool registered = (std::atexit(dump), true);
  (void)registered;
}
#else
__device__ __forceinline__ void mark(int, int) {}
inline void dump_at_exit() {}
#endif

}  // namespace anvil::cuda::probe
