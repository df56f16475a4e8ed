#include "services/tulip/llm/mask_pool.h"

namespace garden::tulip {

MaskFillPool::MaskFillPool(uint32_t helpers) {
  threads_.reserve(helpers);
  for (uint32_t i = 0; i < helpers; ++i) threads_.emplace_back([this] { loop(); });
}

MaskFillPool::~MaskFillPool() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_work_.notifyAll();
  for (std::thread& t : threads_) t.join();
}

void MaskFillPool::work(const std::function<void(size_t)>& fn, size_t n) {
  for (size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    fn(i);
  }
}

void MaskFillPool::run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (threads_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    MutexLock lock(mu_);
    // Every helper of the previous round has left (inside_ was 0 when it ended): next_ is ours.
    next_.store(0, std::memory_order_relaxed);
    fn_ = &fn;
    n_ = n;
    ++round_;
  }
  cv_work_.notifyAll();
  work(fn, n);
  MutexLock lock(mu_);
  // The caller found no index left: the rest are running on helpers that joined this round. Once
  // none is inside, every index has run; a helper that wakes later finds fn_ null and skips it.
  cv_done_.wait(lock, [&]() REQUIRES(mu_) { return inside_ == 0; });
  fn_ = nullptr;
}

void MaskFillPool::loop() {
  uint64_t seen = 0;
  MutexLock lock(mu_);
  for (;;) {
    cv_work_.wait(lock,
                  [&]() REQUIRES(mu_) { return stop_ || (round_ != seen && fn_ != nullptr); });
    if (stop_) return;
    seen = round_;
    const std::function<void(size_t)>* fn = fn_;
    const size_t n = n_;
    ++inside_;
    lock.unlock();
    work(*fn, n);
    lock.lock();
    if (--inside_ == 0) cv_done_.notifyOne();
  }
}

}  // namespace garden::tulip
