// Host side of the CUDA backend: device discovery, the exact-architecture kernel table, memory.
#include "backend/cuda/runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include <fmt/ranges.h>

#include "backend/cuda/cublaslt.h"
#include "core/error.h"

namespace anvil::cuda {

void throw_cuda_error(const char* call, int status, const char* file, int line) {
  fail("CUDA: {} failed: {} ({}:{})", call, cudaGetErrorString(cudaError_t(status)), file, line);
}

#define RT_CHECK(call)                                                                \
  do {                                                                             \
    const cudaError_t status_ = (call);                                            \
    if (status_ != cudaSuccess) throw_cuda_error(#call, int(status_), __FILE__, __LINE__); \
  } while (0)

bool compiled_in() { return true; }

std::vector<std::string> compiled_targets() { return {ANVIL_CUDA_TARGET_LIST}; }

int build_cuda_version() { return CUDART_VERSION; }

std::string cublaslt_status() { return cublaslt::describe(); }

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> found;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" status so later calls start clean
    return found;
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    info.total_memory = prop.totalGlobalMem;
    info.multiprocessors = prop.multiProcessorCount;
    info.l2_bytes = size_t(prop.l2CacheSize);
    info.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, i);
    info.memory_clock_khz = clock_khz;
    cudaDeviceGetAttribute(&info.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, i);
    if (cudaSetDevice(i) == cudaSuccess) {
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) info.free_memory = free_bytes;
    }
    found.push_back(info);
  }
  cudaSetDevice(current);
  cudaGetLastError();
  return found;
}

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) return "no CUDA GPU is visible";
  if (status == cudaErrorInsufficientDriver) return "no NVIDIA driver (or one too old for CUDA 13)";
  if (status != cudaSuccess) return std::string("CUDA unavailable: ") + cudaGetErrorString(status);
  return "";
}

