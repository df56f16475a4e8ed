#pragma once
// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with the capability
// attributes of common/thread_annotations.h, so that clang's -Wthread-safety checks every
// GUARDED_BY / REQUIRES / EXCLUDES contract written against them. (libstdc++'s std::mutex carries
// no attributes, so state guarded by one cannot be checked.) No overhead: each is the std type
// plus inline forwarding.
//
//   mutable Mutex mu_;
//   std::deque<Job> queue_ GUARDED_BY(mu_);
//   CondVar cv_;
//
//   void push(Job j) EXCLUDES(mu_) {
//     { MutexLock lock(mu_); queue_.push_back(std::move(j)); }
//     cv_.notifyOne();
//   }
//   Job pop() EXCLUDES(mu_) {
//     MutexLock lock(mu_);
//     while (queue_.empty()) cv_.wait(lock);  // the condition is checked with mu_ held
//     ...
//   }
//
// A predicate handed to CondVar's wait functions runs with the lock's mutex held; annotate the
// lambda so its body is checked against that: `cv_.wait(lock, [&]() REQUIRES(mu_) { ... })`.
// Thread-safe as std::mutex / std::condition_variable are; MutexLock and a wait call belong to
// one thread.

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace garden {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool tryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // BasicLockable/Lockable spelling, so std::scoped_lock and friends still work.
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis that the caller holds this mutex (no run-time check: std::mutex cannot
  // answer). For a function the analysis cannot follow, e.g. a callback invoked under the lock.
  void assertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope. unlock()/lock() release and re-take it within the scope (to run a
// callback without the lock, say); the destructor releases it only if held.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(&mu) { mu_->lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() RELEASE() {
    mu_->unlock();
    held_ = false;
  }
  void lock() ACQUIRE() {
    mu_->lock();
    held_ = true;
  }

 private:
  friend class CondVar;
  Mutex* mu_;
  bool held_ = true;
};

// A condition variable waited on through a MutexLock (held on entry and on return, released
// while blocked, as std::condition_variable does). Spurious wake-ups happen: wait in a loop on
// the condition, or pass the predicate.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void notifyOne() noexcept { cv_.notify_one(); }
  void notifyAll() noexcept { cv_.notify_all(); }

  void wait(MutexLock& lock) {
    std::unique_lock<std::mutex> ul(lock.mu_->mu_, std::adopt_lock);
    cv_.wait(ul);
    ul.release();  // still held: ownership stays with `lock`
  }
  // False when `deadline` passed (the lock is held again either way).
  template <typename Clock, typename Duration>
  bool waitUntil(MutexLock& lock, const std::chrono::time_point<Clock, Duration>& deadline) {
    std::unique_lock<std::mutex> ul(lock.mu_->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(ul, deadline) == std::cv_status::no_timeout;
    ul.release();
    return woken;
  }
  template <typename Rep, typename Period>
  bool waitFor(MutexLock& lock, const std::chrono::duration<Rep, Period>& timeout) {
    return waitUntil(lock, std::chrono::steady_clock::now() + timeout);
  }

  // Until pred() holds. The analysis does not follow pred into this template (hence
  // NO_THREAD_SAFETY_ANALYSIS); pred runs with the lock held, so a lambda annotated
  // REQUIRES(mu) has its own body checked.
  template <typename Pred>
  void wait(MutexLock& lock, Pred pred) NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) wait(lock);
  }
  // pred()'s last value: false when the deadline passed with pred still false.
  template <typename Clock, typename Duration, typename Pred>
  bool waitUntil(MutexLock& lock, const std::chrono::time_point<Clock, Duration>& deadline,
                 Pred pred) NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) {
      if (!waitUntil(lock, deadline)) return pred();
    }
    return true;
  }
  template <typename Rep, typename Period, typename Pred>
  bool waitFor(MutexLock& lock, const std::chrono::duration<Rep, Period>& timeout,
               Pred pred) NO_THREAD_SAFETY_ANALYSIS {
    return waitUntil(lock, std::chrono::steady_clock::now() + timeout, std::move(pred));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace garden
