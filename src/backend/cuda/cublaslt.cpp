#include "backend/cuda/cublaslt.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#if ANVIL_HAVE_CUBLASLT_H
#include <cublasLt.h>
#endif

namespace anvil::cuda::cublaslt {

namespace {

std::atomic<bool>& allowed() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("ANVIL_CUBLASLT");
    return !(env && std::string(env) == "0");
  }()};
  return flag;
}

}  // namespace

void allow(bool on) { allowed().store(on); }

#if !ANVIL_HAVE_CUBLASLT_H

bool available() { return false; }
std::string describe() { return "not used: this build had no cublasLt.h"; }
bool matmul_bf16(const uint16_t*, const float*, const uint16_t*, int64_t, int64_t, int64_t, float*, bool,
                 cudaStream_t) {
  return false;
}

#else

namespace {

// The entry points used, resolved from the opened library. decltype of the header's declarations
// keeps the signatures exact without linking.
struct Api {
  void* library = nullptr;
  std::string path, failure;
  size_t version = 0;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// The soname of the major version whose header this file was compiled against (its enums and
// structs are what the calls pass), then the toolkit's usual places.
std::vector<std::string> candidates() {
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::vector<std::string> paths;
  if (const char* env = std::getenv("ANVIL_CUBLASLT_PATH")) paths.emplace_back(env);
  paths.push_back(soname);
  paths.push_back("/usr/local/cuda/lib64/" + soname);
  paths.push_back("/usr/local/cuda/targets/x86_64-linux/lib/" + soname);
  paths.push_back("/usr/local/cuda/targets/sbsa-linux/lib/" + soname);
  return paths;
}

const Api& api() {
  static const Api loaded = [] {
    Api a;
    for (const std::string& path : candidates()) {
      a.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (a.library) {
        a.path = path;
        break;
      }
    }
    if (!a.library) {
      a.failure = "not found (libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR) +
                  " on the library path or under /usr/local/cuda; ANVIL_CUBLASLT_PATH names another)";
      return a;
    }
    bool complete = true;
    auto bind = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(a.library, name));
      complete = complete && function != nullptr;
    };
    bind(a.get_version, "cublasLtGetVersion");
    bind(a.create, "cublasLtCreate");
    bind(a.desc_create, "cublasLtMatmulDescCreate");
    bind(a.desc_destroy, "cublasLtMatmulDescDestroy");
    bind(a.desc_set, "cublasLtMatmulDescSetAttribute");
    bind(a.layout_create, "cublasLtMatrixLayoutCreate");
    bind(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
    bind(a.preference_create, "cublasLtMatmulPreferenceCreate");
    bind(a.preference_destroy, "cublasLtMatmulPreferenceDestroy");
    bind(a.preference_set, "cublasLtMatmulPreferenceSetAttribute");
    bind(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    bind(a.matmul, "cublasLtMatmul");
    if (!complete) {
      a.failure = a.path + " lacks an entry point anvil uses";
      a.library = nullptr;
      return a;
    }
    a.version = a.get_version();
    // Enums and structs are those of the compiled-against major version.
    if (a.version / 10000 != CUBLAS_VER_MAJOR) {
      a.failure = a.path + " is version " + std::to_string(a.version) + ", not major version " +
                  std::to_string(CUBLAS_VER_MAJOR);
      a.library = nullptr;
    }
    return a;
  }();
  return loaded;
}

// Recommended for Hopper and Blackwell; smaller GPUs use less of it.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// One handle and workspace per device, made on the first call outside stream capture.
struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool ready = false, broken = false;
};

// A shape's algorithm, chosen once by the library's heuristic (none: the shape is refused).
struct Plan {
  bool tried = false, found = false;
  cublasLtMatmulAlgo_t algo{};
};
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, bool, bool>;  // device, m, out, in, accumulate, bias

std::mutex& state_mutex() {
  static std::mutex mutex;
  return mutex;
}

DeviceState& device_state(int device) {
  static std::array<DeviceState, 64> states;
  return states[size_t(device)];
}

std::map<PlanKey, Plan>& plans() {
  static std::map<PlanKey, Plan> cache;
  return cache;
}

// RAII for the descriptors of one call.
struct Descriptors {
  const Api& a;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  explicit Descriptors(const Api& api) : a(api) {}
  ~Descriptors() {
    if (desc) a.desc_destroy(desc);
    for (cublasLtMatrixLayout_t layout : {w, x, y})
      if (layout) a.layout_destroy(layout);
  }
};

}  // namespace

