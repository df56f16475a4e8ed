#pragma once
// A small fork-join pool: parallelFor splits [0, n) into contiguous chunks, runs them on the
// workers and the calling thread, and returns when all are done. Used by rose's CPU backend ops
// and by tulip's step scheduler (a step's structured-output masks, [TAG_MASK_POOL]).
//
// Threads: parallelFor must be called by one thread at a time (the CPU backend's compute thread,
// tulip's scheduler thread, or a test thread when nothing is launched). The pool owns its worker threads; the destructor
// joins them.

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace garden {

class ThreadPool {
 public:
  // `threads` total workers including the caller (>= 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end, worker_index) over chunks covering [0, n); chunks hold at least `grain`
  // items (except possibly the last). worker_index is in [0, size()).
  void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn)
      EXCLUDES(mu_);

  // Calls fn(task, worker_index) once for every task in [0, n), handing tasks out one at a time
  // to whichever worker is free (for tasks of uneven cost, e.g. causal attention tiles, or when
  // the OS delays a worker). Returns when all are done.
  void parallelTasks(int64_t n, const std::function<void(int64_t, int)>& fn);

 private:
  void workerLoop(int index) EXCLUDES(mu_);

  std::vector<std::thread> workers_;
  Mutex mu_;
  CondVar cv_start_;
  CondVar cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ GUARDED_BY(mu_) = nullptr;
  int64_t job_n_ GUARDED_BY(mu_) = 0;
  int64_t job_chunk_ GUARDED_BY(mu_) = 0;
  int64_t job_chunks_ GUARDED_BY(mu_) = 0;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  int pending_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
};

}  // namespace garden