namespace {

// Every row lists the same op families today: the portable mma.sync kernels run on all of these
// generations. A row exists per exact capability so that a future Hopper- or Blackwell-only
// family (wgmma, tcgen05) is added where it belongs and can never be picked for SM120 by a
// ">= 100" test: SM120 (RTX PRO 6000 / RTX 5090) has no tcgen05 and 99 KB of shared memory.
// kLaunchChained: the op that says whether kernels of a step are launched as programmatic
// dependents (griddepcontrol, compute capability 9.0+), or in plain stream order.
constexpr const char* kLaunchOp = "launch";
constexpr const char* kLaunchChained = "programmatic dependent launch (griddepcontrol)";

// What a row runs beyond the portable kernels, each only where it was measured:
// - bulk_copy: the batch-1 GEMV through the bulk copy engine (cp.async.bulk, compute capability
//   9.0 and later), measured on an H200 only so far; the other rows keep the register ring.
// - sum_in_down: batch 1's MoE sum inside down, measured on an H100 and an H200 (docs/perf/gpu.md,
//   sessions 27-28); SM120 and Ada hold one of its 60 KB blocks per SM, a third of what it was
//   measured with.
// - fused_route: batch 1's norm, router and picks as one cluster launch (clusters: compute
//   capability 9.0 and later), measured on an H100 (session 31: batch 1 +1.4 % / +1.7 %, batch 8
//   level) and the H200 (batch 1 level to +1.8 % for 20b, +1.1 % for 120b; batch 64 level); its
//   92 KB blocks for 128 experts would not fit beside SM120's neighbouring kernels.
// - rope_in_attention: the decode step's RoPE and KV write inside the tensor-core decode attention.
//   Measured on an H100 (session 31): level at batch 1 (and with fused_route 0.3-0.5 % below it
//   alone), +0.6-0.8 % at batch 8; no row names it.
// - wide_decode_attention: 20-warp decode attention blocks, measured on H100s and an H200
//   (session 29); they need ~161 KB of shared memory, which SM120, Ada and SM86 cannot give one
//   block (an A100's 163 KB could hold one; unmeasured there).
struct RowChoices {
  bool chained_launch = false;
  bool bulk_copy = false;
  bool sum_in_down = false;
  bool fused_route = false;
  bool rope_in_attention = false;
  bool wide_decode_attention = false;
};

std::vector<OpKernel> portable_ops(RowChoices row) {
  return {
      {"linear",
       "vectorized mma.sync GEMV (decode) and m16n8k16 GEMM; bf16 products of >= 32 rows through cuBLASLt when "
       "found; bf16 or FP8 E4M3 weights (FP8 decoded in registers)"},
      {kLinearDecodeOp, row.bulk_copy ? kLinearDecodeBulk : "register-ring GEMV (as linear)"},
      {"moe_quantized",
       "mma.sync W4A16 / W8A16 grouped GEMM and decode; MXFP4, NVFP4 or FP8 experts dequantized in registers "
       "(MXFP4 at batch 1: fp16 mma on the codes, block scales on the fp32 results); bf16 experts through the grouped "
       "GEMM for long prompts"},
      {kMoeBatch1SumOp, row.sum_in_down ? kMoeBatch1SumInDown : "a combine kernel after down (with the next norm)"},
      {kMoeBatch1RouteOp,
       row.fused_route ? kMoeBatch1RouteCluster : "a norm + router kernel, then a one-warp routing kernel"},
      {"attention",
       "paged, fp32 online softmax, sinks + window: tiled (prefill), one pass with in-kernel split merge (decode; "
       "mma.sync with a bf16 cache)"},
      {kDecodeAttentionBlockOp, row.wide_decode_attention
                                    ? kDecodeAttentionWide
                                    : "8-warp blocks (4 for head_dim 128), splits merged by the last to finish"},
      {kDecodeRopeOp, row.rope_in_attention ? kDecodeRopeInAttention : "a RoPE + KV write kernel before the attention"},
      {"norm_rope_embed", "elementwise (fp32)"},
      {kLaunchOp, row.chained_launch ? kLaunchChained : "stream order"},
  };
}

}  // namespace

const std::vector<ArchKernels>& kernel_table() {
  static const std::vector<ArchKernels> table = {
      {8, 0, "A100, A30", "sm_80", portable_ops({})},
      {8, 6, "RTX 3090, A40, A6000", "sm_86", portable_ops({})},
      {8, 9, "RTX 4090, L40S, RTX 6000 Ada", "sm_89", portable_ops({})},
      {9, 0, "H100, H200, GH200", "sm_90a", portable_ops({.chained_launch = true, .bulk_copy = true, .sum_in_down = true,
                                                         .fused_route = true, .wide_decode_attention = true})},
      {10, 0, "B200, GB200", "sm_100a", portable_ops({.chained_launch = true})},
      {12, 0, "RTX PRO 6000 Blackwell, RTX 5090", "sm_120a", portable_ops({.chained_launch = true})},
  };
  return table;
}

const ArchKernels& kernels_for(int major, int minor) {
  std::string supported;
  for (const auto& row : kernel_table()) {
    if (row.major == major && row.minor == minor) {
      const auto targets = compiled_targets();
      if (std::find(targets.begin(), targets.end(), row.target) == targets.end())
        fail("this anvil build has no {} code for compute capability {}.{} (built for: {}); rebuild with "
             "-DANVIL_CUDA_TARGETS including {}",
             row.target, major, minor, fmt::join(targets, ", "), row.target);
      return row;
    }
    supported += fmt::format("{}{}.{}", supported.empty() ? "" : ", ", row.major, row.minor);
  }
  fail("GPU compute capability {}.{} is not supported (anvil has kernels for {}); use --device cpu", major, minor,
       supported);
}

// A feature switch that is on unless `env_name` is "0" at start (tests and A/B runs turn it off).
static bool on_unless_env_zero(const char* env_name) {
  const char* env = std::getenv(env_name);
  return !(env && std::string(env) == "0");
}

