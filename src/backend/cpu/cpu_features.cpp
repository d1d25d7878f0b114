#include "backend/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace anvil::cpu {

namespace {
CpuFeatures probe() {
  CpuFeatures features;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  features.avx2 = __builtin_cpu_supports("avx2");
  features.fma = __builtin_cpu_supports("fma");
  features.f16c = __builtin_cpu_supports("f16c");
#endif
  return features;
}
}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

bool cpu_use_avx2() {
  static const bool use = [] {
    const CpuFeatures& f = cpu_features();
    const char* isa = std::getenv("ANVIL_CPU_ISA");
    const bool forced_scalar = isa != nullptr && std::strcmp(isa, "scalar") == 0;
    return f.avx2 && f.fma && f.f16c && !forced_scalar;
  }();
  return use;
}

}  // namespace anvil::cpu
