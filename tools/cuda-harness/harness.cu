// Standalone check of linear_dense.cu (bf16 weights) and moe_quantized.cu on a GPU machine without the project's
// host dependencies: CPU references (double), poisoned outputs, timings. Not part of the build.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/ops.h"
#include "harness_common.h"
// The dense kernels are included (not linked) so tune mode can launch their variants.
#include "../../src/backend/cuda/linear_dense.cu"

namespace anvil::cuda {
void throw_cuda_error(const char* call, int status, const char* file, int line) {
  std::fprintf(stderr, "CUDA error: %s: %s (%s:%d)\n", call, cudaGetErrorString(cudaError_t(status)), file, line);
  throw std::runtime_error(call);
}
// As the kernel table gives for the H200 (9.0): chained launches on.
bool chained_launch_enabled() { return true; }
}  // namespace anvil::cuda

using namespace anvil;


static int g_fail = 0;
static bool g_profile = false;  // run each case once, no reference (under ncu)
static void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_fail;
    std::printf("FAIL: %s\n", what.c_str());
  }
}


static void parallel_for(int64_t n, const std::function<void(int64_t)>& f) {
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) f(i);
    });
  for (auto& th : pool) th.join();
}

template <typename T>
static T* dev(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, h.size() * sizeof(T) + 256));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

