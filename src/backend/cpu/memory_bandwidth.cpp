#include "backend/cpu/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/machine_peak.h"
#include "core/error.h"

namespace anvil {

namespace {
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
}  // namespace

double measure_copy_bandwidth_gbps(ThreadPool& pool, size_t bytes) {
  constexpr size_t kAlign = 4096;
  constexpr int kRepetitions = 5;
  bytes = std::max(kAlign, bytes / kAlign * kAlign);
  std::unique_ptr<char, FreeDeleter> src(static_cast<char*>(std::aligned_alloc(kAlign, bytes)));
  std::unique_ptr<char, FreeDeleter> dst(static_cast<char*>(std::aligned_alloc(kAlign, bytes)));
  if (!src || !dst) fail("memory bandwidth: cannot allocate 2 x {} bytes", bytes);

  // Split in page-aligned slices so no two threads share a page.
  const int64_t pages = int64_t(bytes / kAlign);
  auto for_slices = [&](auto&& fn) {
    pool.parallel_for(pages, [&](int64_t begin, int64_t end) {
      fn(size_t(begin) * kAlign, size_t(end - begin) * kAlign);
    });
  };
  // Touch every page first, from the thread that will copy it, so page faults are not timed.
  for_slices([&](size_t offset, size_t size) {
    std::memset(src.get() + offset, 1, size);
    std::memset(dst.get() + offset, 0, size);
  });

  double best = 0.0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for_slices([&](size_t offset, size_t size) { std::memcpy(dst.get() + offset, src.get() + offset, size); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0.0) best = std::max(best, 2.0 * double(bytes) / seconds / 1e9);
  }
  return best;
}

double measure_peak_fma_gflops(ThreadPool& pool) {
  if (!cpu::cpu_use_avx2()) return 0.0;
  constexpr int64_t kIterations = 20'000'000;  // 3.84 GFLOP per thread: ~0.1 s on a 2-3 GHz core
  // The batched kernels' own width: the peak they can reach, not the widest the CPU has.
  const bool wide = cpu::cpu_use_avx512();
  std::atomic<float> sink{0.0f};
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool.run_on_all([&](int) {
      sink.store(sink.load() + (wide ? cpu::fma_loop_avx512(kIterations) : cpu::fma_loop_avx2(kIterations)));
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double flops = double(pool.size()) * double(kIterations) * 12.0 * (wide ? 16.0 : 8.0) * 2.0;
    if (seconds > 0.0 && sink.load() != 0.0f) best = std::max(best, flops / seconds / 1e9);
  }
  return best;
}

}  // namespace anvil
