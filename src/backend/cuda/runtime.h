#pragma once
// The CUDA backend's host side: which GPUs are here, which kernels each one gets, and device
// memory. Plain C++ (no CUDA headers), so every layer above can use it, and a build without nvcc
// links unavailable.cpp instead: devices() is then empty and allocation fails with a clear error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace anvil::cuda {

// An opaque cudaStream_t; nullptr is the legacy default stream.
using Stream = void*;

// Element type of a KV cache on the device. BF16 is the default; F32 keeps the cache exact (the
// float32 compute mode); FP8_E4M3 halves it again (scale 1, saturating, as vLLM without scales).
enum class KvDtype { BF16, F32, FP8_E4M3 };
inline size_t kv_dtype_bytes(KvDtype dtype) {
  return dtype == KvDtype::F32 ? 4 : dtype == KvDtype::BF16 ? 2 : 1;
}
inline const char* kv_dtype_name(KvDtype dtype) {
  return dtype == KvDtype::F32 ? "float32" : dtype == KvDtype::BF16 ? "bfloat16" : "fp8_e4m3";
}

// True when this binary carries CUDA kernels.
bool compiled_in();
// The targets compiled ahead of time, as given to the build ("sm_90a", "compute_80", ...).
std::vector<std::string> compiled_targets();
// The CUDA version this binary was built with (CUDART_VERSION, e.g. 13000); 0 without CUDA.
// The driver must support at least this version.
int build_cuda_version();

// Whether cuBLASLt (opened at run time for prefill-sized bf16 products) was found: the library and
// its version, or why it is not used. "" in a build without CUDA.
std::string cublaslt_status();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;
  size_t total_memory = 0, free_memory = 0;
  int multiprocessors = 0;
  size_t l2_bytes = 0;
  size_t shared_memory_per_block_optin = 0;
  double memory_clock_khz = 0;
  int memory_bus_bits = 0;
};

// Every visible GPU; empty (never an exception) when there is no driver or no device.
std::vector<DeviceInfo> devices();
// Why devices() is empty, in one line ("no NVIDIA driver", "built without CUDA", ...).
std::string unavailable_reason();

// Kernel families by exact compute capability. Each op names the implementation a GPU of that
// (major, minor) runs; a capability missing from the table is refused at load, never guessed from
// "major >= N". `target` is the ahead-of-time code the row relies on.
struct OpKernel {
  std::string op;
  std::string family;
};
struct ArchKernels {
  int major = 0, minor = 0;
  std::string gpus;    // examples, for humans
  std::string target;  // e.g. "sm_90a"
  std::vector<OpKernel> ops;
};
const std::vector<ArchKernels>& kernel_table();
// The row for (major, minor); throws naming the capability and the supported ones when absent,
// or when this build lacks the row's target.
const ArchKernels& kernels_for(int major, int minor);

// The kernels built on the bulk copy engine (the batch-1 GEMV, where the kernel table names it) can
// be turned off for launches from now on, to compare them with the kernels they replace (tests,
// A/B; ANVIL_BULK_COPY=0 starts with them off). A captured graph keeps what it was captured with.
void allow_bulk_copy_kernels(bool allowed);
bool bulk_copy_kernels_allowed();

// Whether the current device's kernel-table row names `family` for `op` (asked once per device and
// op).
bool current_device_runs(const std::string& op, const std::string& family);
// The decode GEMV's op and its bulk-copy family (linear_dense.cu picks the kernel by it).
inline constexpr const char* kLinearDecodeOp = "linear_decode";
inline constexpr const char* kLinearDecodeBulk =
    "bf16 GEMV at batch 1 fed by bulk copies (cp.async.bulk) into a shared-memory ring filled before its "
    "predecessor ends";

// Batch 1's MoE sum (MXFP4 experts, four picks): its family where the row's down kernel adds the
// experts' sum itself (moe_down_sum_f16.cuh; 60 KB blocks, three per SM where shared memory holds
// them), otherwise the combine kernel runs.
inline constexpr const char* kMoeBatch1SumOp = "moe_batch1_sum";
inline constexpr const char* kMoeBatch1SumInDown =
    "the experts' weighted sum inside down (one warp holds all four experts' rows), no combine kernel";

// Batch 1's post-attention norm, router and expert picks (gpt-oss: MXFP4, four picks, with the sum
// in down): the family where one cluster launch makes all three (moe_norm_route.cuh), otherwise a
// norm + router kernel and a one-warp routing kernel. allow_fused_routing(false) (or
// ANVIL_FUSED_ROUTE=0 at start) turns it off for launches from now on, to compare (tests, A/B).
inline constexpr const char* kMoeBatch1RouteOp = "moe_route_batch1";
inline constexpr const char* kMoeBatch1RouteCluster =
    "norm, router and top-k in one cluster of 8 blocks, 16 where an eighth of the router exceeds 64 KB (logits over "
    "distributed shared memory)";
