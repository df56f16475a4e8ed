#pragma once
// Helper threads that fill a step's structured-output token masks in parallel [TAG_MASK_POOL].
// A step's constrained sequences each need a next-token bitmask over the vocabulary (6-13 us per
// mask on the 2-core dev box, <= 9 us mean on the GPU host's cores: bench/results/
// grammar-2026-12-03.md, gpu-llm-2026-12-03-h200); filled one after the other that is ~0.6 ms of
// a 9 ms batch-64 decode step. The scheduler's thread hands them to run(), which spreads the
// indices over itself and the helpers and returns when every one has run.
//
// Threads: run() is called by one thread at a time (the scheduler's). fn(i) runs on the caller or
// on a helper, each index exactly once; fn must be safe to call concurrently for different i
// (masks of different sequences: each decoder is touched by one index only, the compiled grammars
// they share are thread-safe, common/grammar/matcher.h). Helpers sleep on a condition variable
// between steps.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace garden::tulip {

class MaskFillPool {
 public:
  // `helpers` threads besides the caller (0: run() calls fn on the caller only).
  explicit MaskFillPool(uint32_t helpers);
  ~MaskFillPool();
  MaskFillPool(const MaskFillPool&) = delete;
  MaskFillPool& operator=(const MaskFillPool&) = delete;

  uint32_t helpers() const { return static_cast<uint32_t>(threads_.size()); }
  // fn(i) for every i in [0, n); returns when all have run.
  void run(size_t n, const std::function<void(size_t)>& fn) EXCLUDES(mu_);

 private:
  void loop() EXCLUDES(mu_);
  // Claims and runs indices of the current round until none is left.
  void work(const std::function<void(size_t)>& fn, size_t n);

  Mutex mu_;
  CondVar cv_work_, cv_done_;
  const std::function<void(size_t)>* fn_ GUARDED_BY(mu_) = nullptr;  // null between rounds
  size_t n_ GUARDED_BY(mu_) = 0;
  uint64_t round_ GUARDED_BY(mu_) = 0;
  uint32_t inside_ GUARDED_BY(mu_) = 0;  // helpers working on the current round
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<size_t> next_{0};  // the next unclaimed index of the current round
  std::vector<std::thread> threads_;
};

}  // namespace garden::tulip
