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
  // libgcc also checks that the OS saves the AVX-512 register state (XCR0) before reporting these.
  features.avx512f = __builtin_cpu_supports("avx512f");
  features.avx512bw = __builtin_cpu_supports("avx512bw");
  features.avx512dq = __builtin_cpu_supports("avx512dq");
  features.avx512vl = __builtin_cpu_supports("avx512vl");
#endif
  return features;
}
}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

namespace {
bool isa_capped_at(const char* cap) {
  const char* isa = std::getenv("ANVIL_CPU_ISA");
  return isa != nullptr && std::strcmp(isa, cap) == 0;
}
}  // namespace

bool cpu_use_avx2() {
  static const bool use = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx2 && f.fma && f.f16c && !isa_capped_at("scalar");
  }();
  return use;
}

bool cpu_use_avx512() {
  static const bool use = [] {
    const CpuFeatures& f = cpu_features();
    return cpu_use_avx2() && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && !isa_capped_at("avx2");
  }();
  return use;
}

}  // namespace anvil::cpu
