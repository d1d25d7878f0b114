// Step 0 of docs/perf/persistent-decode.md: what handing one dependent phase to the next costs
// when each phase streams weights of its own, as two PDL kernels (anvil's decode chain today)
// against one persistent kernel whose blocks signal a counter per phase.
//
// Each phase: every block asks for its slice of the phase's weights (`kib` KiB, distinct per phase
// and 16 phases apart, so they come from DRAM) into shared memory with cp.async, all at once,
// before it waits; then it reads every block's output of the previous phase (the phase depends on
// all of it, as qkv on the whole residual row), sums its weights, and writes its own output.
// - pdl: one kernel per phase in a CUDA graph, griddepcontrol.wait after the weights are asked
//   for, launch_dependents right after the wait (anvil's kernels' order).
// - counter: one cooperative kernel; after its copies a block's thread 0 spins with acquire loads
//   until the previous phase's counter reaches the grid's size, and adds 1 to its own phase's
//   counter with a release reduction once its output is written.
// Time per phase = (time of P phases - time of 1 phase) / (P - 1), medians of 20.
// Not part of the build. On a GPU machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc tools/cuda-harness/phase_handoff.cu -o /tmp/handoff
//   /tmp/handoff
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "harness_common.h"

constexpr int kThreads = 256;
constexpr int kDistinct = 16;  // phases of distinct weights

__device__ __forceinline__ void copy_16(uint4* dst, const uint4* src) {
  const unsigned at = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(src) : "memory");
}

__device__ __forceinline__ void ask_weights(const uint4* weights, uint4* smem, int pieces) {
  for (int i = threadIdx.x; i < pieces; i += kThreads) copy_16(smem + i, weights + i);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// The sum over blocks of the previous phase's outputs plus this block's weight words, into
// out[block] (thread 0).
__device__ __forceinline__ void finish_phase(const uint4* smem, int pieces, const float* in, int blocks, float* out) {
  __shared__ float partial[kThreads / 32];
  float sum = 0.0f;
  for (int b = threadIdx.x; b < blocks; b += kThreads) sum += __ldcg(in + b);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  unsigned words = 0;
  for (int i = threadIdx.x; i < pieces; i += kThreads) words += smem[i].x ^ smem[i].y ^ smem[i].z ^ smem[i].w;
  sum += float(words & 0xff);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
    out[blockIdx.x] = total * 1e-3f;
  }
  __syncthreads();  // partial and the ring are free again
}

__global__ void __launch_bounds__(kThreads) phase_pdl(const uint4* weights, int pieces, const float* in, float* out) {
  extern __shared__ uint4 ring[];
  ask_weights(weights + size_t(blockIdx.x) * pieces, ring, pieces);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  finish_phase(ring, pieces, in, gridDim.x, out);
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// counters[p]: blocks done with phase p (zeroed before the launch). values: [2][blocks].
__global__ void __launch_bounds__(kThreads)
    phases_counter(const uint4* weights, int pieces, float* values, unsigned* counters, int count) {
  extern __shared__ uint4 ring[];
  const unsigned blocks = gridDim.x;
  for (int p = 0; p < count; ++p) {
    ask_weights(weights + (size_t(p % kDistinct) * blocks + blockIdx.x) * pieces, ring, pieces);
    if (p > 0 && threadIdx.x == 0)
      while (load_acquire(counters + p - 1) < blocks) {
      }
    __syncthreads();
    finish_phase(ring, pieces, values + (p % 2) * blocks, blocks, values + ((p + 1) % 2) * blocks);
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counters + p) : "memory");
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kPhases = 65;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int blocks = sms;
  const size_t most_kib = 160;
  uint4* weights;
  const size_t weight_bytes = size_t(kDistinct) * blocks * most_kib * 1024;
  CK(cudaMalloc(&weights, weight_bytes));
  CK(cudaMemset(weights, 1, weight_bytes));
  float* values;
  CK(cudaMalloc(&values, 2 * size_t(blocks) * sizeof(float)));
  CK(cudaMemset(values, 0, 2 * size_t(blocks) * sizeof(float)));
  unsigned* counters;
  CK(cudaMalloc(&counters, kPhases * sizeof(unsigned)));
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  std::printf("dependent phases streaming their own weights, %d blocks of %d threads (one per SM)\n", blocks, kThreads);
  std::printf("%-8s %-10s %16s %16s\n", "KiB/blk", "MB/phase", "pdl us/phase", "counter us/phase");
  for (int kib : {0, 16, 48, 96, 160}) {
    const int pieces = kib * 1024 / 16;
    const size_t smem = std::max<size_t>(16, size_t(pieces) * 16);
    CK(cudaFuncSetAttribute(phase_pdl, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CK(cudaFuncSetAttribute(phases_counter, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    auto pdl_ms = [&](int count) {
      return graph_median_ms(
          [&] {
            for (int p = 0; p < count; ++p) {
              cudaLaunchConfig_t config = {};
              config.gridDim = dim3(blocks);
              config.blockDim = dim3(kThreads);
              config.dynamicSmemBytes = smem;
              config.stream = stream;
              cudaLaunchAttribute attribute[1] = {};
              attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
              attribute[0].val.programmaticStreamSerializationAllowed = 1;
              config.attrs = attribute;
              config.numAttrs = 1;
              const uint4* w = weights + size_t(p % kDistinct) * blocks * pieces;
              CK(cudaLaunchKernelEx(&config, phase_pdl, w, pieces, static_cast<const float*>(values + (p % 2) * blocks),
                                    values + ((p + 1) % 2) * blocks));
            }
          },
          stream, 3, 20);
    };
    auto counter_ms = [&](int count) {
      std::vector<float> times;
      void* args[] = {&weights, const_cast<int*>(&pieces), &values, &counters, &count};
      for (int r = 0; r < 23; ++r) {
        CK(cudaMemsetAsync(counters, 0, kPhases * sizeof(unsigned), stream));
        CK(cudaEventRecord(start, stream));
        CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(phases_counter), dim3(blocks), dim3(kThreads), args,
                                       smem, stream));
        CK(cudaEventRecord(stop, stream));
        CK(cudaEventSynchronize(stop));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 3) times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      return double(times[times.size() / 2]);
    };
    const double pdl = (pdl_ms(kPhases) - pdl_ms(1)) * 1000.0 / (kPhases - 1);
    const double counter = (counter_ms(kPhases) - counter_ms(1)) * 1000.0 / (kPhases - 1);
    std::printf("%-8d %-10.1f %16.2f %16.2f\n", kib, double(kib) * 1024 * blocks / 1e6, pdl, counter);
  }
  return 0;
}