static std::atomic<bool>& chained_launch_allowed() {
  static std::atomic<bool> allowed{on_unless_env_zero("ANVIL_CHAINED_LAUNCH")};
  return allowed;
}

int current_multiprocessors() {
  static std::atomic<int> cache[64] = {};  // 0: not asked yet
  int device = 0;
  RT_CHECK(cudaGetDevice(&device));
  int count = device >= 0 && device < 64 ? cache[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    RT_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    if (device >= 0 && device < 64) cache[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

bool chained_launch_enabled() {
  // Per device index; -1 unknown, 0 off, 1 on. Filled on first use (a launch outside capture).
  static std::atomic<int8_t> cache[64] = {};
  static std::once_flag once;
  std::call_once(once, [] {
    for (auto& entry : cache) entry.store(-1, std::memory_order_relaxed);
  });
  int device = 0;
  RT_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) return false;
  int8_t value = cache[device].load(std::memory_order_relaxed);
  if (value < 0) {
    int major = 0, minor = 0;
    RT_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    RT_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    value = 0;
    for (const auto& row : kernel_table())
      if (row.major == major && row.minor == minor)
        for (const auto& op : row.ops)
          if (op.op == kLaunchOp && op.family == kLaunchChained) value = 1;
    cache[device].store(value, std::memory_order_relaxed);
  }
  return value == 1 && chained_launch_allowed().load(std::memory_order_relaxed);
}

static std::atomic<bool>& bulk_copy_allowed() {
  static std::atomic<bool> allowed{on_unless_env_zero("ANVIL_BULK_COPY")};
  return allowed;
}

void allow_bulk_copy_kernels(bool allowed) { bulk_copy_allowed().store(allowed, std::memory_order_relaxed); }
bool bulk_copy_kernels_allowed() { return bulk_copy_allowed().load(std::memory_order_relaxed); }

static std::atomic<bool>& fused_routing_switch() {
  static std::atomic<bool> allowed{on_unless_env_zero("ANVIL_FUSED_ROUTE")};
  return allowed;
}

void allow_fused_routing(bool allowed) { fused_routing_switch().store(allowed, std::memory_order_relaxed); }
bool fused_routing_allowed() { return fused_routing_switch().load(std::memory_order_relaxed); }

static std::atomic<bool>& rope_in_attention_switch() {
  static std::atomic<bool> allowed{on_unless_env_zero("ANVIL_FUSED_ROPE")};
  return allowed;
}

void allow_rope_in_attention(bool allowed) { rope_in_attention_switch().store(allowed, std::memory_order_relaxed); }
bool rope_in_attention_allowed() { return rope_in_attention_switch().load(std::memory_order_relaxed); }

bool current_device_runs(const std::string& op, const std::string& family) {
  int device = 0;
  RT_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, bool> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, op + '\n' + family);
  if (const auto found = cache.find(key); found != cache.end()) return found->second;
  int major = 0, minor = 0;
  RT_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  RT_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  bool runs = false;
  for (const auto& row : kernel_table())
    if (row.major == major && row.minor == minor)
      for (const auto& entry : row.ops) runs = runs || (entry.op == op && entry.family == family);
  cache.emplace(key, runs);
  return runs;
}

void allow_chained_launch(bool allowed) { chained_launch_allowed().store(allowed, std::memory_order_relaxed); }

const ArchKernels& select_device(int index) {
  const auto all = devices();
  if (all.empty()) fail("no usable CUDA GPU: {}", unavailable_reason());
  if (index < 0 || index >= int(all.size())) fail("CUDA device {} does not exist ({} visible)", index, all.size());
  const ArchKernels& row = kernels_for(all[size_t(index)].major, all[size_t(index)].minor);
  RT_CHECK(cudaSetDevice(index));
  return row;
}

void* device_alloc(size_t bytes) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA: cannot allocate {:.2f} GiB of device memory ({:.2f} GiB free): {}", double(bytes) / (1 << 30),
         double(device_free_memory()) / (1 << 30), cudaGetErrorString(status));
  }
  return pointer;
}

