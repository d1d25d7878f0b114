#pragma once
// cuBLASLt for the dense bf16 matrix products where it beats anvil's own kernels (32 rows and
// more; linear_dense.cu decides). The library is opened at run time (dlopen), never linked: the anvil
// binary must start on machines without it, and cuBLASLt is not part of the NVIDIA driver. When
// it is missing, or refuses a shape, the caller runs its own kernels, so results never depend on
// whether it was found beyond the usual float32-accumulation rounding.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace anvil::cuda::cublaslt {

// Whether cuBLASLt was found and may be used on this machine (and not turned off).
bool available();
// One line for `anvil doctor`: the library and its version, or why it is not used.
std::string describe();
// Turns its use off (false) or back on (true) for calls from now on; ANVIL_CUBLASLT=0 starts it
// off. For tests and A/B measurements.
void allow(bool allowed);

// y[m, out] = x[m, in] · W[out, in]ᵀ + bias (or y += that with accumulate): bf16 x and W, float32
// bias and y, float32 accumulation. 16-byte aligned x and W, in % 8 == 0. Returns false, having
// launched nothing, when cuBLASLt is unavailable or has no algorithm for the shape, or when the
// stream is being captured before the workspace exists.
bool matmul_bf16(const uint16_t* weight, const float* bias, const uint16_t* x, int64_t m, int64_t out, int64_t in,
                 float* y, bool accumulate, cudaStream_t stream);

}  // namespace anvil::cuda::cublaslt