static double median_ms(const std::function<void()>& f, int runs) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// ---------------- linear ----------------
static void linear_case(int64_t m, int64_t out, int64_t in, bool bias_on, int runs, uint64_t seed, int max_rows = 24) {
  Rng rng(seed);
  std::vector<uint16_t> w(static_cast<size_t>(out * in)), x(static_cast<size_t>(m * in));
  const float ws = 1.0f / std::sqrt(float(in));
  for (auto& v : w) v = tobf(rng.uniform() * ws);
  for (auto& v : x) v = tobf(rng.uniform());
  std::vector<float> bias(static_cast<size_t>(out));
  for (auto& v : bias) v = rng.uniform();
  uint16_t *dw = dev(w), *dx = dev(x);
  float* db = dev(bias);
  float* dy;
  CK(cudaMalloc(&dy, size_t(m * out) * 4));
  CK(cudaMemset(dy, 0xff, size_t(m * out) * 4));
  cuda::linear_bf16(dw, bias_on ? db : nullptr, dx, m, out, in, dy, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<float> y(static_cast<size_t>(m * out));
  CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (float v : y) bad += std::isfinite(v) ? 0 : 1;
  std::set<int64_t> rows;
  if (m <= max_rows) {
    for (int64_t r = 0; r < m; ++r) rows.insert(r);
  } else {
    for (int64_t r : {int64_t(0), int64_t(1), m - 1, m - 2, int64_t(63), int64_t(64), int64_t(127), int64_t(128)})
      if (r < m) rows.insert(r);
    while (int64_t(rows.size()) < max_rows) rows.insert(int64_t(rng.next() % uint64_t(m)));
  }
  std::vector<int64_t> rv(rows.begin(), rows.end());
  std::vector<double> err(rv.size() * size_t(out)), ref(rv.size() * size_t(out));
  parallel_for(int64_t(rv.size()) * out, [&](int64_t i) {
    const int64_t r = rv[size_t(i / out)], o = i % out;
    double s = 0;
    for (int64_t k = 0; k < in; ++k) s += double(bf(x[size_t(r * in + k)])) * double(bf(w[size_t(o * in + k)]));
    if (bias_on) s += bias[size_t(o)];
    ref[size_t(i)] = s;
    err[size_t(i)] = double(y[size_t(r * out + o)]) - s;
  });
  double e2 = 0, n2 = 0;
  for (size_t i = 0; i < err.size(); ++i) {
    e2 += err[i] * err[i];
    n2 += ref[i] * ref[i];
  }
  const double rel = std::sqrt(e2 / n2);
  char name[160];
  std::snprintf(name, sizeof name, "linear m=%lld out=%lld in=%lld bias=%d", (long long)m, (long long)out,
                (long long)in, int(bias_on));
  check(bad == 0, std::string(name) + " non-finite=" + std::to_string(bad));
  check(rel < 2e-3, std::string(name) + " rel=" + std::to_string(rel));
  if (runs > 0) {
    const double ms = median_ms([&] { cuda::linear_bf16(dw, bias_on ? db : nullptr, dx, m, out, in, dy, nullptr); }, runs);
    const double bytes = double(out * in * 2 + m * in * 2 + m * out * 4), flops = 2.0 * m * out * in;
    std::printf("PERF %-48s rel=%.2e %9.1f us %7.0f GB/s %6.1f TFLOP/s\n", name, rel, ms * 1e3, bytes / ms * 1e-6,
                flops / ms * 1e-9);
  } else {
    std::printf("ok?  %-48s rel=%.2e\n", name, rel);
  }
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(db);
  cudaFree(dy);
}

// ---------------- MoE ----------------
struct Moe {
  int64_t E, H, I;
  int k;
  std::vector<uint8_t> gb, gs, db_, ds;
  std::vector<float> gbias, dbias;
  uint8_t *d_gb, *d_gs, *d_db, *d_ds;
  float *d_gbias, *d_dbias;
  Moe(int64_t E_, int64_t H_, int64_t I_, int k_, Rng& rng, bool big = false) : E(E_), H(H_), I(I_), k(k_) {
    auto fill = [&](std::vector<uint8_t>& b, std::vector<uint8_t>& s, std::vector<float>& bias, int64_t rows,
                    int64_t cols) {
      b.resize(size_t(E * rows * cols / 2));
      for (size_t i = 0; i < b.size(); i += 8) {
        const uint64_t r = rng.next();
        for (size_t j = 0; j < 8 && i + j < b.size(); ++j) b[i + j] = uint8_t(r >> (8 * j));
      }
      const int base = 127 - int(std::ceil(std::log2(std::sqrt(double(cols)) * 2.6)));
      s.resize(size_t(E * rows * cols / 32));
      for (auto& v : s) {
        v = uint8_t(base - 2 + int(rng.next() % 5));
        if (big && rng.next() % 64 == 0) v = uint8_t(129 + rng.next() % 4);
      }
      bias.resize(size_t(E * rows));
      for (auto& v : bias) v = 0.5f * rng.uniform();
    };
    fill(gb, gs, gbias, 2 * I, H);
    fill(db_, ds, dbias, H, I);
    d_gb = dev(gb);
    d_gs = dev(gs);
    d_db = dev(db_);
    d_ds = dev(ds);
    d_gbias = dev(gbias);
    d_dbias = dev(dbias);
    // Copies of the scale tables one byte past a 16-byte boundary (the unaligned path).
    CK(cudaMalloc(&d_gs1, gs.size() + 16));
    CK(cudaMalloc(&d_ds1, ds.size() + 16));
    CK(cudaMemcpy(d_gs1 + 1, gs.data(), gs.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ds1 + 1, ds.data(), ds.size(), cudaMemcpyHostToDevice));
  }
  uint8_t *d_gs1 = nullptr, *d_ds1 = nullptr;
  bool shifted = false;
  ~Moe() {
    cudaFree(d_gb);
    cudaFree(d_gs);
    cudaFree(d_db);
    cudaFree(d_ds);
    cudaFree(d_gbias);
    cudaFree(d_dbias);
    cudaFree(d_gs1);
    cudaFree(d_ds1);
  }
  cuda::QuantizedExperts weights() const {
    cuda::QuantizedExperts w;
    w.gate_up_blocks = d_gb;
    w.gate_up_scales = shifted ? d_gs1 + 1 : d_gs;
    w.gate_up_bias = d_gbias;
    w.down_blocks = d_db;
    w.down_scales = shifted ? d_ds1 + 1 : d_ds;
    w.down_bias = d_dbias;
    w.num_experts = E;
    w.hidden = H;
    w.intermediate = I;
    return w;
  }
  // y = W_e row o · x + bias, double.
  static double dot_row(const uint8_t* blocks, const uint8_t* scales, int64_t cols, const double* x) {
    double s = 0;
    for (int64_t g = 0; g < cols / 32; ++g) {
      const double sc = std::ldexp(1.0, int(scales[g]) - 127);
      for (int j = 0; j < 16; ++j) {
        const uint8_t b = blocks[g * 16 + j];
        s += x[g * 32 + 2 * j] * double(kFp4[b & 15]) * sc + x[g * 32 + 2 * j + 1] * double(kFp4[b >> 4]) * sc;
      }
    }
    return s;
  }
  std::vector<double> reference(const std::vector<double>& h, const int32_t* ids, const float* w) const {
    std::vector<double> out(static_cast<size_t>(H), 0.0);
    for (int j = 0; j < k; ++j) {
      const int64_t e = ids[j];
      std::vector<double> gu(static_cast<size_t>(2 * I)), act(static_cast<size_t>(I));
      for (int64_t o = 0; o < 2 * I; ++o)
        gu[size_t(o)] = dot_row(gb.data() + ((e * 2 * I + o) * (H / 32)) * 16, gs.data() + (e * 2 * I + o) * (H / 32),
                                H, h.data()) +
                        gbias[size_t(e * 2 * I + o)];
      for (int64_t i = 0; i < I; ++i) {
        // float32 as the CPU model does
        float gate = float(gu[size_t(2 * i)]), up = float(gu[size_t(2 * i + 1)]);
        gate = std::min(gate, 7.0f);
        up = std::clamp(up, -7.0f, 7.0f);
        act[size_t(i)] = gate / (1.0f + std::exp(-1.702f * gate)) * (up + 1.0f);
      }
      for (int64_t o = 0; o < H; ++o) {
        const double y = dot_row(db_.data() + ((e * H + o) * (I / 32)) * 16, ds.data() + (e * H + o) * (I / 32), I,
                                 act.data()) +
                         dbias[size_t(e * H + o)];
        out[size_t(o)] += double(w[j]) * y;
      }
    }
    return out;
  }
  size_t expert_bytes() const { return size_t((3 * H * I) / 2 + (3 * H * I) / 32 + (2 * I + H) * 4); }
};

static void topk_cpu(const float* x, int64_t n, int k, int32_t* ids, float* w) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = int32_t(i);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  float mx = x[order[0]], sum = 0;
  for (int j = 0; j < k; ++j) sum += (w[j] = std::exp(x[order[size_t(j)]] - mx));
  for (int j = 0; j < k; ++j) {
    ids[j] = order[size_t(j)];
    w[j] /= sum;
  }
}

