#pragma once
// Happens-before across gRPC, told to ThreadSanitizer [TAG_TSAN_HANDOFF].
//
// Debian's gRPC and abseil are not built with -fsanitize=thread, and gRPC hands work between its
// threads through absl::Mutex (futexes) and lock-free queues that TSan cannot see. So when our
// code prepares state on one thread, hands it to gRPC (a stub call, StartCall/StartRead/
// StartWrite/Finish) and gRPC then runs our callback on another thread, TSan sees two unordered
// accesses and reports a race that the gRPC API contract rules out. These two calls state that
// contract at the boundary, on our side:
//
//   tsanRelease(key)  on the thread that hands the work to gRPC, just before the gRPC call;
//   tsanAcquire(key)  first thing in the callback gRPC runs for that work, with the same key
//                     (the object both sides share: the reactor, the call's state).
//
// Everything the releasing thread did before the release then happens-before what the callback
// does after the acquire, exactly what gRPC guarantees (a callback for an operation runs after
// the operation was started). Use them only at such API-ordered points; never to silence a
// report between two threads of ours (use a mutex or an atomic there). Without TSan both are
// empty inline functions. Thread-safe; the key is only an address (nothing is read or written).

#if defined(__SANITIZE_THREAD__)
#define GARDEN_TSAN_ACTIVE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GARDEN_TSAN_ACTIVE 1
#endif
#endif

#ifdef GARDEN_TSAN_ACTIVE
#include <sanitizer/tsan_interface.h>
#endif

namespace garden {

// True in a -fsanitize=thread build. Stress tests use it to scale their iteration counts down
// (TSan runs each access 5-15x slower, more on a loaded machine); the interleavings they exercise
// stay the same.
#ifdef GARDEN_TSAN_ACTIVE
inline constexpr bool kTsanBuild = true;
#else
inline constexpr bool kTsanBuild = false;
#endif

inline void tsanRelease(const void* key) {
#ifdef GARDEN_TSAN_ACTIVE
  __tsan_release(const_cast<void*>(key));
#else
  (void)key;
#endif
}

inline void tsanAcquire(const void* key) {
#ifdef GARDEN_TSAN_ACTIVE
  __tsan_acquire(const_cast<void*>(key));
#else
  (void)key;
#endif
}

}  // namespace garden
