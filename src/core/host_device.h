#pragma once
// Marks functions that both host code and CUDA kernels call (plain C++ outside nvcc).
#if defined(__CUDACC__)
#define ANVIL_HOST_DEVICE __host__ __device__
#else
#define ANVIL_HOST_DEVICE
#endif