void device_free(void* pointer) {
  if (pointer) cudaFree(pointer);
}

size_t device_free_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free_bytes;
}

size_t device_total_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return total_bytes;
}

void copy_to_device(void* device, const void* host, size_t bytes, Stream stream) {
  RT_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
}

void copy_to_host(void* host, const void* device, size_t bytes, Stream stream) {
  RT_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
}

void copy_device_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
  RT_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
}

void memset_device(void* device, int value, size_t bytes, Stream stream) {
  RT_CHECK(cudaMemsetAsync(device, value, bytes, static_cast<cudaStream_t>(stream)));
}

void synchronize(Stream stream) { RT_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

void* host_alloc_pinned(size_t bytes) {
  void* pointer = nullptr;
  RT_CHECK(cudaMallocHost(&pointer, bytes));
  return pointer;
}

void host_free_pinned(void* pointer) {
  if (pointer) cudaFreeHost(pointer);
}

void check_last_error(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(what, int(status), __FILE__, __LINE__);
}

OwnedStream::OwnedStream() {
  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
}

OwnedStream::~OwnedStream() { cudaStreamDestroy(static_cast<cudaStream_t>(stream_)); }

StreamGraph::~StreamGraph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

void StreamGraph::begin_capture(Stream stream) {
  // Thread-local mode: other threads' CUDA calls (another model, the allocator) do not join or
  // break this capture.
  RT_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
}

void StreamGraph::end_capture(Stream stream) {
  cudaGraph_t graph = nullptr;
  RT_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) throw_cuda_error("cudaGraphInstantiate", int(status), __FILE__, __LINE__);
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = exec;
}

void StreamGraph::abort_capture(Stream stream) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // the failed capture's status is not the next call's business
}

void StreamGraph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
}

void StreamGraph::launch(Stream stream) const {
  RT_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream)));
}

StreamMarks::~StreamMarks() {
  for (auto& mark : marks_) spare_.push_back(mark.second);
  for (void* event : spare_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void StreamMarks::record(const char* name) {
  if (!enabled_) return;
  void* event = nullptr;
  if (spare_.empty()) {
    cudaEvent_t created;
    RT_CHECK(cudaEventCreate(&created));
    event = created;
  } else {
    event = spare_.back();
    spare_.pop_back();
  }
  RT_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream_)));
  marks_.emplace_back(name, event);
}

std::vector<std::pair<std::string, double>> StreamMarks::times() {
  RT_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  std::vector<std::pair<std::string, double>> totals;
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0;
    RT_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(marks_[i - 1].second),
                                  static_cast<cudaEvent_t>(marks_[i].second)));
    const std::string name = marks_[i].first;
    auto found = std::find_if(totals.begin(), totals.end(), [&](const auto& t) { return t.first == name; });
    if (found == totals.end())
      totals.emplace_back(name, double(ms));
    else
      found->second += double(ms);
  }
  for (auto& mark : marks_) spare_.push_back(mark.second);
  marks_.clear();
  return totals;
}

EventTimer::EventTimer(Stream stream) : stream_(stream) {
  cudaEvent_t start, stop;
  RT_CHECK(cudaEventCreate(&start));
  RT_CHECK(cudaEventCreate(&stop));
  start_ = start;
  stop_ = stop;
}

EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void EventTimer::start() { RT_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_), static_cast<cudaStream_t>(stream_))); }

void EventTimer::stop() { RT_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_), static_cast<cudaStream_t>(stream_))); }

double EventTimer::elapsed_ms() {
  RT_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0;
  RT_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return double(ms);
}

}  // namespace anvil::cuda
