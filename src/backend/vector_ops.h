#pragma once
// Small float32 vector primitives used by attention and norms, SIMD where the CPU has it.
#include <cstdint>

namespace anvil {

float dot_f32(const float* a, const float* b, int64_t n);
// y += a * x
void axpy_f32(float a, const float* x, float* y, int64_t n);
// Scalar versions, the reference for tests.
float dot_f32_reference(const float* a, const float* b, int64_t n);
void axpy_f32_reference(float a, const float* x, float* y, int64_t n);

// Name of the instruction set the dispatched kernels use on this CPU ("avx2+fma", "scalar").
const char* cpu_kernel_isa();

}  // namespace anvil
