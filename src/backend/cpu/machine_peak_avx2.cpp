// The FMA loop behind measure_peak_fma_gflops. Plain intrinsics only (see linear_kernels.h).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/machine_peak.h"

namespace anvil::cpu {

float fma_loop_avx2(int64_t iterations) {
  // Twelve independent chains: more than FMA latency times issue width on any AVX2 core, so the
  // loop runs at the FMA units' throughput. acc * 0.999999 + 0.5 converges (to 5e5), so no
  // value ever becomes subnormal or infinite.
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(0.5f);
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i));
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}

}  // namespace anvil::cpu
