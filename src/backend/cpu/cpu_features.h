#pragma once
// What the running CPU can execute, probed once. Kernels for an instruction set live in files
// compiled for it (*_avx2.cpp, *_avx512.cpp); nothing from those files may run unless these flags allow it.
namespace anvil::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
};

// The CPU's own features, not affected by overrides.
const CpuFeatures& cpu_features();

// Whether the AVX2+FMA+F16C kernels may be used: the CPU has all three and ANVIL_CPU_ISA is not
// "scalar" (an escape hatch for debugging and for exercising the portable kernels).
bool cpu_use_avx2();

// Whether the AVX-512 kernels (F, BW, DQ and VL, on top of AVX2) may be used: the CPU and the OS
// support them and ANVIL_CPU_ISA is neither "scalar" nor "avx2" (which caps the kernels at AVX2,
// for comparisons on one machine).
bool cpu_use_avx512();

}  // namespace anvil::cpu
