#include "common/shm/llm_batch.h"

#include <atomic>
#include <climits>

#include "common/shm/channel.h"
#include "common/shm/futex.h"

namespace garden::shm {
namespace {

std::atomic<uint32_t>* readyWord(std::byte* region) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                std::atomic<uint32_t>::is_always_lock_free);
  return reinterpret_cast<std::atomic<uint32_t>*>(region);
}

}  // namespace

void initLateMasks(std::byte* region) {
  readyWord(region)->store(kLateMasksPending, std::memory_order_relaxed);
}

bool publishLateMasks(std::byte* region) {
  std::atomic<uint32_t>* w = readyWord(region);
  uint32_t expected = kLateMasksPending;
  // Release: the masks written before are visible to rose once it reads ready.
  const bool ok = w->compare_exchange_strong(expected, kLateMasksReady, std::memory_order_acq_rel);
  futexWake(w, INT_MAX);
  return ok;
}

bool awaitLateMasks(std::byte* region, std::chrono::nanoseconds timeout) {
  std::atomic<uint32_t>* w = readyWord(region);
  // A short spin first: tulip usually publishes while the forward pass still runs, so the wait
  // is normally over before it starts.
  for (int i = 0; i < 1000; ++i) {
    if (w->load(std::memory_order_acquire) != kLateMasksPending) break;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  const int64_t deadline = monotonicNowNs() + timeout.count();
  while (true) {
    const uint32_t v = w->load(std::memory_order_acquire);
    if (v != kLateMasksPending) return v == kLateMasksReady;
    const int64_t left = deadline - monotonicNowNs();
    if (left <= 0) break;
    // Wake-ups come from publishLateMasks(); the 50 ms cap only bounds a missed one.
    const int64_t nap = left < 50'000'000 ? left : 50'000'000;
    timespec ts{static_cast<time_t>(nap / 1'000'000'000), static_cast<long>(nap % 1'000'000'000)};
    futexWait(w, kLateMasksPending, &ts);
  }
  uint32_t expected = kLateMasksPending;
  if (w->compare_exchange_strong(expected, kLateMasksAbandoned, std::memory_order_acq_rel))
    return false;
  return expected == kLateMasksReady;
}

LateMaskState lateMaskState(const std::byte* region) {
  return static_cast<LateMaskState>(
      readyWord(const_cast<std::byte*>(region))->load(std::memory_order_acquire));
}

}  // namespace garden::shm
