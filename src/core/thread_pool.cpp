#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

namespace anvil {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// Spins until done() or `window` ends; true if done() became true.
template <typename Done>
bool spin_until(std::chrono::microseconds window, const Done& done) {
  const auto deadline = std::chrono::steady_clock::now() + window;
  for (int i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(std::max(1, num_threads)),
      // More threads than CPUs: a spinning thread would take the CPU a working one needs.
      spin_(num_threads_ <= int(std::max(1u, std::thread::hardware_concurrency()))),
      spin_window_(ThreadPool::kSpinMicroseconds) {
  // ANVIL_POOL_SPIN_US overrides the window (0: always sleep at once), for A/B measurements.
  if (const char* env = std::getenv("ANVIL_POOL_SPIN_US"); env != nullptr && *env != '\0') {
    const long value = std::strtol(env, nullptr, 10);
    spin_window_ = std::chrono::microseconds(std::max(0L, value));
    if (value <= 0) spin_ = false;
  }
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Sequentially consistent loads: the sleep handshakes below rely on a single order.
    auto published = [&] { return stopping_.load() || generation_.load() != seen; };
    if (!(spin_ && spin_until(spin_window_, published))) {
      std::unique_lock<std::mutex> lock(mutex_);
      // Sequentially consistent with run_on_all's increment-then-check: either the caller sees
      // this worker counted as sleeping and notifies, or this check sees the new generation.
      sleeping_workers_.fetch_add(1);
      wake_.wait(lock, published);
      sleeping_workers_.fetch_sub(1);
    }
    if (stopping_.load()) return;
    seen = generation_.load();
    (*task_)(index);
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::run_on_all(const std::function<void(int)>& body) {
  if (num_threads_ == 1) {
    body(0);
    return;
  }
  task_ = &body;
  pending_.store(num_threads_ - 1);
  generation_.fetch_add(1);  // releases task_ and pending_ to the workers
  if (sleeping_workers_.load() > 0) {
    // Taking the mutex orders this notify after any sleeper's predicate check.
    { std::lock_guard<std::mutex> lock(mutex_); }
    wake_.notify_all();
  }
  body(0);
  auto finished = [&] { return pending_.load() == 0; };
  if (!(spin_ && spin_until(spin_window_, finished))) {
    std::unique_lock<std::mutex> lock(mutex_);
    caller_sleeping_.store(true);
    done_.wait(lock, finished);
    caller_sleeping_.store(false);
  }
  task_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t pieces = std::min<int64_t>(units, num_threads_);
  if (pieces <= 1) {
    body(0, n);
    return;
  }
  run_on_all([&](int index) {
    if (index >= pieces) return;
    const int64_t begin = std::min(n, (units * index / pieces) * grain);
    const int64_t end = std::min(n, (units * (index + 1) / pieces) * grain);
    if (begin < end) body(begin, end);
  });
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}

int default_thread_count() {
  if (const char* env = std::getenv("ANVIL_THREADS")) {
    const int value = std::atoi(env);
    if (value > 0) return value;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

ThreadPool& default_thread_pool() {
  auto& pool = pool_slot();
  if (!pool) pool = std::make_unique<ThreadPool>(default_thread_count());
  return *pool;
}

void set_default_thread_count(int num_threads) {
  pool_slot() = std::make_unique<ThreadPool>(num_threads > 0 ? num_threads : default_thread_count());
}

}  // namespace anvil
