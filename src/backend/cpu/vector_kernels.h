#pragma once
// AVX2 versions of the vector primitives in backend/vector_ops.h; call only when
// cpu_use_avx2() is true.
#include <cstdint>

namespace anvil::cpu {

float dot_f32_avx2(const float* a, const float* b, int64_t n);
void axpy_f32_avx2(float a, const float* x, float* y, int64_t n);

}  // namespace anvil::cpu