bool available() { return allowed().load() && api().library != nullptr; }

std::string describe() {
  const Api& a = api();
  if (!a.library) return "not used: " + a.failure;
  std::string line = a.path + " (version " + std::to_string(a.version) + ")";
  if (!allowed().load()) line += ", turned off (ANVIL_CUBLASLT=0)";
  return line;
}

bool matmul_bf16(const uint16_t* weight, const float* bias, const uint16_t* x, int64_t m, int64_t out, int64_t in,
                 float* y, bool accumulate, cudaStream_t stream) {
  if (!available() || m <= 0 || out <= 0 || in <= 0) return false;
  const Api& a = api();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceState& state = device_state(device);
  if (state.broken) return false;
  if (!state.ready) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
      return false;
    if (a.create(&state.handle) != CUBLAS_STATUS_SUCCESS) {
      state.broken = true;
      return false;
    }
    // Without the workspace cuBLASLt still runs, with fewer algorithms.
    if (cudaMalloc(&state.workspace, kWorkspaceBytes) == cudaSuccess) {
      state.workspace_bytes = kWorkspaceBytes;
    } else {
      (void)cudaGetLastError();
      state.workspace = nullptr;
    }
    state.ready = true;
  }

  // Column-major view: Yᵀ[out, m] = W[out, in] · Xᵀ[in, m], i.e. D = op(A) · B with A = the weight
  // stored [in, out] (ld in), transposed, and B = x stored [in, m] (ld in).
  Descriptors d(a);
  const cublasOperation_t transpose = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  const cudaDataType_t bias_type = CUDA_R_32F;
  if (a.desc_create(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
      a.desc_set(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)) != CUBLAS_STATUS_SUCCESS ||
      a.desc_set(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain)) != CUBLAS_STATUS_SUCCESS ||
      a.desc_set(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) != CUBLAS_STATUS_SUCCESS)
    return false;
  if (bias && (a.desc_set(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) != CUBLAS_STATUS_SUCCESS ||
               a.desc_set(d.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)) !=
                   CUBLAS_STATUS_SUCCESS))
    return false;
  if (a.layout_create(&d.w, CUDA_R_16BF, uint64_t(in), uint64_t(out), in) != CUBLAS_STATUS_SUCCESS ||
      a.layout_create(&d.x, CUDA_R_16BF, uint64_t(in), uint64_t(m), in) != CUBLAS_STATUS_SUCCESS ||
      a.layout_create(&d.y, CUDA_R_32F, uint64_t(out), uint64_t(m), out) != CUBLAS_STATUS_SUCCESS)
    return false;

  Plan& plan = plans()[PlanKey{device, m, out, in, accumulate, bias != nullptr}];
  if (!plan.tried) {
    plan.tried = true;
    cublasLtMatmulPreference_t preference = nullptr;
    if (a.preference_create(&preference) != CUBLAS_STATUS_SUCCESS) return false;
    // x, W and y are 16-byte aligned (the caller's contract; y is a fresh or arena buffer).
    const uint32_t aligned = 16;
    const uint64_t workspace = state.workspace_bytes;
    a.preference_set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    a.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aligned, sizeof(aligned));
    a.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aligned, sizeof(aligned));
    a.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aligned, sizeof(aligned));
    a.preference_set(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligned, sizeof(aligned));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status =
        a.heuristic(state.handle, d.desc, d.w, d.x, d.y, d.y, preference, 1, &result, &returned);
    a.preference_destroy(preference);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan.algo = result.algo;
      plan.found = true;
    }
  }
  if (!plan.found) return false;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return a.matmul(state.handle, d.desc, &alpha, weight, d.w, x, d.x, &beta, y, d.y, y, d.y, &plan.algo,
                  state.workspace, state.workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
}

#endif

}  // namespace anvil::cuda::cublaslt