static void route(int64_t m, int64_t E, int k, Rng& rng, std::vector<int32_t>& ids, std::vector<float>& w, bool ties) {
  std::vector<float> logits(static_cast<size_t>(m * E));
  for (auto& v : logits) v = ties ? float(rng.next() % 3) : 4.0f * rng.uniform();
  float* dl = dev(logits);
  int32_t* di;
  float* dw;
  CK(cudaMalloc(&di, size_t(m * k) * 4));
  CK(cudaMalloc(&dw, size_t(m * k) * 4));
  CK(cudaMemset(di, 0xff, size_t(m * k) * 4));
  cuda::moe_topk_softmax(dl, m, E, k, di, dw, nullptr);
  CK(cudaDeviceSynchronize());
  ids.resize(size_t(m * k));
  w.resize(size_t(m * k));
  CK(cudaMemcpy(ids.data(), di, ids.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(w.data(), dw, w.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int64_t r = 0; r < m; ++r) {
    std::vector<int32_t> ci(static_cast<size_t>(k));
    std::vector<float> cw(static_cast<size_t>(k));
    topk_cpu(logits.data() + r * E, E, k, ci.data(), cw.data());
    for (int j = 0; j < k; ++j)
      if (ci[size_t(j)] != ids[size_t(r * k + j)] || std::fabs(cw[size_t(j)] - w[size_t(r * k + j)]) > 1e-6f) ++bad;
  }
  check(bad == 0, "topk E=" + std::to_string(E) + " k=" + std::to_string(k) + " ties=" + std::to_string(ties) +
                      " mismatches=" + std::to_string(bad));
  cudaFree(dl);
  cudaFree(di);
  cudaFree(dw);
}

static void moe_case(const Moe& ex, int64_t m, const std::vector<int32_t>& ids, const std::vector<float>& rw, Rng& rng,
                     int runs, int max_rows, const char* label) {
  std::vector<uint16_t> h(static_cast<size_t>(m * ex.H));
  for (auto& v : h) v = tobf(rng.uniform());
  std::vector<float> res(static_cast<size_t>(m * ex.H));
  for (auto& v : res) v = rng.uniform();
  uint16_t* dh = dev(h);
  int32_t* di = dev(ids);
  float *dw = dev(rw), *dr = dev(res);
  const size_t wsb = cuda::moe_quantized_workspace_bytes(m, ex.k, ex.E, ex.H, ex.I);
  void* ws;
  CK(cudaMalloc(&ws, wsb));
  CK(cudaMemset(ws, 0xff, wsb));
  const auto w = ex.weights();
  cuda::moe_quantized(w, dh, m, ex.k, di, dw, dr, ws, wsb, nullptr);
  CK(cudaDeviceSynchronize());
  if (g_profile) {
    cudaFree(dh);
    cudaFree(di);
    cudaFree(dw);
    cudaFree(dr);
    cudaFree(ws);
    return;
  }
  std::vector<float> out(res.size());
  CK(cudaMemcpy(out.data(), dr, out.size() * 4, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (float v : out) bad += std::isfinite(v) ? 0 : 1;
  std::set<int64_t> rows;
  if (m <= max_rows) {
    for (int64_t r = 0; r < m; ++r) rows.insert(r);
  } else {
    rows = {0, m - 1};
    while (int64_t(rows.size()) < max_rows) rows.insert(int64_t(rng.next() % uint64_t(m)));
  }
  std::vector<int64_t> rv(rows.begin(), rows.end());
  std::vector<std::vector<double>> refs(rv.size());
  parallel_for(int64_t(rv.size()), [&](int64_t i) {
    const int64_t r = rv[size_t(i)];
    std::vector<double> x(static_cast<size_t>(ex.H));
    for (int64_t j = 0; j < ex.H; ++j) x[size_t(j)] = bf(h[size_t(r * ex.H + j)]);
    refs[size_t(i)] = ex.reference(x, ids.data() + r * ex.k, rw.data() + r * ex.k);
  });
  double e2 = 0, n2 = 0;
  for (size_t i = 0; i < rv.size(); ++i)
    for (int64_t j = 0; j < ex.H; ++j) {
      const double got = double(out[size_t(rv[i] * ex.H + j)]) - double(res[size_t(rv[i] * ex.H + j)]);
      const double want = refs[i][size_t(j)];
      e2 += (got - want) * (got - want);
      n2 += want * want;
    }
  const double rel = std::sqrt(e2 / n2);
  char name[200];
  std::snprintf(name, sizeof name, "moe %s E=%lld H=%lld I=%lld k=%d m=%lld", label, (long long)ex.E, (long long)ex.H,
                (long long)ex.I, ex.k, (long long)m);
  check(bad == 0, std::string(name) + " non-finite=" + std::to_string(bad));
  check(rel < 1e-2, std::string(name) + " rel=" + std::to_string(rel));
  // Determinism: same inputs twice give identical bits.
  {
    CK(cudaMemcpy(dr, res.data(), res.size() * 4, cudaMemcpyHostToDevice));
    cuda::moe_quantized(w, dh, m, ex.k, di, dw, dr, ws, wsb, nullptr);
    std::vector<float> again(res.size());
    CK(cudaMemcpy(again.data(), dr, again.size() * 4, cudaMemcpyDeviceToHost));
    check(std::memcmp(again.data(), out.data(), out.size() * 4) == 0, std::string(name) + " not deterministic");
  }
  if (runs > 0) {
    const double ms = median_ms([&] { cuda::moe_quantized(w, dh, m, ex.k, di, dw, dr, ws, wsb, nullptr); }, runs);
    const std::set<int32_t> active(ids.begin(), ids.end());
    const double bytes = double(active.size()) * double(ex.expert_bytes());
    const double flops = 2.0 * double(m * ex.k) * 3.0 * double(ex.H) * double(ex.I);
    std::printf("PERF %-56s rel=%.2e %9.1f us %3zu experts %6.0f GB/s %6.1f TFLOP/s\n", name, rel, ms * 1e3,
                active.size(), bytes / ms * 1e-6, flops / ms * 1e-9);
  } else {
    std::printf("ok?  %-56s rel=%.2e\n", name, rel);
  }
  cudaFree(dh);
  cudaFree(di);
  cudaFree(dw);
  cudaFree(dr);
  cudaFree(ws);
}

static void moe_random(const Moe& ex, int64_t m, Rng& rng, int runs, int max_rows, const char* label) {
  std::vector<int32_t> ids;
  std::vector<float> w;
  route(m, ex.E, ex.k, rng, ids, w, false);
  moe_case(ex, m, ids, w, rng, runs, max_rows, label);
}


// ---------------- GEMM variants ----------------
using GemmLaunch = void (*)(const uint16_t*, const float*, const uint16_t*, int, int, int, float*, bool, cudaStream_t);
// A bf16 launch of one tile configuration of linear_dense.cu's GEMM.
template <int kBM, int kBN, int kWarpsM, int kWarpsN, int kStages, int kMinBlocks>
void gemm_bf16(const uint16_t* w, const float* bias, const uint16_t* x, int m, int out, int in, float* y,
               bool accumulate, cudaStream_t stream) {
  cuda::launch_gemm<kBM, kBN, kWarpsM, kWarpsN, kStages, kMinBlocks>(cuda::Weights{w, nullptr, false}, bias, x, m,
                                                                      out, in, y, accumulate, stream);
}
static void tune_gemm() {
  struct V {
    const char* name;
    GemmLaunch f;
  };
  const V variants[] = {
      {"128x128 w2x4 s4 b1", gemm_bf16<128, 128, 2, 4, 4, 1>},
      {"128x128 w2x4 s4 b2", gemm_bf16<128, 128, 2, 4, 4, 2>},
      {"128x128 w2x4 s3 b2", gemm_bf16<128, 128, 2, 4, 3, 2>},
      {"128x256 w2x4 s3 b1", gemm_bf16<128, 256, 2, 4, 3, 1>},
      {"128x256 w2x4 s4 b1", gemm_bf16<128, 256, 2, 4, 4, 1>},
      {"256x128 w4x2 s4 b1", gemm_bf16<256, 128, 4, 2, 4, 1>},
      {"128x64 w2x2 s4 b2", gemm_bf16<128, 64, 2, 2, 4, 2>},
      {"64x64 w2x2 s4 b1", gemm_bf16<64, 64, 2, 2, 4, 1>},
  };
  const int64_t shapes[][3] = {{2048, 5120, 2880}, {2048, 2880, 4096}, {2048, 4096, 4096}, {2048, 2880, 2880},
                               {2048, 512, 2880},  {512, 201088, 2880}, {64, 2880, 2880},  {256, 2880, 4096},
                               {4096, 4096, 4096}};
  Rng rng(99);
  for (auto& sh : shapes) {
    const int64_t m = sh[0], out = sh[1], in = sh[2];
    std::vector<uint16_t> w(size_t(out * in)), x(size_t(m * in));
    for (auto& v : w) v = tobf(rng.uniform() * 0.02f);
    for (auto& v : x) v = tobf(rng.uniform());
    uint16_t *dw = dev(w), *dx = dev(x);
    float *y0, *y1;
    CK(cudaMalloc(&y0, size_t(m * out) * 4));
    CK(cudaMalloc(&y1, size_t(m * out) * 4));
    variants[0].f(dw, nullptr, dx, int(m), int(out), int(in), y0, false, nullptr);
    std::vector<float> ref(size_t(m * out)), got(ref.size());
    CK(cudaMemcpy(ref.data(), y0, ref.size() * 4, cudaMemcpyDeviceToHost));
    for (const V& v : variants) {
      CK(cudaMemset(y1, 0xff, size_t(m * out) * 4));
      v.f(dw, nullptr, dx, int(m), int(out), int(in), y1, false, nullptr);
      CK(cudaMemcpy(got.data(), y1, got.size() * 4, cudaMemcpyDeviceToHost));
      const bool same = std::memcmp(got.data(), ref.data(), got.size() * 4) == 0;
      check(same, std::string("gemm variant differs: ") + v.name);
      const double ms = median_ms([&] { v.f(dw, nullptr, dx, int(m), int(out), int(in), y1, false, nullptr); }, 10);
      std::printf("TUNE gemm m=%5lld out=%6lld in=%5lld %-20s %8.1f us %6.1f TFLOP/s%s\n", (long long)m,
                  (long long)out, (long long)in, v.name, ms * 1e3, 2.0 * m * out * in / ms * 1e-9, same ? "" : " DIFF");
    }
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(y0);
    cudaFree(y1);
  }
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (only != "small") {
    const size_t bytes = size_t(2) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    const double ms = median_ms([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
    std::printf("PERF copy 2 GiB: %.0f GB/s (read + write)\n", 2.0 * bytes / ms * 1e-6);
    cudaFree(a);
    cudaFree(b);
  }
  Rng rng(1234);
  if (only == "tune") {
    tune_gemm();
    std::printf("%s: %d failures\n", g_fail ? "FAILED" : "PASSED", g_fail);
    return g_fail ? 1 : 0;
  }
  if (only == "profile") {
    g_profile = true;
    linear_case(1, 2880, 4096, true, 0, 1);
    linear_case(8, 2880, 4096, true, 0, 2);
    linear_case(2048, 5120, 2880, true, 0, 3);
    Moe ex(32, 2880, 2880, 4, rng);
    for (int64_t m : {1, 8, 64, 2048}) moe_random(ex, m, rng, 0, 1, "20b");
    return 0;
  }
  if (only == "gemv") {  // batch-1 GEMV speed at gpt-oss shapes, with a correctness pass each
    uint64_t seed = 1;
    for (int rep = 0; rep < 2; ++rep) {
      linear_case(1, 2880, 4096, true, 50, seed++);
      linear_case(1, 5120, 2880, true, 50, seed++);
      linear_case(1, 201088, 2880, false, 20, seed++, 1);
      linear_case(4, 5120, 2880, true, 50, seed++);
    }
    std::printf("%s: %d failures\n", g_fail ? "FAILED" : "PASSED", g_fail);
    return g_fail ? 1 : 0;
  }
  if (only == "all" || only == "linear") {
    uint64_t seed = 1;
    for (int64_t m : {1, 3, 8, 9, 16, 17, 32, 33, 64, 300, 2048})
      for (auto [o, i] : {std::pair<int64_t, int64_t>{2880, 4096}, {512, 2880}, {4096, 2880}})
        linear_case(m, o, i, m % 2 == 1, 0, seed++);
    for (int64_t m : {1, 5, 16, 31, 70, 333})
      for (auto [o, i] : {std::pair<int64_t, int64_t>{2888, 2888}, {24, 40}, {8, 8}, {130, 136}})
        linear_case(m, o, i, true, 0, seed++);
    for (int64_t m : {1, 7, 40}) linear_case(m, 100, 100, true, 0, seed++);
    linear_case(1, 2880, 4096, true, 50, seed++);
    linear_case(8, 2880, 4096, true, 50, seed++);
    linear_case(1, 5120, 2880, true, 50, seed++);
    linear_case(1, 201088, 2880, false, 20, seed++, 1);
    linear_case(1, 151936, 4096, false, 20, seed++, 1);
    linear_case(2048, 5120, 2880, true, 20, seed++, 12);
    linear_case(2048, 2880, 4096, true, 20, seed++, 12);
    linear_case(2048, 4096, 4096, false, 20, seed++, 12);
    linear_case(4096, 4096, 4096, false, 10, seed++, 8);
    linear_case(512, 201088, 2880, false, 5, seed++, 2);
  }
  if (only == "moeprefill") {  // prefill GEMM variants: correctness and speed
    {
      Moe ex(8, 256, 384, 2, rng);
      for (int64_t m : {300, 2048}) moe_random(ex, m, rng, 0, 24, "small");
      Moe big(8, 256, 256, 2, rng, true);
      moe_random(big, 600, rng, 0, 24, "big-scales");
    }
    {
      Moe ex(32, 2880, 2880, 4, rng);
      for (int64_t m : {512, 2048, 4096}) moe_random(ex, m, rng, 10, 4, "20b");
    }
    {
      Moe ex(128, 2880, 2880, 4, rng);
      moe_random(ex, 2048, rng, 10, 4, "120b");
    }
    std::printf("%s: %d failures\n", g_fail ? "FAILED" : "PASSED", g_fail);
    return g_fail ? 1 : 0;
  }
  if (only == "moedec") {  // decode-path speed (few tokens per expert)
    {
      Moe ex(8, 256, 384, 2, rng);
      ex.shifted = true;
      for (int64_t m : {1, 9, 300}) moe_random(ex, m, rng, 0, 24, "shifted-scales");
    }
    {
      Moe ex(32, 2880, 2880, 4, rng);
      for (int64_t m : {1, 2, 4, 8, 16, 32, 64, 128}) moe_random(ex, m, rng, 50, 4, "20b");
    }
    {
      Moe ex(128, 2880, 2880, 4, rng);
      for (int64_t m : {1, 8, 64, 256}) moe_random(ex, m, rng, 30, 4, "120b");
    }
    std::printf("%s: %d failures\n", g_fail ? "FAILED" : "PASSED", g_fail);
    return g_fail ? 1 : 0;
  }
  if (only == "small") {  // for compute-sanitizer: every kernel variant on small shapes
    uint64_t seed = 500;
    for (int64_t m : {1, 9, 17, 40, 130})
      for (auto [o, i] : {std::pair<int64_t, int64_t>{136, 264}, {24, 40}, {1000, 96}}) linear_case(m, o, i, true, 0, seed++);
    linear_case(2048, 2304, 264, true, 0, seed++);  // enough tiles for the 128x128 GEMM
    linear_case(3, 100, 100, true, 0, seed++);
    Moe a(8, 256, 384, 2, rng);
    for (int64_t m : {1, 9, 17, 64, 300}) moe_random(a, m, rng, 0, 8, "small");
    Moe b(4, 288, 96, 2, rng, true);
    for (int64_t m : {1, 40}) moe_random(b, m, rng, 0, 8, "decode-only");
    a.shifted = true;
    for (int64_t m : {1, 17}) moe_random(a, m, rng, 0, 8, "shifted-scales");
    std::printf("%s: %d failures\n", g_fail ? "FAILED" : "PASSED", g_fail);
    return g_fail ? 1 : 0;
  }
  if (only == "all" || only == "moe") {
    for (int64_t E : {4, 32, 128, 256}) {
      std::vector<int32_t> ids;
      std::vector<float> w;
      route(97, E, 4, rng, ids, w, true);
      route(97, E, 1, rng, ids, w, true);
    }
    {
      Moe ex(8, 256, 384, 2, rng);
      for (int64_t m : {1, 3, 8, 17, 33, 64, 300, 2048}) moe_random(ex, m, rng, 0, 24, "small");
    }
    {
      Moe ex(4, 288, 96, 2, rng);
      for (int64_t m : {1, 5, 40, 300}) moe_random(ex, m, rng, 0, 24, "decode-only");
    }
    {
      Moe ex(16, 256, 256, 4, rng);
      for (int64_t m : {1, 9, 40, 300, 1000}) {
        std::vector<int32_t> ids;
        std::vector<float> w;
        for (int64_t r = 0; r < m; ++r) {
          std::vector<int32_t> picks = {5};
          while (picks.size() < 4) {
            const int32_t e = int32_t(rng.next() % 16);
            if (std::find(picks.begin(), picks.end(), e) == picks.end()) picks.push_back(e);
          }
          float sum = 0, ww[4];
          for (auto& v : ww) sum += (v = 0.1f + std::fabs(rng.uniform()));
          for (int j = 0; j < 4; ++j) {
            ids.push_back(picks[size_t(j)]);
            w.push_back(ww[j] / sum);
          }
        }
        moe_case(ex, m, ids, w, rng, 0, 24, "one-expert-all");
      }
    }
    {
      Moe ex(8, 256, 256, 2, rng, true);
      for (int64_t m : {2, 600}) moe_random(ex, m, rng, 0, 24, "big-scales");
    }
    {
      Moe ex(32, 2880, 2880, 4, rng);
      for (int64_t m : {1, 8, 16, 32, 64, 128, 512, 2048}) moe_random(ex, m, rng, m >= 512 ? 10 : 50, m >= 64 ? 6 : 8, "20b");
    }
    {
      Moe ex(128, 2880, 2880, 4, rng);
      for (int64_t m : {1, 64, 2048}) moe_random(ex, m, rng, m >= 512 ? 10 : 30, 4, "120b");
    }
  }
  std::printf("%s: %d failures\n", g_fail ? "FAILED" : "PASSED", g_fail);
  return g_fail ? 1 : 0;
}
