#pragma once
// What the standalone CUDA harnesses share on the host: a CUDA-call check that exits, a seeded
// generator, bf16 conversions and the E2M1 code values (the project's own helpers live behind host
// dependencies, GoogleTest among them, that these tools avoid).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/splitmix64.h"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s at %d\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using Rng = anvil::SplitMix64;

static inline float bf(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t tobf(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}
static const float kFp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

// Median milliseconds of one replay of the CUDA graph that `capture` records on `stream` (it
// enqueues work; nothing is launched outside the capture), after `warmups` replays.
template <typename Capture>
static double graph_median_ms(Capture capture, cudaStream_t stream, int warmups, int replays) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  capture();
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < warmups; ++i) CK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < replays; ++r) {
    CK(cudaEventRecord(start, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float t = 0;
    CK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms[ms.size() / 2];
}
