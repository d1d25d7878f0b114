// What one grid-wide barrier costs inside a persistent kernel, beside chain_latency.cu's kernel
// boundary under programmatic dependent launch (0.5-0.9 us on an H200, docs/perf/gpu.md). A
// batch-1 decode step is ~10 dependent kernels per layer; one persistent kernel per step (or per
// layer) would replace each boundary with a barrier like this one, so the difference bounds what
// that redesign saves before any overlap it allows.
//
// Each phase is as dependent as a chain link: block b reads what block (b + 1) % blocks wrote in
// the previous phase (another multiprocessor), optionally spends `work` dependent multiply-adds,
// writes its own value, and then the grid meets at the barrier: thread 0 of each block arrives on
// one counter with acq_rel semantics, the last to arrive resets it and publishes the next
// generation with a release store, and the others spin on the generation with acquire loads.
// The launch is cooperative, so every block is resident (no barrier can wait on a block that
// never starts). Time per phase = (time of P phases - time of 1 phase) / (P - 1), medians of 20.
// Not part of the build. On a GPU machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc tools/cuda-harness/grid_barrier.cu -o /tmp/barrier
//   /tmp/barrier
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "harness_common.h"

__device__ __forceinline__ unsigned arrive_acq_rel(unsigned* counter) {
  unsigned previous;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;\n" : "=r"(previous) : "l"(counter) : "memory");
  return previous;
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store_relaxed(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ float load_relaxed(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// barrier[0]: arrivals, barrier[1]: generation. values: [2][blocks], the phases' outputs.
__global__ void phases(unsigned* barrier, float* values, int count, int work) {
  const unsigned blocks = gridDim.x;
  unsigned generation = 0;
  if (threadIdx.x == 0) generation = load_acquire(barrier + 1);
  for (int phase = 0; phase < count; ++phase) {
    if (threadIdx.x == 0) {
      const float* in = values + (phase % 2) * blocks;
      float* out = values + ((phase + 1) % 2) * blocks;
      float v = load_relaxed(in + (blockIdx.x + 1) % blocks);
      for (int i = 0; i < work; ++i) v = v * 0.999f + 0.001f;
      out[blockIdx.x] = v + 1.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (arrive_acq_rel(barrier) == blocks - 1) {
        store_relaxed(barrier, 0u);  // before the release below: no block arrives again until it
        store_release(barrier + 1, generation + 1);
      } else {
        while (load_acquire(barrier + 1) == generation) {
        }
      }
      ++generation;
    }
    __syncthreads();
  }
}

int main() {
  int sms = 0, cooperative = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, 0));
  if (!cooperative) {
    std::printf("this GPU has no cooperative launch\n");
    return 1;
  }
  unsigned* barrier;
  float* values;
  CK(cudaMalloc(&barrier, 2 * sizeof(unsigned)));
  CK(cudaMemset(barrier, 0, 2 * sizeof(unsigned)));
  CK(cudaMalloc(&values, 2 * 4 * size_t(sms) * sizeof(float)));
  CK(cudaMemset(values, 0, 2 * 4 * size_t(sms) * sizeof(float)));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  auto median_us = [&](int blocks, int count, int work) {
    void* args[] = {&barrier, &values, &count, &work};
    std::vector<float> times;
    for (int r = 0; r < 23; ++r) {
      CK(cudaEventRecord(start, stream));
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(phases), dim3(blocks), dim3(128), args, 0, stream));
      CK(cudaEventRecord(stop, stream));
      CK(cudaEventSynchronize(stop));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, start, stop));
      if (r >= 3) times.push_back(ms * 1000.0f);
    }
    std::sort(times.begin(), times.end());
    return double(times[times.size() / 2]);
  };
  constexpr int kPhases = 241;  // 240 barriers past the first phase: a 20b step's ~240 boundaries
  std::printf("grid barrier inside one cooperative kernel, 128 threads per block, %d SMs\n", sms);
  std::printf("%-8s %-6s %14s\n", "blocks", "work", "us per phase");
  for (int work : {0, 2000})
    for (int blocks : {1, sms / 2, sms, 2 * sms, 4 * sms}) {
      const double one = median_us(blocks, 1, work), many = median_us(blocks, kPhases, work);
      std::printf("%-8d %-6d %14.2f\n", blocks, work, (many - one) / (kPhases - 1));
    }
  return 0;
}