void allow_fused_routing(bool allowed);
bool fused_routing_allowed();

// Decode attention's blocks (the tensor-core kernel, head_dim 64): the family where one 20-warp
// block per KV head takes contexts that 8-warp blocks would split (attention_decode_mma.cuh).
inline constexpr const char* kDecodeAttentionBlockOp = "attention_decode_block";
inline constexpr const char* kDecodeAttentionWide =
    "head_dim 64 in one 20-warp block per KV head up to 640 keys (160 KB of shared memory), merged in shared memory";

// A decode step's RoPE and KV write: the family where the tensor-core decode attention makes them
// itself (head_dim 64, attention_decode_mma.cuh), otherwise a RoPE kernel before it.
// allow_rope_in_attention(false) (or ANVIL_FUSED_ROPE=0 at start) turns it off, to compare.
inline constexpr const char* kDecodeRopeOp = "attention_decode_rope";
inline constexpr const char* kDecodeRopeInAttention =
    "RoPE and the KV write inside the tensor-core decode attention (head_dim 64), no RoPE kernel";
void allow_rope_in_attention(bool allowed);
bool rope_in_attention_allowed();

// Whether the current device's kernel-table row launches a step's kernels as programmatic
// dependents (backend/cuda/launch.cuh). ANVIL_CHAINED_LAUNCH=0 turns it off, to measure it.
bool chained_launch_enabled();
// Turns chained launches off (false) or back to the table's choice (true) for launches from now
// on; a captured graph keeps what it was captured with. For tests and A/B measurements.
void allow_chained_launch(bool allowed);

// The current device's multiprocessor count (kernel launchers size their grids by it), asked of
// the driver once per device.
int current_multiprocessors();

// Makes `index` the current device and checks its capability against the kernel table.
const ArchKernels& select_device(int index);

// Device memory. Allocation failures throw with the size and the free memory.
void* device_alloc(size_t bytes);
void device_free(void* pointer);
size_t device_free_memory();
size_t device_total_memory();
void copy_to_device(void* device, const void* host, size_t bytes, Stream stream = nullptr);
void copy_to_host(void* host, const void* device, size_t bytes, Stream stream = nullptr);
void copy_device_to_device(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
void memset_device(void* device, int value, size_t bytes, Stream stream = nullptr);
void synchronize(Stream stream = nullptr);
// Page-locked host memory, for fast and asynchronous copies.
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* pointer);
// Throws if a kernel launched so far failed.
void check_last_error(const char* what);

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : data_(bytes ? device_alloc(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { device_free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      device_free(data_);
      data_ = other.data_;
      bytes_ = other.bytes_;
      other.data_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A stream of its own that does not wait on the legacy default stream: graph capture needs one,
// and a model's work on it does not serialize with other streams.
class OwnedStream {
 public:
  OwnedStream();
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

// Work captured from one stream and replayed with one launch (a CUDA graph): a decode step's few
// hundred small kernels cost one launch instead of one each. Replays use the kernel arguments and
// buffers of the capture, so callers key graphs by everything those depend on.
class StreamGraph {
 public:
  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  // Everything enqueued on `stream` between the two calls is captured, not run. end_capture
  // instantiates it; abort_capture (after an exception) leaves the stream usable again.
  static void begin_capture(Stream stream);
  void end_capture(Stream stream);
  static void abort_capture(Stream stream);
  void launch(Stream stream) const;
  bool ready() const { return exec_ != nullptr; }
  void reset();

 private:
  void* exec_ = nullptr;
};

// Named device events along one stream, for a per-operation time breakdown of a step without a
// profiler (none runs on every machine): record() after each operation, then times() gives the
// milliseconds between consecutive marks, summed per name. Recording is off until enable().
class StreamMarks {
 public:
  explicit StreamMarks(Stream stream) : stream_(stream) {}
  ~StreamMarks();
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;
  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void record(const char* name);
  // Waits for the stream, returns (name, total ms) in first-seen order, and clears the marks.
  std::vector<std::pair<std::string, double>> times();

 private:
  Stream stream_;
  bool enabled_ = false;
  std::vector<std::pair<const char*, void*>> marks_;
  std::vector<void*> spare_;
};

// Timing with device events around a region on one stream (milliseconds).
class EventTimer {
 public:
  explicit EventTimer(Stream stream = nullptr);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  void stop();         // marks the region's end on the stream, without waiting
  double elapsed_ms();  // waits for the region to finish
  double stop_ms() {
    stop();
    return elapsed_ms();
  }

 private:
  Stream stream_;
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace anvil::cuda
