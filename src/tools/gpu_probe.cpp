#include "tools/gpu_probe.h"

#include <dlfcn.h>

#include <cstddef>

namespace anvil::tools {

namespace {

// The few driver API entry points used, declared by hand (no CUDA headers in this layer).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorNoDevice = 100;
constexpr CUresult kErrorStubLibrary = 34;  // the toolkit's link stub, not a driver
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrSharedMemoryPerBlockOptin = 97;

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
};

template <typename F>
bool bind(void* library, F& function, const char* name) {
  function = reinterpret_cast<F>(::dlsym(library, name));
  return function != nullptr;
}

std::string error_text(const Driver& driver, CUresult status) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.cuGetErrorName) driver.cuGetErrorName(status, &name);
  if (driver.cuGetErrorString) driver.cuGetErrorString(status, &text);
  std::string result = name ? name : "CUDA error " + std::to_string(status);
  if (text) result += std::string(" (") + text + ")";
  return result;
}

}  // namespace

std::string cuda_version_text(int version) {
  if (version <= 0) return "unknown";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

GpuProbe probe_gpus(const std::string& library_name) {
  GpuProbe probe;
  // The library stays loaded: unloading a driver library that made contexts is not safe.
  void* library = ::dlopen(library_name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = ::dlerror();
    probe.status = "no NVIDIA driver: cannot load " + library_name + (why ? std::string(" (") + why + ")" : "");
    return probe;
  }
  Driver driver;
  const bool complete = bind(library, driver.cuInit, "cuInit") &&
                        bind(library, driver.cuDriverGetVersion, "cuDriverGetVersion") &&
                        bind(library, driver.cuDeviceGetCount, "cuDeviceGetCount") &&
                        bind(library, driver.cuDeviceGet, "cuDeviceGet") &&
                        bind(library, driver.cuDeviceGetName, "cuDeviceGetName") &&
                        bind(library, driver.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
                        bind(library, driver.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
  if (!complete) {
    probe.status = library_name + " lacks the CUDA driver API entry points (not an NVIDIA driver library?)";
    probe.driver_problem = true;
    return probe;
  }
  bind(library, driver.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
  bind(library, driver.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  bind(library, driver.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  bind(library, driver.cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  bind(library, driver.cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  bind(library, driver.cuMemGetInfo, "cuMemGetInfo_v2");
  bind(library, driver.cuGetErrorName, "cuGetErrorName");
  bind(library, driver.cuGetErrorString, "cuGetErrorString");

  driver.cuDriverGetVersion(&probe.cuda_driver_version);
  const CUresult init = driver.cuInit(0);
  if (init != kSuccess) {
    probe.status = init == kErrorNoDevice      ? "the NVIDIA driver sees no GPU"
                   : init == kErrorStubLibrary ? "no NVIDIA driver: " + library_name + " is the CUDA toolkit's stub"
                                               : "the NVIDIA driver failed to start: " + error_text(driver, init);
    probe.driver_problem = init != kErrorNoDevice && init != kErrorStubLibrary;
    return probe;
  }
  probe.driver_loaded = true;
  int count = 0;
  const CUresult counted = driver.cuDeviceGetCount(&count);
  if (counted != kSuccess) {
    probe.status = "cannot count GPUs: " + error_text(driver, counted);
    probe.driver_problem = true;
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    if (driver.cuDeviceGet(&device, i) != kSuccess) continue;
    GpuDevice gpu;
    gpu.index = i;
    char name[256] = {};
    if (driver.cuDeviceGetName(name, int(sizeof name) - 1, device) == kSuccess) gpu.name = name;
    driver.cuDeviceGetAttribute(&gpu.major, kAttrComputeCapabilityMajor, device);
    driver.cuDeviceGetAttribute(&gpu.minor, kAttrComputeCapabilityMinor, device);
    driver.cuDeviceGetAttribute(&gpu.multiprocessors, kAttrMultiprocessorCount, device);
    driver.cuDeviceGetAttribute(&gpu.shared_memory_per_block_optin, kAttrSharedMemoryPerBlockOptin, device);
    size_t total = 0;
    if (driver.cuDeviceTotalMem(&total, device) == kSuccess) gpu.total_memory = total;
    if (driver.cuDeviceGetPCIBusId) {
      char bus[64] = {};
      if (driver.cuDeviceGetPCIBusId(bus, int(sizeof bus) - 1, device) == kSuccess) gpu.pci_bus_id = bus;
    }
    // Free memory needs a context; the primary one is shared with anything else in this process.
    if (driver.cuDevicePrimaryCtxRetain && driver.cuDevicePrimaryCtxRelease && driver.cuCtxPushCurrent &&
        driver.cuCtxPopCurrent && driver.cuMemGetInfo) {
      CUcontext context = nullptr;
      if (driver.cuDevicePrimaryCtxRetain(&context, device) == kSuccess) {
        if (driver.cuCtxPushCurrent(context) == kSuccess) {
          size_t free_bytes = 0, total_bytes = 0;
          if (driver.cuMemGetInfo(&free_bytes, &total_bytes) == kSuccess) {
            gpu.free_memory = free_bytes;
            gpu.free_known = true;
          }
          CUcontext popped = nullptr;
          driver.cuCtxPopCurrent(&popped);
        }
        driver.cuDevicePrimaryCtxRelease(device);
      }
    }
    probe.gpus.push_back(gpu);
  }
  probe.status = probe.gpus.empty() ? "the NVIDIA driver sees no GPU" : "ok";
  return probe;
}

}  // namespace anvil::tools
