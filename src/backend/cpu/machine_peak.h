#pragma once
// The machine's float32 arithmetic ceiling, the yardstick for batched (matrix-matrix) kernels,
// as memory_bandwidth.h's is for matrix-vector ones.
#include <cstdint>

#include "core/thread_pool.h"

namespace anvil {

// Runs a 16-lane (AVX-512 kernels in use) or 8-lane FMA loop with enough independent chains to reach the FMA units' throughput on
// every thread of the pool at once; best of a few repetitions. Returns GFLOP/s (an FMA counts 2
// per lane) summed over the threads, or 0 where the AVX2 kernels are not in use.
double measure_peak_fma_gflops(ThreadPool& pool);

namespace cpu {
// iterations x 12 independent 8-lane FMAs; returns a value that depends on all of them.
float fma_loop_avx2(int64_t iterations);
// The same with 16-lane FMAs; call only when cpu_use_avx512() is true.
float fma_loop_avx512(int64_t iterations);
}  // namespace cpu

}  // namespace anvil
