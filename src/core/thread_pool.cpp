#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace anvil {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    (*task)(index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::run_on_all(const std::function<void(int)>& body) {
  if (num_threads_ == 1) {
    body(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &body;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  body(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
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
