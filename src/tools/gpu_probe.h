#pragma once
// The GPUs of this host through the CUDA driver API, loaded at run time with dlopen: the binary
// does not link libcuda, so it runs (and says why there is no GPU) on a machine without a
// driver. Independent of the CUDA runtime anvil's kernels use.
#include <cstdint>
#include <string>
#include <vector>

namespace anvil::tools {

struct GpuDevice {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // exact compute capability
  uint64_t total_memory = 0, free_memory = 0;
  bool free_known = false;  // false when no context could be made to ask
  int multiprocessors = 0;
  int shared_memory_per_block_optin = 0;
  std::string pci_bus_id;
};

struct GpuProbe {
  bool driver_loaded = false;    // libcuda.so.1 was found and cuInit succeeded
  std::string status;            // "ok", or why there are no GPUs, in one line
  bool driver_problem = false;   // a driver is installed but failed (not merely absent or GPU-less)
  int cuda_driver_version = 0;   // cuDriverGetVersion, e.g. 13000 for CUDA 13.0; 0 when unknown
  std::vector<GpuDevice> gpus;
};

// Probes through `library` (the driver's libcuda.so.1 unless a test names another).
GpuProbe probe_gpus(const std::string& library = "libcuda.so.1");

// 13000 -> "13.0", 12080 -> "12.8".
std::string cuda_version_text(int version);

}  // namespace anvil::tools
