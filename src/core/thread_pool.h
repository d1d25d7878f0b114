#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part in the
// work, so a pool of N threads starts N-1 workers. Splits are static and deterministic: the same
// thread count always gives the same partition, which keeps float32 results reproducible.
#include <atomic>
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

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
};

// The process-wide pool: ANVIL_THREADS or the number of online CPUs.
ThreadPool& default_thread_pool();
// Replaces the process-wide pool (CLI --threads). Must be called before first use elsewhere.
void set_default_thread_count(int num_threads);

}  // namespace anvil
