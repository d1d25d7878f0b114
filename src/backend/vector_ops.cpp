#include "backend/vector_ops.h"

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/vector_kernels.h"

namespace anvil {

float dot_f32(const float* a, const float* b, int64_t n) {
  if (cpu::cpu_use_avx2()) return cpu::dot_f32_avx2(a, b, n);
  return dot_f32_reference(a, b, n);
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  if (cpu::cpu_use_avx2()) {
    cpu::axpy_f32_avx2(a, x, y, n);
  } else {
    axpy_f32_reference(a, x, y, n);
  }
}

float dot_f32_reference(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy_f32_reference(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

const char* cpu_kernel_isa() {
  if (cpu::cpu_use_avx512()) return "avx512+avx2+fma";
  return cpu::cpu_use_avx2() ? "avx2+fma" : "scalar";
}

}  // namespace anvil
