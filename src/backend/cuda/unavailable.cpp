// Stands in for the CUDA backend in a build without nvcc: no devices, and any attempt to use one
// says so. Kernel launchers are not declared here: model code calls them only under
// ANVIL_WITH_CUDA.
#include "backend/cuda/runtime.h"
#include "core/error.h"

namespace anvil::cuda {

namespace {
[[noreturn]] void no_cuda() { fail("this anvil was built without CUDA (no nvcc at build time); use --device cpu"); }
}  // namespace

bool compiled_in() { return false; }
std::vector<std::string> compiled_targets() { return {}; }
int build_cuda_version() { return 0; }
std::string cublaslt_status() { return ""; }
std::vector<DeviceInfo> devices() { return {}; }
std::string unavailable_reason() { return "this anvil was built without CUDA"; }
const std::vector<ArchKernels>& kernel_table() {
  static const std::vector<ArchKernels> empty;
  return empty;
}
const ArchKernels& kernels_for(int, int) { no_cuda(); }
const ArchKernels& select_device(int) { no_cuda(); }
bool chained_launch_enabled() { return false; }
bool current_device_runs(const std::string&, const std::string&) { return false; }
void allow_bulk_copy_kernels(bool) {}
bool bulk_copy_kernels_allowed() { return false; }
void allow_fused_routing(bool) {}
bool fused_routing_allowed() { return false; }
void allow_rope_in_attention(bool) {}
bool rope_in_attention_allowed() { return false; }
void allow_chained_launch(bool) {}
void* device_alloc(size_t) { no_cuda(); }
void device_free(void* pointer) {
  if (pointer) no_cuda();
}
size_t device_free_memory() { return 0; }
size_t device_total_memory() { return 0; }
void copy_to_device(void*, const void*, size_t, Stream) { no_cuda(); }
void copy_to_host(void*, const void*, size_t, Stream) { no_cuda(); }
void copy_device_to_device(void*, const void*, size_t, Stream) { no_cuda(); }
void memset_device(void*, int, size_t, Stream) { no_cuda(); }
void synchronize(Stream) { no_cuda(); }
void* host_alloc_pinned(size_t) { no_cuda(); }
void host_free_pinned(void* pointer) {
  if (pointer) no_cuda();
}
void check_last_error(const char*) {}
OwnedStream::OwnedStream() { no_cuda(); }
OwnedStream::~OwnedStream() = default;
StreamGraph::~StreamGraph() = default;
void StreamGraph::begin_capture(Stream) { no_cuda(); }
void StreamGraph::end_capture(Stream) { no_cuda(); }
void StreamGraph::abort_capture(Stream) {}
void StreamGraph::launch(Stream) const { no_cuda(); }
void StreamGraph::reset() {}
StreamMarks::~StreamMarks() = default;
void StreamMarks::record(const char*) {}
std::vector<std::pair<std::string, double>> StreamMarks::times() { return {}; }
EventTimer::EventTimer(Stream stream) : stream_(stream) { no_cuda(); }
EventTimer::~EventTimer() = default;
void EventTimer::start() { no_cuda(); }
void EventTimer::stop() { no_cuda(); }
double EventTimer::elapsed_ms() { no_cuda(); }

}  // namespace anvil::cuda
