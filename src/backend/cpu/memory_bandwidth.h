#pragma once
// The machine's sustainable memory bandwidth, the yardstick for decode (matrix-vector) kernels,
// which should stream weights at a good fraction of it.
#include <cstddef>

#include "core/thread_pool.h"

namespace anvil {

// Copies a `bytes`-sized buffer into another on every thread of the pool (each thread its own
// contiguous slice, as the linear kernels split rows), best of a few repetitions. Returns GB/s
// (1e9 bytes) counting both the bytes read and the bytes written, i.e. 2 * bytes per copy, the
// convention of STREAM's "Copy". Allocates 2 * bytes for the duration of the call.
double measure_copy_bandwidth_gbps(ThreadPool& pool, size_t bytes = size_t(1) << 30);

}  // namespace anvil
