// What one dependent kernel boundary costs inside a CUDA graph: a batch-1 decode step is a chain
// of ~10 small dependent kernels per layer, so this bounds what fusing them can save. Each kernel
// of the chain reads what its predecessor wrote (one value per block) and writes the next, so
// the chain is truly dependent; with programmatic dependent launch (PDL) each kernel waits with
// griddepcontrol.wait and releases its successor right after, as anvil's kernels do.
// Not part of the build. On a GPU machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a tools/cuda-harness/chain_latency.cu -o /tmp/chain
//   /tmp/chain
#include <cuda_runtime.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "harness_common.h"

// in[block] -> out[block] + 1, after `work` dependent multiply-adds per thread (a stand-in for a
// kernel's own latency, 0 for a bare boundary).
__global__ void link(const float* in, float* out, int work) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  float v = in[blockIdx.x];
  for (int i = 0; i < work; ++i) v = v * 0.999f + 0.001f;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = v + 1.0f;
}

static void launch(bool pdl, int blocks, const float* in, float* out, int work, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(128);
  config.stream = stream;
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&config, link, in, out, work));
}

int main() {
  constexpr int kChain = 240;  // ~24 layers x 10 kernels
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *a, *b;
  CK(cudaMalloc(&a, 4096 * sizeof(float)));
  CK(cudaMalloc(&b, 4096 * sizeof(float)));
  CK(cudaMemset(a, 0, 4096 * sizeof(float)));
  std::printf("chain of %d dependent kernels in one CUDA graph, 128 threads per block, %d SMs\n", kChain, sms);
  std::printf("%-6s %-8s %-6s %14s\n", "pdl", "blocks", "work", "us per kernel");
  for (int work : {0, 2000}) {
    for (int blocks : {1, sms, 4 * sms}) {
      for (bool pdl : {false, true}) {
        const double ms = graph_median_ms(
            [&] {
              for (int i = 0; i < kChain; ++i) launch(pdl, blocks, i % 2 ? b : a, i % 2 ? a : b, work, stream);
            },
            stream, 3, 20);
        std::printf("%-6s %-8d %-6d %14.2f\n", pdl ? "on" : "off", blocks, work, ms * 1000.0 / kChain);
      }
    }
  }
  return 0;
}
