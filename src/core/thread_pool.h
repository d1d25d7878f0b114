#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part in the
// work, so a pool of N threads starts N-1 workers. Splits are static and deterministic: the same
// thread count always gives the same partition, which keeps float32 results reproducible.
//
// Decode calls the pool a few hundred times per step, microseconds apart, so waking sleeping
// workers through the kernel on every call would cost a sizeable share of the step at 16
// threads. Workers and the caller therefore spin for a short while (kSpinMicroseconds) on an
// atomic before they sleep on a condition variable; an idle pool sleeps, and a pool with more
// threads than the machine has CPUs never spins.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anvil {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Calls body(begin, end) over disjoint ranges covering [0, n), split into at most size()
  // pieces whose boundaries are multiples of `grain` (except the last). Not reentrant.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t grain = 1);

  // Calls body(thread_index) once on every thread of the pool.
  void run_on_all(const std::function<void(int)>& body);

  // How long a worker (or the caller waiting for workers) spins before it sleeps, unless
  // ANVIL_POOL_SPIN_US says otherwise.
  static constexpr int kSpinMicroseconds = 100;

 private:
  void worker_loop(int index);

  int num_threads_;
  bool spin_;
  std::chrono::microseconds spin_window_;
  std::vector<std::thread> workers_;
  // A new task is published by storing task_, then incrementing generation_; workers that spin
  // see the increment, sleeping ones are woken through wake_ when sleeping_workers_ says so.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stopping_{false};
  const std::function<void(int)>* task_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
};

// The process-wide pool: ANVIL_THREADS or the number of online CPUs.
ThreadPool& default_thread_pool();
// Replaces the process-wide pool (CLI --threads). Must be called before first use elsewhere.
void set_default_thread_count(int num_threads);

}  // namespace anvil
