#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace garden {

ThreadPool::ThreadPool(int threads) {
  int extra = std::max(1, threads) - 1;
  workers_.reserve(static_cast<size_t>(extra));
  for (int i = 0; i < extra; ++i) workers_.emplace_back([this, i] { workerLoop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_start_.notifyAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = std::max<int64_t>(1, n / grain);
  int64_t chunks = std::min<int64_t>(size(), max_chunks);
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n, 0);
    return;
  }
  int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  {
    MutexLock lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    pending_ = static_cast<int>(chunks - 1);
    ++generation_;
  }
  cv_start_.notifyAll();
  fn(0, std::min(n, chunk), 0);  // chunk 0 on the caller
  MutexLock lock(mu_);
  cv_done_.wait(lock, [this]() REQUIRES(mu_) { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::parallelTasks(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  // One chunk per worker (chunk index = worker index); each takes tasks until none are left.
  parallelFor(std::min<int64_t>(size(), n), 1, [&](int64_t, int64_t, int worker) {
    for (int64_t task = next.fetch_add(1); task < n; task = next.fetch_add(1)) fn(task, worker);
  });
}

void ThreadPool::workerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t begin, end;
    {
      MutexLock lock(mu_);
      cv_start_.wait(lock, [&]() REQUIRES(mu_) { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= job_chunks_) continue;  // not needed for this job
      job = job_;
      begin = job_chunk_ * index;
      end = std::min(job_n_, begin + job_chunk_);
    }
    (*job)(begin, end, index);
    {
      MutexLock lock(mu_);
      if (--pending_ == 0) cv_done_.notifyOne();
    }
  }
}

}  // namespace garden
