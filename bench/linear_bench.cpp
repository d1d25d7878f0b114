// Linear-layer kernels at gpt-oss shapes, and the machine's copy bandwidth to judge them by.
//
// fma_peak measures the arithmetic ceiling the same way bench-cpu does.
// Matrix-vector (tokens = 1) is memory bound: bytes_per_second counts weight bytes streamed per
// second, and pct_copy_bw compares that with measure_copy_bandwidth_gbps (STREAM-copy convention,
// read + write bytes). Matrix-matrix (tokens = 8, 64) is compute bound: FLOPS counts 2 * out * in
// * tokens per call. Threads are per benchmark; ANVIL_THREADS does not apply here.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/machine_peak.h"
#include "backend/cpu/memory_bandwidth.h"
#include "backend/linear.h"
#include "backend/vector_ops.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace {

using anvil::LinearWeight;
using anvil::ThreadPool;
using anvil::WeightFormat;

ThreadPool& pool_of(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

// Thread counts to run: ANVIL_BENCH_THREADS (a list like "1,8,16"), else 1 and 2.
const std::vector<int>& bench_threads() {
  static const std::vector<int> threads = [] {
    std::vector<int> list;
    if (const char* env = std::getenv("ANVIL_BENCH_THREADS")) {
      for (const char* p = env; *p != '\0';) {
        char* end = nullptr;
        const long value = std::strtol(p, &end, 10);
        if (end == p) break;
        if (value > 0) list.push_back(int(value));
        p = *end == ',' ? end + 1 : end;
      }
    }
    if (list.empty()) list = {1, 2};
    return list;
  }();
  return threads;
}

// Measured once, on first use, with all threads the largest benchmark uses.
double copy_bandwidth_gbps() {
  static const double gbps = anvil::measure_copy_bandwidth_gbps(pool_of(bench_threads().back()));
  return gbps;
}

uint64_t next_random(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

// Random weights in [-1, 1) (or random FP4 codes with scales near 1), owned by the object.
struct Layer {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
  LinearWeight weight;

  Layer(WeightFormat format, int64_t out, int64_t in) {
    uint64_t state = 0x9e3779b97f4a7c15ull;
    const size_t n = size_t(out * in);
    auto uniform = [&] { return float(next_random(state) >> 40) / float(1 << 23) - 1.0f; };
    if (format == WeightFormat::MXFP4) {
      data.resize(n / 2);
      for (auto& byte : data) byte = uint8_t(next_random(state));
      scales.resize(n / 32);
      for (auto& s : scales) s = uint8_t(120 + next_random(state) % 8);
    } else if (format == WeightFormat::F32) {
      data.resize(n * 4);
      for (size_t i = 0; i < n; ++i) {
        const float v = uniform();
        std::memcpy(data.data() + 4 * i, &v, 4);
      }
    } else {
      data.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const float v = uniform();
        const uint16_t bits = format == WeightFormat::BF16 ? anvil::f32_to_bf16(v) : anvil::f32_to_f16(v);
        std::memcpy(data.data() + 2 * i, &bits, 2);
      }
    }
    weight.format = format;
    weight.out_features = out;
    weight.in_features = in;
    weight.data = data.data();
    weight.scales = scales.empty() ? nullptr : scales.data();
  }
};

void bench_linear(benchmark::State& state, WeightFormat format, anvil::Mxfp4Activations mode, int64_t out, int64_t in,
                  int64_t tokens, int threads) {
  anvil::set_mxfp4_activations(mode);
  const Layer layer(format, out, in);
  uint64_t seed = 12345;
  std::vector<float> x(size_t(tokens * in));
  for (auto& v : x) v = float(next_random(seed) >> 40) / float(1 << 23) - 1.0f;
  std::vector<float> y(size_t(tokens * out));
  ThreadPool& pool = pool_of(threads);
  const double copy_gbps = tokens == 1 ? copy_bandwidth_gbps() : 0.0;

  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    anvil::linear_forward(layer.weight, x.data(), tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes = double(layer.weight.weight_bytes());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  state.counters["FLOPS"] = benchmark::Counter(2.0 * double(out) * double(in) * double(tokens),
                                               benchmark::Counter::kIsIterationInvariantRate);
  if (tokens == 1 && copy_gbps > 0.0 && seconds > 0.0) {
    state.counters["pct_copy_bw"] = 100.0 * bytes * double(state.iterations()) / seconds / (copy_gbps * 1e9);
  }
  state.SetLabel(anvil::cpu_kernel_isa());
}

// Matrix-vector over `copies` distinct layers of the same shape in turn, so that (with enough
// copies to overflow the last-level cache) every weight byte comes from DRAM, as in decode,
// where each layer's weights are read once per token. The single-layer benchmarks above reuse
// one layer that partly stays in cache. Reports per layer.
void bench_linear_dram(benchmark::State& state, WeightFormat format, anvil::Mxfp4Activations mode, int64_t out,
                       int64_t in, int copies, int64_t tokens, int threads) {
  anvil::set_mxfp4_activations(mode);
  std::vector<std::unique_ptr<Layer>> layers;
  for (int i = 0; i < copies; ++i) layers.push_back(std::make_unique<Layer>(format, out, in));
  uint64_t seed = 12345;
  std::vector<float> x(static_cast<size_t>(in * tokens));
  for (auto& v : x) v = float(next_random(seed) >> 40) / float(1 << 23) - 1.0f;
  std::vector<float> y(static_cast<size_t>(out * tokens));
  ThreadPool& pool = pool_of(threads);
  const double copy_gbps = copy_bandwidth_gbps();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (const auto& layer : layers) {
      anvil::linear_forward(layer->weight, x.data(), tokens, y.data(), pool);
      benchmark::DoNotOptimize(y.data());
    }
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes = double(layers[0]->weight.weight_bytes()) * copies;
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  state.counters["us_per_layer"] = benchmark::Counter(seconds * 1e6 / double(copies) / double(state.iterations()));
  state.counters["FLOPS"] = benchmark::Counter(2.0 * double(out) * double(in) * double(tokens) * double(copies),
                                               benchmark::Counter::kIsIterationInvariantRate);
  if (copy_gbps > 0.0 && seconds > 0.0) {
    state.counters["pct_copy_bw"] = 100.0 * bytes * double(state.iterations()) / seconds / (copy_gbps * 1e9);
  }
  state.SetLabel(anvil::cpu_kernel_isa());
}

void bench_copy_bandwidth(benchmark::State& state, int threads) {
  double gbps = 0.0;
  for (auto _ : state) gbps = anvil::measure_copy_bandwidth_gbps(pool_of(threads));
  state.counters["copy_GBps"] = gbps;
}

void bench_fma_peak(benchmark::State& state, int threads) {
  double gflops = 0.0;
  for (auto _ : state) gflops = anvil::measure_peak_fma_gflops(pool_of(threads));
  state.counters["peak_GFLOPS"] = gflops;
}

void register_benchmarks() {
  struct Shape {
    int64_t out, in;
  };
  for (int threads : bench_threads()) {
    benchmark::RegisterBenchmark(("copy_bandwidth/threads:" + std::to_string(threads)).c_str(), bench_copy_bandwidth,
                                 threads)
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int threads : bench_threads()) {
    benchmark::RegisterBenchmark(("fma_peak/threads:" + std::to_string(threads)).c_str(), bench_fma_peak, threads)
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  struct Kernel {
    WeightFormat format;
    anvil::Mxfp4Activations mode;  // MXFP4 only
    std::string name;
  };
  const Kernel kernels[] = {{WeightFormat::BF16, anvil::Mxfp4Activations::Float32, "BF16"},
                            {WeightFormat::MXFP4, anvil::Mxfp4Activations::Float32, "MXFP4-f32"},
                            {WeightFormat::MXFP4, anvil::Mxfp4Activations::Int8, "MXFP4-int8"}};
  // 8 layers of 5760x2880: 70 MB of MXFP4, 265 MB of bf16, well past an 8 MiB L3.
  constexpr int kDramCopies = 8;
  for (const Kernel& kernel : kernels) {
    for (int threads : bench_threads()) {
      const std::string name = "matvec_dram/" + kernel.name + "/5760x2880x" + std::to_string(kDramCopies) +
                               "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), bench_linear_dram, kernel.format, kernel.mode, int64_t(5760),
                                   int64_t(2880), kDramCopies, int64_t(1), threads)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // Batched decode of a Qwen3-1.7B-shaped MLP (bf16, 28 copies of gate_up and down: 2 GB, past any
  // cache), as the server runs it with several sequences: tokens per call = concurrent streams.
  for (int64_t tokens : {1, 8}) {
    for (int threads : bench_threads()) {
      for (Shape shape : {Shape{12288, 2048}, Shape{2048, 6144}}) {
        const std::string name = "decode_dram/BF16/" + std::to_string(shape.out) + "x" + std::to_string(shape.in) +
                                 "x28/tokens:" + std::to_string(tokens) + "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), bench_linear_dram, WeightFormat::BF16,
                                     anvil::Mxfp4Activations::Float32, shape.out, shape.in, 28, tokens, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (const Kernel& kernel : kernels) {
    for (Shape shape : {Shape{5760, 2880}, Shape{2880, 2880}}) {
      for (int64_t tokens : {1, 8, 64}) {
        for (int threads : bench_threads()) {
          const std::string name = std::string(tokens == 1 ? "matvec/" : "matmul/") + kernel.name + "/" +
                                   std::to_string(shape.out) + "x" + std::to_string(shape.in) +
                                   "/tokens:" + std::to_string(tokens) + "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), bench_linear, kernel.format, kernel.mode, shape.out, shape.in,
                                       tokens, threads)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
