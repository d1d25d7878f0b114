// The 16-lane FMA loop behind measure_peak_fma_gflops on AVX-512 CPUs. Plain intrinsics only
// (see linear_kernels.h).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/machine_peak.h"

namespace anvil::cpu {

float fma_loop_avx512(int64_t iterations) {
  // As fma_loop_avx2, on 16 lanes: twelve chains cover latency times two FMA ports.
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(0.5f);
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i));
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_cvtss_f32(sum);  // lane 0 already depends on every chain
}

}  // namespace anvil::cpu
