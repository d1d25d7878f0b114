// Kernel timeline of any CUDA program, CUDA graphs included: a CUDA injection library (loaded by
// the driver through CUDA_INJECTION64_PATH) that records every kernel's start and end with CUPTI's
// concurrent-kernel activity (which does not serialize kernels, so programmatic dependent launches
// keep overlapping) and writes one CSV line per kernel at exit. nsys does not run on the lent
// GPU machine; this is what tells how long each kernel of a decode graph really holds the chain
// (tools/cuda-harness/graph_timeline.py reads the CSV).
//
//   g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/cuda-harness/kernel_trace.cpp \
//       -L/usr/local/cuda/lib64 -lcupti -o libkernel_trace.so
//   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so ANVIL_TRACE_OUT=trace.csv build/anvil bench-gpu ...
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct Row {
  uint64_t start, end;
  uint32_t graph;
  uint64_t node;
  int32_t grid[3], block[3];
  std::string name;
};

std::mutex g_mutex;
std::vector<Row> g_rows;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_rows.push_back({k->start, k->end, k->graphId, k->graphNodeId, {k->gridX, k->gridY, k->gridZ},
                      {k->blockX, k->blockY, k->blockZ}, k->name ? k->name : "?"});
  }
  std::free(buffer);
}

void write_rows() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("ANVIL_TRACE_OUT");
  FILE* out = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!out) return;
  std::fprintf(out, "start_ns,end_ns,graph,node,grid,block,name\n");
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Row& r : g_rows) {
    std::string name = r.name;
    for (char& c : name)
      if (c == ',' || c == '"') c = ';';
    std::fprintf(out, "%llu,%llu,%u,%llu,%dx%dx%d,%dx%dx%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.graph, static_cast<unsigned long long>(r.node), r.grid[0],
                 r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2], name.c_str());
  }
  std::fclose(out);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  std::atexit(write_rows);
  return 1;
}
